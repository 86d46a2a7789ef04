//! Row types shared by both backends, and their conversion to the domain.

use diesel::backend::Backend;
use diesel::prelude::*;
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::serialize::ToSql;
use diesel::sql_types::{BigInt, HasSqlType, Integer, Nullable, Text};
use diesel::QueryableByName;

use super::flow::Snapshot;
use super::schema::{assets, events, payments, refunds, reservations, Instant};
use super::{Delivery, FeedCursor, StoreError, StoreResult, StoredAnswer};
use crate::domain::{
    Asset, AssetStatus, Event, EventId, EventType, HoldTarget, PaymentFate, Refund, RefundReason,
    RefundStatus, Reservation, ReservationId, ReservationStatus, Timestamp,
};

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

pub(crate) fn parse_status<T>(parse: fn(&str) -> Option<T>, text: &str) -> StoreResult<T> {
    parse(text).ok_or_else(|| StoreError::Corrupt(format!("unknown status {text:?}")))
}

pub(crate) fn parse_reservation_id(text: &str) -> StoreResult<ReservationId> {
    ReservationId::parse(text)
        .ok_or_else(|| StoreError::Corrupt(format!("bad reservation id {text:?}")))
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
}

impl AssetRow {
    /// The asset as stored, its status not yet made effective.
    pub(crate) fn into_stored_asset(self) -> StoreResult<Asset> {
        Ok(Asset {
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

#[derive(QueryableByName)]
pub(crate) struct NowAssetRow {
    #[diesel(sql_type = Instant)]
    pub(crate) now: Timestamp,
    #[diesel(embed)]
    pub(crate) asset: AssetRow,
}

/// An asset's snapshot: the asset as stored (if it exists) at `now`.
pub(crate) fn asset_snapshot(
    now: Timestamp,
    row: Option<NowAssetRow>,
) -> StoreResult<Snapshot<Asset>> {
    let row = row.map(|r| r.asset.into_stored_asset()).transpose()?;
    Ok(Snapshot::unkeyed(now, row))
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
    pub(crate) owner: String,
    pub(crate) voided_at: Option<Timestamp>,
    pub(crate) payment_scope: Option<String>,
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
            owner: self.owner,
            payment_scope: self.payment_scope,
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
    pub(crate) owner: Option<String>,
    #[diesel(sql_type = Nullable<Instant>)]
    pub(crate) voided_at: Option<Timestamp>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) payment_scope: Option<String>,
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
            owner: self.owner.unwrap_or_default(),
            voided_at: self.voided_at,
            payment_scope: self.payment_scope,
        }
        .into_reservation()
        .map(Some)
    }
}

/// The columns of a LEFT JOINed idempotency record, all nullable.
#[derive(QueryableByName, Clone)]
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
            status: u16::try_from(self.status_code?).ok()?,
            body: self.body?,
            location: self.location,
        })
    }
}

#[derive(QueryableByName, Clone)]
pub(crate) struct HoldSnapshotRow {
    #[diesel(embed)]
    pub(crate) key: KeySnapshotRow,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) status: Option<String>,
    #[diesel(sql_type = Nullable<Instant>)]
    pub(crate) hold_expires_at: Option<Timestamp>,
    #[diesel(sql_type = Nullable<Instant>)]
    pub(crate) available_from: Option<Timestamp>,
}

impl HoldSnapshotRow {
    pub(crate) fn into_snapshot(self) -> StoreResult<Snapshot<HoldTarget>> {
        let row = match self.status {
            Some(s) => Some(HoldTarget {
                status: parse_status(AssetStatus::parse, &s)?,
                hold_expires_at: self.hold_expires_at,
                available_from: self.available_from,
            }),
            None => None,
        };
        Ok(self.key.with_row(row))
    }
}

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
}

impl ReservationSnapshotRow {
    pub(crate) fn into_snapshot(self) -> StoreResult<Snapshot<Reservation>> {
        Ok(Snapshot {
            now: self.now,
            row: self.reservation.into_reservation()?,
            stored: self.stored.into_answer(),
            fate: self.fate.into_fate(),
        })
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

/// One payment reference's fate in one scope.
#[derive(Selectable, Queryable, QueryableByName)]
#[diesel(table_name = payments, check_for_backend(diesel::pg::Pg, diesel::sqlite::Sqlite))]
pub(crate) struct PaymentRow {
    pub(crate) scope: String,
    pub(crate) reference: String,
    pub(crate) reservation_id: String,
    pub(crate) refund_id: Option<String>,
}

#[derive(QueryableByName)]
pub(crate) struct Claimed {
    #[diesel(sql_type = BigInt)]
    pub(crate) claimed: i64,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub(crate) limit_reached: bool,
}

/// Whether the end of a live hold found it live and wrote it.
#[derive(QueryableByName)]
pub(crate) struct Ended {
    #[diesel(sql_type = BigInt)]
    pub(crate) ended: i64,
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
    pub(crate) payment_scope: String,
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
            payment_scope: self.payment_scope,
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
    pub(crate) owner: Option<String>,
    pub(crate) actor: Option<String>,
}

impl EventRow {
    pub(crate) fn into_event(self) -> StoreResult<Event> {
        let data = serde_json::value::RawValue::from_string(self.data)
            .map_err(|e| StoreError::Corrupt(format!("event {} has invalid data: {e}", self.id)))?;
        Ok(Event {
            event_type: parse_status(EventType::parse, &self.event_type)?,
            id: self.id,
            asset_id: self.asset_id,
            sequence: self.sequence,
            created_at: self.created_at,
            data,
            actor: self.actor,
            owner: self.owner,
        })
    }
}

#[derive(Debug)]
pub(crate) struct NewEvent {
    pub(crate) id: String,
    pub(crate) asset_id: String,
    /// Numbered when written, from the asset's last event.
    pub(crate) sequence: i64,
    pub(crate) event_type: EventType,
    pub(crate) data: String,
    pub(crate) created_at: Timestamp,
    /// The reservation the event reports, whose owner the event records.
    pub(crate) reservation_id: Option<String>,
    pub(crate) actor: Option<String>,
}

impl NewEvent {
    pub(crate) fn new(
        asset_id: &str,
        event_type: EventType,
        data: String,
        created_at: Timestamp,
    ) -> Self {
        Self {
            id: EventId::generate().to_string(),
            asset_id: asset_id.to_owned(),
            sequence: 0,
            event_type,
            data,
            created_at,
            reservation_id: None,
            actor: None,
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

    /// The insert statement `sql` with the event bound as its first eight
    /// parameters: id, asset, sequence, type, data, creation, the reservation
    /// it reports (whose owner it records) and the actor.
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
    }
}

/// The columns of an [`EventRow`] in raw SQL (`type` is a keyword in Rust).
pub(crate) const EVENT_COLUMNS: &str =
    "id, asset_id, sequence, type AS event_type, data, created_at, owner, actor";

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

impl StatusCountRow {
    pub(crate) fn into_count(self) -> StoreResult<(AssetStatus, i64)> {
        Ok((parse_status(AssetStatus::parse, &self.status)?, self.n))
    }
}
