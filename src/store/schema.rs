//! Table definitions, matching `migrations/postgres` and `migrations/sqlite`.
//! Both backends share them: instants are `timestamptz` on PostgreSQL and
//! fixed-width RFC 3339 UTC text on SQLite, which sorts like time.

use diesel::deserialize::{self, FromSql};
use diesel::pg::{Pg, PgValue};
use diesel::serialize::{self, IsNull, Output, ToSql};
use diesel::sql_types::{SqlType, Text, Timestamptz};
use diesel::sqlite::Sqlite;

use crate::domain::{format_timestamp, Timestamp};

/// An instant in UTC with microsecond precision. On PostgreSQL it is
/// `timestamptz`, named by its fixed type oids (`pg_type`: 1184, its array
/// 1185) so that no connection has to look the type up by name before the
/// first statement that binds one.
#[derive(Debug, Clone, Copy, Default, SqlType, diesel::query_builder::QueryId)]
#[diesel(postgres_type(oid = 1184, array_oid = 1185))]
#[diesel(sqlite_type(name = "Text"))]
pub struct Instant;

impl FromSql<Instant, Pg> for Timestamp {
    fn from_sql(value: PgValue<'_>) -> deserialize::Result<Self> {
        <Timestamp as FromSql<Timestamptz, Pg>>::from_sql(value)
    }
}

impl ToSql<Instant, Pg> for Timestamp {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Pg>) -> serialize::Result {
        <Timestamp as ToSql<Timestamptz, Pg>>::to_sql(self, out)
    }
}

impl FromSql<Instant, Sqlite> for Timestamp {
    fn from_sql(
        value: <Sqlite as diesel::backend::Backend>::RawValue<'_>,
    ) -> deserialize::Result<Self> {
        let text = <String as FromSql<Text, Sqlite>>::from_sql(value)?;
        Ok(chrono::DateTime::parse_from_rfc3339(&text)
            .map_err(|e| format!("stored instant {text:?} is not RFC 3339: {e}"))?
            .with_timezone(&chrono::Utc))
    }
}

impl ToSql<Instant, Sqlite> for Timestamp {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Sqlite>) -> serialize::Result {
        out.set_value(format_timestamp(self));
        Ok(IsNull::No)
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use super::Instant;

    assets (id) {
        id -> Text,
        name -> Text,
        status -> Text,
        hold_expires_at -> Nullable<Instant>,
        current_reservation_id -> Nullable<Text>,
        version -> Int8,
        last_event_sequence -> Int8,
        created_at -> Instant,
        updated_at -> Instant,
        available_from -> Nullable<Instant>,
        price_amount -> Nullable<Int8>,
        price_currency -> Nullable<Text>,
        attributes -> Text,
        waitlist_length -> Int4,
        waitlist_seq -> Int8,
        available_since -> Nullable<Instant>,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use super::Instant;

    reservations (id) {
        id -> Text,
        asset_id -> Text,
        buyer_id -> Text,
        status -> Text,
        expires_at -> Instant,
        created_at -> Instant,
        committed_at -> Nullable<Instant>,
        released_at -> Nullable<Instant>,
        payment_reference -> Nullable<Text>,
        client -> Text,
        voided_at -> Nullable<Instant>,
        payment_client -> Nullable<Text>,
        price_amount -> Nullable<Int8>,
        price_currency -> Nullable<Text>,
        metadata -> Nullable<Text>,
        via -> Nullable<Text>,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use super::Instant;

    refunds (id) {
        id -> Text,
        reservation_id -> Text,
        asset_id -> Text,
        payment_reference -> Text,
        reason -> Text,
        status -> Text,
        created_at -> Instant,
        completed_at -> Nullable<Instant>,
        payment_client -> Text,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use super::Instant;

    events (id) {
        id -> Text,
        asset_id -> Text,
        sequence -> Int8,
        #[sql_name = "type"]
        event_type -> Text,
        data -> Text,
        created_at -> Instant,
        attempts -> Int4,
        next_attempt_at -> Nullable<Instant>,
        delivered_at -> Nullable<Instant>,
        dead_at -> Nullable<Instant>,
        last_error -> Nullable<Text>,
        client -> Nullable<Text>,
        actor -> Nullable<Text>,
        via -> Nullable<Text>,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use super::Instant;

    idempotency_keys (client, key) {
        client -> Text,
        key -> Text,
        fingerprint -> Text,
        status_code -> Int4,
        body -> Text,
        location -> Nullable<Text>,
        reservation_id -> Nullable<Text>,
        created_at -> Instant,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use super::Instant;

    payments (client, reference) {
        client -> Text,
        reference -> Text,
        reservation_id -> Text,
        refund_id -> Nullable<Text>,
        created_at -> Instant,
    }
}

diesel::joinable!(reservations -> assets (asset_id));
diesel::joinable!(refunds -> reservations (reservation_id));
diesel::joinable!(events -> assets (asset_id));

diesel::allow_tables_to_appear_in_same_query!(
    assets,
    reservations,
    refunds,
    events,
    idempotency_keys,
    payments
);

/// An instant bound into a query built with diesel's DSL.
#[derive(Debug, Clone, Copy, diesel::expression::AsExpression)]
#[diesel(sql_type = Instant)]
pub struct At(pub Timestamp);

impl ToSql<Instant, Pg> for At {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Pg>) -> serialize::Result {
        <Timestamp as ToSql<Instant, Pg>>::to_sql(&self.0, out)
    }
}

impl ToSql<Instant, Sqlite> for At {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Sqlite>) -> serialize::Result {
        <Timestamp as ToSql<Instant, Sqlite>>::to_sql(&self.0, out)
    }
}
