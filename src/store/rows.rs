//! Row types shared by both backends, and their conversion to the domain.

use diesel::backend::Backend;
use diesel::deserialize::{self, FromSql};
use diesel::prelude::*;
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::row::NamedRow;
use diesel::serialize::ToSql;
use diesel::sql_types::{BigInt, HasSqlType, Integer, Nullable, Text};
use diesel::QueryableByName;

use super::api::{Delivery, FeedCursor, Rendered};
use super::columns::InOrder;
use super::error::{StoreError, StoreResult};
use super::schema::{assets, events, payments, refunds, reservations, Instant};
use crate::domain::{
    Asset, AssetStatus, Event, EventId, EventType, PaymentFate, Price, Refund, RefundReason,
    RefundStatus, Reservation, ReservationStatus, Timestamp, Via,
};

/// A consistent read: the database clock, the row, and the answer stored
/// under the request's key, all from one snapshot.
#[derive(Debug)]
pub(crate) struct Snapshot<T> {
    pub now: Timestamp,
    pub row: Option<T>,
    pub stored: Option<StoredAnswer>,
    /// The fate of the payment a commit carries, when it has one.
    pub fate: Option<PaymentFate>,
}

/// An answer found under an Idempotency-Key, and the request it answered.
#[derive(Debug, Clone)]
pub(crate) struct StoredAnswer {
    pub fingerprint: String,
    pub answer: Rendered,
}

/// What a hold's first read reads for one request: asset id, key's client,
/// key.
pub(crate) type SnapshotInput = (String, String, String);

/// What the first read of a request about a reservation reads for: the
/// reservation, the key's client and key, and the payment (its client and
/// reference) whose fate a commit reads with it.
#[derive(Debug)]
pub(crate) struct ReservationInput {
    pub(crate) id: String,
    pub(crate) key_client: String,
    pub(crate) key: String,
    pub(crate) payment: Option<(String, String)>,
}

/// A hold's first read of one request: the clock, the asset and the answer
/// stored under the key. Read as one row when the request is read alone;
/// put together from a batch's [`HoldBatchRow`]s otherwise. Rows are read
/// in their statement's column order ([`InOrder`]): every losing request of
/// a flash sale needs one.
#[derive(Clone)]
pub(crate) struct HoldSnapshotRow {
    pub(crate) key: KeySnapshotRow,
    pub(crate) asset: SnapshotAsset,
    /// When the statement that read it was sent (the monotonic clock): the
    /// read's clock `now` was taken after it. Decoding sets the moment of
    /// decoding; the reader, which alone knows, replaces it.
    pub(crate) sent: std::time::Instant,
}

/// What a hold's first read reads of the asset and its holder; all `None`
/// when there is no such asset.
#[derive(Clone, Default)]
pub(crate) struct SnapshotAsset {
    pub(crate) status: Option<String>,
    pub(crate) hold_expires_at: Option<Timestamp>,
    pub(crate) available_from: Option<Timestamp>,
    pub(crate) available_since: Option<Timestamp>,
    pub(crate) current_reservation_id: Option<String>,
    pub(crate) price_amount: Option<i64>,
    pub(crate) price_currency: Option<String>,
    pub(crate) waitlist_length: Option<i32>,
    pub(crate) holder_client: Option<String>,
    pub(crate) holder_buyer: Option<String>,
}

/// One row of the batch statement of holds' first reads
/// (`HOLD_SNAPSHOT_SQL`): an asset named by the batch (`ord` NULL; `id` NULL
/// too when it names none that exists), or the answer stored under the
/// `ord`-th key (asset columns NULL).
pub(crate) struct HoldBatchRow {
    pub(crate) now: Timestamp,
    pub(crate) ord: Option<i64>,
    pub(crate) id: Option<String>,
    pub(crate) asset: SnapshotAsset,
    pub(crate) stored: MaybeStoredRow,
}

/// The columns a hold's first read reads after its clock (and, in a batch,
/// its row's number and asset id): the asset and its holder, then the
/// answer stored under the key.
fn asset_and_stored<'a: 'r, 'r, R, DB>(
    c: &mut InOrder<'a, 'r, R, DB>,
) -> deserialize::Result<(SnapshotAsset, MaybeStoredRow)>
where
    R: diesel::row::Row<'a, DB>,
    DB: Backend,
    Option<Timestamp>: FromSql<Nullable<Instant>, DB>,
    Option<String>: FromSql<Nullable<Text>, DB>,
    Option<i64>: FromSql<Nullable<BigInt>, DB>,
    Option<i32>: FromSql<Nullable<Integer>, DB>,
{
    let asset = SnapshotAsset {
        status: c.next::<Nullable<Text>, _>("status")?,
        hold_expires_at: c.next::<Nullable<Instant>, _>("hold_expires_at")?,
        available_from: c.next::<Nullable<Instant>, _>("available_from")?,
        available_since: c.next::<Nullable<Instant>, _>("available_since")?,
        current_reservation_id: c.next::<Nullable<Text>, _>("current_reservation_id")?,
        price_amount: c.next::<Nullable<BigInt>, _>("price_amount")?,
        price_currency: c.next::<Nullable<Text>, _>("price_currency")?,
        waitlist_length: c.next::<Nullable<Integer>, _>("waitlist_length")?,
        holder_client: c.next::<Nullable<Text>, _>("holder_client")?,
        holder_buyer: c.next::<Nullable<Text>, _>("holder_buyer")?,
    };
    let stored = MaybeStoredRow {
        fingerprint: c.next::<Nullable<Text>, _>("fingerprint")?,
        status_code: c.next::<Nullable<Integer>, _>("status_code")?,
        body: c.next::<Nullable<Text>, _>("body")?,
        location: c.next::<Nullable<Text>, _>("location")?,
    };
    Ok((asset, stored))
}

impl<DB> QueryableByName<DB> for HoldSnapshotRow
where
    DB: Backend,
    Timestamp: FromSql<Instant, DB>,
    Option<Timestamp>: FromSql<Nullable<Instant>, DB>,
    Option<String>: FromSql<Nullable<Text>, DB>,
    Option<i64>: FromSql<Nullable<BigInt>, DB>,
    Option<i32>: FromSql<Nullable<Integer>, DB>,
{
    fn build<'a>(row: &impl NamedRow<'a, DB>) -> deserialize::Result<Self> {
        let mut c = InOrder::new(row);
        let now = c.next::<Instant, _>("now")?;
        let (asset, stored) = asset_and_stored(&mut c)?;
        c.end()?;
        Ok(Self {
            key: KeySnapshotRow { now, stored },
            asset,
            sent: std::time::Instant::now(),
        })
    }
}

impl QueryableByName<diesel::pg::Pg> for HoldBatchRow {
    fn build<'a>(row: &impl NamedRow<'a, diesel::pg::Pg>) -> deserialize::Result<Self> {
        let mut c = InOrder::new(row);
        let now = c.next::<Instant, _>("now")?;
        let ord = c.next::<Nullable<BigInt>, _>("ord")?;
        let id = c.next::<Nullable<Text>, _>("id")?;
        let (asset, stored) = asset_and_stored(&mut c)?;
        c.end()?;
        Ok(Self {
            now,
            ord,
            id,
            asset,
            stored,
        })
    }
}

/// The reservations of a page with their refunds, by effective status at `now`.
pub(crate) fn with_refunds(
    rows: Vec<ReservationRow>,
    refund_rows: Vec<RefundRow>,
    now: Timestamp,
) -> StoreResult<Vec<Reservation>> {
    let mut refunds = refund_rows
        .into_iter()
        .map(RefundRow::into_refund)
        .collect::<StoreResult<Vec<_>>>()?;
    rows.into_iter()
        .map(|row| {
            let mut reservation = row.into_reservation()?;
            let (mine, rest) = refunds
                .drain(..)
                .partition(|r: &Refund| r.reservation_id == reservation.reservation_id);
            refunds = rest;
            reservation.refunds = mine;
            Ok(reservation.effective(now))
        })
        .collect()
}

/// A price stored as its two columns.
pub(crate) fn price_of(amount: Option<i64>, currency: Option<String>) -> Option<Price> {
    Some(Price {
        amount: amount?,
        currency: currency?,
    })
}

/// A JSON column, as what it holds.
pub(crate) fn from_json<T: serde::de::DeserializeOwned>(text: &str, what: &str) -> StoreResult<T> {
    serde_json::from_str(text)
        .map_err(|e| StoreError::Corrupt(format!("stored {what} {text:?}: {e}")))
}

pub(crate) fn parse_via(text: &str) -> StoreResult<Via> {
    Via::parse(text).ok_or_else(|| StoreError::Corrupt(format!("unknown via {text:?}")))
}

pub(crate) fn parse_status<T>(parse: fn(&str) -> Option<T>, text: &str) -> StoreResult<T> {
    parse(text).ok_or_else(|| StoreError::Corrupt(format!("unknown status {text:?}")))
}

#[derive(QueryableByName, Selectable, Queryable)]
#[diesel(table_name = assets, check_for_backend(diesel::pg::Pg, diesel::sqlite::Sqlite))]
pub(crate) struct AssetRow {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) status: String,
    pub(crate) hold_expires_at: Option<Timestamp>,
    pub(crate) current_reservation_id: Option<String>,
    pub(crate) version: i64,
    pub(crate) created_at: Timestamp,
    pub(crate) updated_at: Timestamp,
    pub(crate) available_from: Option<Timestamp>,
    pub(crate) price_amount: Option<i64>,
    pub(crate) price_currency: Option<String>,
    pub(crate) attributes: String,
    pub(crate) waitlist_length: i32,
}

impl AssetRow {
    /// The asset as stored, its status not yet made effective.
    pub(crate) fn into_stored_asset(self) -> StoreResult<Asset> {
        Ok(Asset {
            price: price_of(self.price_amount, self.price_currency),
            attributes: from_json(&self.attributes, "attributes")?,
            waitlist_length: i64::from(self.waitlist_length),
            id: self.id,
            name: self.name,
            status: parse_status(AssetStatus::parse, &self.status)?,
            hold_expires_at: self.hold_expires_at,
            current_reservation_id: self.current_reservation_id,
            available_from: self.available_from,
            version: self.version,
            created_at: self.created_at,
            updated_at: self.updated_at,
            holder: None,
        })
    }

    /// The asset by its effective status at `now`.
    pub(crate) fn into_asset(self, now: Timestamp) -> StoreResult<Asset> {
        Ok(self.into_stored_asset()?.effective(now))
    }

    /// The asset at `now`, with the client whose reservation holds it.
    pub(crate) fn into_held_asset(
        self,
        now: Timestamp,
        holder: Option<String>,
    ) -> StoreResult<Asset> {
        let mut asset = self.into_asset(now)?;
        asset.holder = holder;
        Ok(asset)
    }
}

#[derive(QueryableByName, Selectable, Queryable, Clone)]
#[diesel(table_name = reservations, check_for_backend(diesel::pg::Pg, diesel::sqlite::Sqlite))]
pub(crate) struct ReservationRow {
    pub(crate) id: String,
    pub(crate) asset_id: String,
    pub(crate) buyer_id: String,
    pub(crate) status: String,
    pub(crate) expires_at: Timestamp,
    pub(crate) created_at: Timestamp,
    pub(crate) committed_at: Option<Timestamp>,
    pub(crate) released_at: Option<Timestamp>,
    pub(crate) payment_reference: Option<String>,
    pub(crate) client: String,
    pub(crate) voided_at: Option<Timestamp>,
    pub(crate) payment_client: Option<String>,
    pub(crate) price_amount: Option<i64>,
    pub(crate) price_currency: Option<String>,
    pub(crate) metadata: Option<String>,
    pub(crate) via: Option<String>,
}

impl ReservationRow {
    /// The reservation as stored (status not yet made effective), no refunds.
    pub(crate) fn into_reservation(self) -> StoreResult<Reservation> {
        Ok(Reservation {
            reservation_id: self.id,
            asset_id: self.asset_id,
            buyer_id: self.buyer_id,
            status: parse_status(ReservationStatus::parse, &self.status)?,
            expires_at: self.expires_at,
            created_at: self.created_at,
            committed_at: self.committed_at,
            released_at: self.released_at,
            payment_reference: self.payment_reference,
            voided_at: self.voided_at,
            refunds: Vec::new(),
            price: price_of(self.price_amount, self.price_currency),
            metadata: self
                .metadata
                .as_deref()
                .map(|m| from_json(m, "metadata"))
                .transpose()?,
            via: self.via.as_deref().map(parse_via).transpose()?,
            client: self.client,
            payment_client: self.payment_client,
        })
    }
}

/// A reservation as a single-statement change left it, and the event
/// number the change took.
#[derive(QueryableByName)]
pub(crate) struct TransitionRow {
    #[diesel(embed)]
    pub(crate) reservation: ReservationRow,
    #[diesel(sql_type = BigInt)]
    pub(crate) event_sequence: i64,
    /// How many buyers wait for its asset.
    #[diesel(sql_type = Integer)]
    pub(crate) waiters: i32,
}

/// The columns of a LEFT JOINed reservation, all nullable.
#[derive(QueryableByName)]
pub(crate) struct MaybeReservationRow {
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) id: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) asset_id: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) buyer_id: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) status: Option<String>,
    #[diesel(sql_type = Nullable<Instant>)]
    pub(crate) expires_at: Option<Timestamp>,
    #[diesel(sql_type = Nullable<Instant>)]
    pub(crate) created_at: Option<Timestamp>,
    #[diesel(sql_type = Nullable<Instant>)]
    pub(crate) committed_at: Option<Timestamp>,
    #[diesel(sql_type = Nullable<Instant>)]
    pub(crate) released_at: Option<Timestamp>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) payment_reference: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) client: Option<String>,
    #[diesel(sql_type = Nullable<Instant>)]
    pub(crate) voided_at: Option<Timestamp>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) payment_client: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) price_amount: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) price_currency: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) metadata: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) via: Option<String>,
}

impl MaybeReservationRow {
    pub(crate) fn into_reservation(self) -> StoreResult<Option<Reservation>> {
        let (
            Some(id),
            Some(asset_id),
            Some(buyer_id),
            Some(status),
            Some(expires_at),
            Some(created_at),
        ) = (
            self.id,
            self.asset_id,
            self.buyer_id,
            self.status,
            self.expires_at,
            self.created_at,
        )
        else {
            return Ok(None);
        };
        ReservationRow {
            id,
            asset_id,
            buyer_id,
            status,
            expires_at,
            created_at,
            committed_at: self.committed_at,
            released_at: self.released_at,
            payment_reference: self.payment_reference,
            client: self.client.unwrap_or_default(),
            voided_at: self.voided_at,
            payment_client: self.payment_client,
            price_amount: self.price_amount,
            price_currency: self.price_currency,
            metadata: self.metadata,
            via: self.via,
        }
        .into_reservation()
        .map(Some)
    }
}

/// The columns of a LEFT JOINed idempotency record, all nullable.
#[derive(QueryableByName, Clone, Default)]
pub(crate) struct MaybeStoredRow {
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) fingerprint: Option<String>,
    #[diesel(sql_type = Nullable<Integer>)]
    pub(crate) status_code: Option<i32>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) body: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) location: Option<String>,
}

impl MaybeStoredRow {
    pub(crate) fn into_answer(self) -> Option<StoredAnswer> {
        Some(StoredAnswer {
            fingerprint: self.fingerprint?,
            answer: Rendered {
                status: u16::try_from(self.status_code?).ok()?,
                body: self.body?,
                location: self.location,
            },
        })
    }
}

/// One row of a reservation's first read: the reservation, the answer
/// stored under the key and the payment's fate, with one of the
/// reservation's refunds (one row per refund, oldest first; one row with
/// none when it has none).
#[derive(QueryableByName)]
pub(crate) struct ReservationSnapshotRow {
    #[diesel(sql_type = Instant)]
    pub(crate) now: Timestamp,
    #[diesel(embed)]
    pub(crate) reservation: MaybeReservationRow,
    #[diesel(embed)]
    pub(crate) stored: MaybeStoredRow,
    #[diesel(embed)]
    pub(crate) fate: MaybeFateRow,
    #[diesel(embed)]
    pub(crate) refund: MaybeRefundRow,
}

impl ReservationSnapshotRow {
    /// The snapshot the rows of one first read make: the reservation with
    /// every refund it had at that read, by its effective status then.
    pub(crate) fn into_snapshot(rows: Vec<Self>) -> StoreResult<Snapshot<Reservation>> {
        let mut rows = rows.into_iter();
        let first = rows
            .next()
            .ok_or_else(|| StoreError::Corrupt("a reservation's read answered no row".into()))?;
        let mut refunds = Vec::new();
        for refund in std::iter::once(first.refund).chain(rows.map(|r| r.refund)) {
            refunds.extend(refund.into_refund()?);
        }
        let row = first.reservation.into_reservation()?.map(|mut r| {
            r.refunds = refunds;
            r.effective(first.now)
        });
        Ok(Snapshot {
            now: first.now,
            row,
            stored: first.stored.into_answer(),
            fate: first.fate.into_fate(),
        })
    }
}

/// A row of the batched first read of requests about reservations: a row
/// of the `ord`-th request's snapshot.
#[derive(QueryableByName)]
pub(crate) struct ReservationBatchRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) ord: i64,
    #[diesel(embed)]
    pub(crate) row: ReservationSnapshotRow,
}

/// The columns of a LEFT JOINed refund, all nullable.
#[derive(QueryableByName)]
pub(crate) struct MaybeRefundRow {
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) refund_id: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) refund_reservation_id: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) refund_asset_id: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) refund_payment_reference: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) refund_reason: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) refund_status: Option<String>,
    #[diesel(sql_type = Nullable<Instant>)]
    pub(crate) refund_created_at: Option<Timestamp>,
    #[diesel(sql_type = Nullable<Instant>)]
    pub(crate) refund_completed_at: Option<Timestamp>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) refund_payment_client: Option<String>,
}

impl MaybeRefundRow {
    pub(crate) fn into_refund(self) -> StoreResult<Option<Refund>> {
        let (
            Some(id),
            Some(reservation_id),
            Some(asset_id),
            Some(payment_reference),
            Some(reason),
            Some(status),
            Some(created_at),
            Some(payment_client),
        ) = (
            self.refund_id,
            self.refund_reservation_id,
            self.refund_asset_id,
            self.refund_payment_reference,
            self.refund_reason,
            self.refund_status,
            self.refund_created_at,
            self.refund_payment_client,
        )
        else {
            return Ok(None);
        };
        RefundRow {
            id,
            reservation_id,
            asset_id,
            payment_reference,
            reason,
            status,
            created_at,
            completed_at: self.refund_completed_at,
            payment_client,
        }
        .into_refund()
        .map(Some)
    }
}

/// The columns of a LEFT JOINed payment fate, all nullable.
#[derive(QueryableByName)]
pub(crate) struct MaybeFateRow {
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) fate_reservation_id: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) fate_refund_id: Option<String>,
}

impl MaybeFateRow {
    pub(crate) fn into_fate(self) -> Option<PaymentFate> {
        Some(PaymentFate {
            reservation_id: self.fate_reservation_id?,
            refund_id: self.fate_refund_id,
        })
    }
}

/// One payment reference's fate for one payments client.
#[derive(Selectable, Queryable, QueryableByName)]
#[diesel(table_name = payments, check_for_backend(diesel::pg::Pg, diesel::sqlite::Sqlite))]
pub(crate) struct PaymentRow {
    pub(crate) client: String,
    pub(crate) reference: String,
    pub(crate) reservation_id: String,
    pub(crate) refund_id: Option<String>,
}

#[derive(Selectable, Queryable, QueryableByName)]
#[diesel(table_name = refunds, check_for_backend(diesel::pg::Pg, diesel::sqlite::Sqlite))]
pub(crate) struct RefundRow {
    pub(crate) id: String,
    pub(crate) reservation_id: String,
    pub(crate) asset_id: String,
    pub(crate) payment_reference: String,
    pub(crate) reason: String,
    pub(crate) status: String,
    pub(crate) created_at: Timestamp,
    pub(crate) completed_at: Option<Timestamp>,
    pub(crate) payment_client: String,
}

impl RefundRow {
    pub(crate) fn into_refund(self) -> StoreResult<Refund> {
        Ok(Refund {
            refund_id: self.id,
            reservation_id: self.reservation_id,
            asset_id: self.asset_id,
            payment_reference: self.payment_reference,
            reason: parse_status(RefundReason::parse, &self.reason)?,
            status: parse_status(RefundStatus::parse, &self.status)?,
            created_at: self.created_at,
            completed_at: self.completed_at,
            payment_client: self.payment_client,
        })
    }
}

#[derive(Selectable, Queryable, QueryableByName)]
#[diesel(table_name = events, check_for_backend(diesel::pg::Pg, diesel::sqlite::Sqlite))]
pub(crate) struct EventRow {
    pub(crate) id: String,
    pub(crate) asset_id: String,
    pub(crate) sequence: i64,
    pub(crate) event_type: String,
    pub(crate) data: String,
    pub(crate) created_at: Timestamp,
    pub(crate) client: Option<String>,
    pub(crate) actor: Option<String>,
    pub(crate) via: Option<String>,
}

impl EventRow {
    pub(crate) fn into_event(self) -> StoreResult<Event> {
        let data = serde_json::value::RawValue::from_string(self.data)
            .map_err(|e| StoreError::Corrupt(format!("event {} has invalid data: {e}", self.id)))?;
        let event_type = parse_status(EventType::parse, &self.event_type)?;
        Ok(Event {
            event_type,
            data_kind: event_type.data_kind(),
            id: self.id,
            asset_id: self.asset_id,
            sequence: self.sequence,
            created_at: self.created_at,
            data,
            actor: self.actor,
            via: self.via.as_deref().map(parse_via).transpose()?,
            client: self.client,
        })
    }
}

#[derive(Debug, Clone)]
pub(crate) struct NewEvent {
    pub(crate) id: String,
    pub(crate) asset_id: String,
    /// Numbered when written, from the asset's last event.
    pub(crate) sequence: i64,
    pub(crate) event_type: EventType,
    pub(crate) data: String,
    pub(crate) created_at: Timestamp,
    /// The reservation the event reports, whose client the event records.
    pub(crate) reservation_id: Option<String>,
    pub(crate) actor: Option<String>,
    pub(crate) via: Option<Via>,
    /// The client it is about, when it reports no reservation.
    pub(crate) client: Option<String>,
}

impl NewEvent {
    pub(crate) fn new(
        asset_id: &str,
        event_type: EventType,
        data: String,
        created_at: Timestamp,
    ) -> Self {
        Self {
            id: EventId::at(created_at).to_string(),
            asset_id: asset_id.to_owned(),
            sequence: 0,
            event_type,
            data,
            created_at,
            reservation_id: None,
            actor: None,
            via: None,
            client: None,
        }
    }

    /// The event reports this reservation.
    pub(crate) fn about(mut self, reservation_id: &str) -> Self {
        self.reservation_id = Some(reservation_id.to_owned());
        self
    }

    /// This API key caused it.
    pub(crate) fn by(mut self, actor: &str) -> Self {
        self.actor = Some(actor.to_owned());
        self
    }

    /// How the hold it reports was made.
    pub(crate) fn via(mut self, via: Option<Via>) -> Self {
        self.via = via;
        self
    }

    /// The insert statement `sql` with the event bound as its first ten
    /// parameters: id, asset, sequence, type, data, creation, the reservation
    /// it reports (whose client it records), the actor, how the hold it
    /// reports was made, and the client it names.
    pub(crate) fn bound<DB>(&self, sql: &str) -> BoxedSqlQuery<'_, DB, SqlQuery>
    where
        DB: Backend + HasSqlType<Text> + HasSqlType<BigInt> + HasSqlType<Instant>,
        str: ToSql<Text, DB>,
        i64: ToSql<BigInt, DB>,
        Timestamp: ToSql<Instant, DB>,
    {
        diesel::sql_query(sql)
            .into_boxed()
            .bind::<Text, _>(self.id.as_str())
            .bind::<Text, _>(self.asset_id.as_str())
            .bind::<BigInt, _>(self.sequence)
            .bind::<Text, _>(self.event_type.as_str())
            .bind::<Text, _>(self.data.as_str())
            .bind::<Instant, _>(self.created_at)
            .bind::<Nullable<Text>, _>(self.reservation_id.as_deref())
            .bind::<Nullable<Text>, _>(self.actor.as_deref())
            .bind::<Nullable<Text>, _>(self.via.map(Via::as_str))
            .bind::<Nullable<Text>, _>(self.client.as_deref())
    }
}

/// The columns of an [`EventRow`] in raw SQL (`type` is a keyword in Rust).
pub(crate) const EVENT_COLUMNS: &str =
    "id, asset_id, sequence, type AS event_type, data, created_at, client, actor, via";

/// An event claimed for delivery, with the attempt it is on.
#[derive(QueryableByName)]
pub(crate) struct ClaimedRow {
    #[diesel(embed)]
    pub(crate) event: EventRow,
    #[diesel(sql_type = Integer)]
    pub(crate) attempts: i32,
}

impl ClaimedRow {
    pub(crate) fn into_delivery(self) -> StoreResult<Delivery> {
        Ok(Delivery {
            event: self.event.into_event()?,
            attempt: self.attempts,
        })
    }
}

/// An event with its place in the global feed.
#[derive(QueryableByName)]
pub(crate) struct FeedRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) tx: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) position: i64,
    #[diesel(embed)]
    pub(crate) event: EventRow,
}

impl FeedRow {
    /// The event and its place in the feed.
    pub(crate) fn into_entry(self) -> StoreResult<(FeedCursor, Event)> {
        let cursor = FeedCursor {
            tx: self.tx,
            position: self.position,
        };
        Ok((cursor, self.event.into_event()?))
    }
}

/// The clock and the answer stored under a key.
#[derive(QueryableByName, Clone)]
pub(crate) struct KeySnapshotRow {
    #[diesel(sql_type = Instant)]
    pub(crate) now: Timestamp,
    #[diesel(embed)]
    pub(crate) stored: MaybeStoredRow,
}

impl KeySnapshotRow {
    /// The snapshot of `row` read with this clock and stored answer.
    pub(crate) fn with_row<T>(self, row: Option<T>) -> Snapshot<T> {
        Snapshot {
            now: self.now,
            row,
            stored: self.stored.into_answer(),
            fate: None,
        }
    }
}

#[derive(QueryableByName)]
pub(crate) struct Count {
    #[diesel(sql_type = BigInt)]
    pub(crate) n: i64,
}

/// How many assets have one effective status.
#[derive(QueryableByName)]
pub(crate) struct StatusCountRow {
    #[diesel(sql_type = Text)]
    pub(crate) status: String,
    #[diesel(sql_type = BigInt)]
    pub(crate) n: i64,
}
