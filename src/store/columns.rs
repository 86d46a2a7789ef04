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
    use diesel::deserialize::{self, QueryableByName};
    use diesel::row::NamedRow;
    use diesel::sql_types::{BigInt, Nullable, Text};
    use diesel::sqlite::Sqlite;
    use diesel::{sql_query, Connection, RunQueryDsl, SqliteConnection};

    use super::InOrder;

    /// A row of three columns, read in order.
    struct Lot {
        name: String,
        price: i64,
        note: Option<String>,
    }

    impl QueryableByName<Sqlite> for Lot {
        fn build<'a>(row: &impl NamedRow<'a, Sqlite>) -> deserialize::Result<Self> {
            let mut c = InOrder::new(row);
            let lot = Lot {
                name: c.next::<Text, _>("name")?,
                price: c.next::<BigInt, _>("price")?,
                note: c.next::<Nullable<Text>, _>("note")?,
            };
            c.end()?;
            Ok(lot)
        }
    }

    /// The row SQLite answers for `columns`, in that order; the error as text.
    fn read(columns: &[&str]) -> Result<Lot, String> {
        let mut conn = SqliteConnection::establish(":memory:").map_err(|e| e.to_string())?;
        let values: Vec<String> = columns
            .iter()
            .map(|&name| match name {
                "name" => "'AB 1234 CD' AS name".to_owned(),
                "price" => "7 AS price".to_owned(),
                _ => format!("NULL AS {name}"),
            })
            .collect();
        let rows: Vec<Lot> = sql_query(format!("SELECT {}", values.join(", ")))
            .load(&mut conn)
            .map_err(|e| e.to_string())?;
        rows.into_iter().next().ok_or_else(|| "no row".to_owned())
    }

    #[test]
    fn columns_are_read_in_order_and_each_name_is_checked() {
        let lot = read(&["name", "price", "note"]).expect("the statement's own order");
        assert_eq!(
            (lot.name.as_str(), lot.price, lot.note),
            ("AB 1234 CD", 7, None)
        );

        let swapped = read(&["price", "name", "note"]).err();
        let swapped = swapped.expect("two columns swapped must not decode");
        assert!(
            swapped.contains("column 0") && swapped.contains("`name`"),
            "{swapped}"
        );
        let missing = read(&["name", "price"]).err().expect("a column missing");
        assert!(missing.contains("`note`"), "{missing}");
        let more = read(&["name", "price", "note", "extra"]).err();
        assert!(more.expect("a column more").contains("4 columns"));
    }
}
