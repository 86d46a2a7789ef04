//! Rows read column by column in their statement's order.

use std::marker::PhantomData;

use diesel::backend::Backend;
use diesel::deserialize::{self, FromSql};
use diesel::row::{Field, Row};

/// The fields of a row read one after the other in the statement's order,
/// each checked against the name the statement gives it, so that a
/// statement and its row type that drift apart fail loudly. Reading by name
/// (`#[derive(QueryableByName)]`) searches the row's columns for each field:
/// for a row of fourteen columns that was a tenth of a flash-sale
/// rejection's CPU.
pub(crate) struct InOrder<'a, 'r, R, DB> {
    row: &'r R,
    at: usize,
    of: PhantomData<(&'a (), DB)>,
}

impl<'a: 'r, 'r, R: Row<'a, DB>, DB: Backend> InOrder<'a, 'r, R, DB> {
    pub(crate) fn new(row: &'r R) -> Self {
        Self {
            row,
            at: 0,
            of: PhantomData,
        }
    }

    /// The next column, which the statement must name `name`.
    pub(crate) fn next<ST, T: FromSql<ST, DB>>(&mut self, name: &str) -> deserialize::Result<T> {
        let at = self.at;
        self.at += 1;
        let field = Row::get(self.row, at)
            .ok_or_else(|| format!("the row has no column {at}, where `{name}` was read"))?;
        match field.field_name() {
            Some(named) if named == name => T::from_nullable_sql(field.value()),
            named => Err(format!("column {at} is {named:?}, where `{name}` was read").into()),
        }
    }

    /// Every column was read.
    pub(crate) fn end(&self) -> deserialize::Result<()> {
        match self.row.field_count() {
            n if n == self.at => Ok(()),
            n => Err(format!("the row has {n} columns, of which {} were read", self.at).into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use diesel::{sql_query, Connection, RunQueryDsl, SqliteConnection};

    use crate::store::rows::HoldSnapshotRow;

    const COLUMNS: [&str; 14] = [
        "now",
        "status",
        "hold_expires_at",
        "available_from",
        "current_reservation_id",
        "price_amount",
        "price_currency",
        "waitlist_length",
        "holder_client",
        "holder_buyer",
        "fingerprint",
        "status_code",
        "body",
        "location",
    ];

    /// A hold snapshot's row read from SQLite with `columns`, in that order.
    fn read(columns: &[&str]) -> diesel::QueryResult<Vec<HoldSnapshotRow>> {
        let mut conn = SqliteConnection::establish(":memory:").expect("an SQLite database");
        let values: Vec<String> = columns
            .iter()
            .map(|&name| match name {
                "now" => format!("'2026-12-06T12:00:00.000000Z' AS {name}"),
                "status" => format!("'HELD' AS {name}"),
                "price_amount" | "waitlist_length" => format!("7 AS {name}"),
                _ => format!("NULL AS {name}"),
            })
            .collect();
        sql_query(format!("SELECT {}", values.join(", "))).load(&mut conn)
    }

    #[test]
    fn a_hold_snapshot_is_read_in_its_statements_order_and_checked_by_name() {
        let rows = read(&COLUMNS).expect("the statement's own order");
        assert_eq!(rows[0].status.as_deref(), Some("HELD"));
        assert_eq!(
            (rows[0].price_amount, rows[0].waitlist_length),
            (Some(7), Some(7))
        );

        let mut swapped = COLUMNS;
        swapped.swap(5, 7);
        let error = read(&swapped).err().map(|e| e.to_string());
        let error = error.expect("two columns swapped must not decode");
        assert!(error.contains("`price_amount`"), "{error}");

        let error = read(&COLUMNS[..13]).err().map(|e| e.to_string());
        assert!(error.expect("a column missing").contains("`location`"));
        let mut more = COLUMNS.to_vec();
        more.push("extra");
        let error = read(&more).err().map(|e| e.to_string());
        assert!(error.expect("a column more").contains("15 columns"));
    }
}
