//! The statements both dialects share, written once with diesel's query
//! builder over the tables of `schema.rs`. [`both!`] compiles each of them
//! twice: in [`pg`] for diesel-async's PostgreSQL connection (awaited) and in
//! [`lite`] for the SQLite connection (run on the caller's blocking thread).
//! What differs between the dialects (PostgreSQL's single-statement writes
//! and coalesced read, SQLite's event positions) stays in each backend.

/// The row an update (or insert) of one row changed, returned whole as
/// `$row` and run by the dialect's `exec!` on `$conn`; `None` when its
/// guard matched no row.
macro_rules! returned {
    ($conn:ident, $update:expr, $row:ty, $context:literal) => {
        exec!($update
            .returning(<$row as SelectableHelper<_>>::as_returning())
            .get_result::<$row>($conn))
        .found($context)
    };
}

/// The event number an update of the asset took (see [`next_event`]),
/// run by the dialect's `exec!` on `$conn`; `None` when its guard matched
/// no row.
macro_rules! numbered {
    ($conn:ident, $update:expr, $context:literal) => {
        exec!($update
            .returning(assets::last_event_sequence)
            .get_result::<i64>($conn))
        .found($context)
    };
}

/// Defines each function once for each backend: `exec!(query)` awaits it on
/// PostgreSQL and runs it as is on SQLite.
macro_rules! both {
    ($(
        $(#[$meta:meta])*
        fn $name:ident $(<$gen:ident: $bound:path>)?
            ($conn:ident $(, $arg:ident : $ty:ty)* $(,)?) -> $ret:ty $body:block
    )*) => {
        /// The shared statements on a PostgreSQL connection.
        #[allow(dead_code)] // some serve SQLite alone: PostgreSQL has its own
        pub(crate) mod pg {
            #[allow(unused_imports)]
            use super::*;
            use crate::store::postgres::{expire_lapsed, insert_event};
            use diesel_async::RunQueryDsl;
            $(
                $(#[$meta])*
                pub(crate) async fn $name<
                    Conn: diesel_async::AsyncConnectionCore<Backend = diesel::pg::Pg> + Send
                    $(, $gen: $bound)?
                >($conn: &mut Conn $(, $arg: $ty)*) -> $ret {
                    #[allow(unused_macros)]
                    macro_rules! exec { ($e:expr) => { $e.await } }
                    $body
                }
            )*
        }

        /// The shared statements on an SQLite connection.
        #[allow(dead_code)]
        pub(crate) mod lite {
            #[allow(unused_imports)]
            use super::*;
            use crate::store::sqlite::{expire_lapsed, insert_event};
            use diesel::RunQueryDsl;
            type Conn = diesel::sqlite::SqliteConnection;
            $(
                $(#[$meta])*
                pub(crate) fn $name $(<$gen: $bound>)? ($conn: &mut Conn $(, $arg: $ty)*) -> $ret {
                    #[allow(unused_macros)]
                    macro_rules! exec { ($e:expr) => { $e } }
                    $body
                }
            )*
        }
    };
}

use diesel::{
    dsl, BoolExpressionMethods, ExpressionMethods, JoinOnDsl, NullableExpressionMethods, QueryDsl,
    SelectableHelper,
};

use super::audit::{self, Finding, CHECKS};
use super::error::{Context, Found};
use super::flow::{Change, Changed, PaymentKey, Written};
use super::rows::{
    with_refunds, AssetRow, EventRow, PaymentRow, RefundRow, ReservationRow, StatusCountRow,
};
use super::schema::{
    assets, events, idempotency_keys, payments, refunds, reservations, At, Instant,
};
use super::{AssetPage, Idempotency, RefundPage, ReservationPage, StoreError, StoreResult};
use crate::domain::{
    extension_allowed, Asset, AssetId, AssetStatus, Event, Refund, Reservation, ReservationStatus,
    Timestamp,
};
use crate::reply::Reply;

/// What a change of an asset that takes an event number sets besides its
/// own columns: its version and its last event number one up, and when.
fn next_event(now: Timestamp) -> NextEvent {
    (
        assets::version.eq(assets::version + 1),
        assets::last_event_sequence.eq(assets::last_event_sequence + 1),
        assets::updated_at.eq(At(now)),
    )
}

type NextEvent = (
    dsl::Eq<assets::version, dsl::Add<assets::version, i64>>,
    dsl::Eq<assets::last_event_sequence, dsl::Add<assets::last_event_sequence, i64>>,
    dsl::Eq<assets::updated_at, At>,
);

/// What a change of an asset that takes no event number sets besides: its
/// version one up, and when.
fn next_version(now: Timestamp) -> NextVersion {
    (
        assets::version.eq(assets::version + 1),
        assets::updated_at.eq(At(now)),
    )
}

type NextVersion = (
    dsl::Eq<assets::version, dsl::Add<assets::version, i64>>,
    dsl::Eq<assets::updated_at, At>,
);

/// The asset `reservation` holds, while its hold is live at `now`.
fn held_live(reservation: &Reservation, now: Timestamp) -> HeldLive<'_> {
    assets::table
        .filter(assets::id.eq(&reservation.asset_id))
        .filter(assets::status.eq("HELD"))
        .filter(assets::current_reservation_id.eq(&reservation.reservation_id))
        .filter(assets::hold_expires_at.gt(At(now)))
}

type HeldLive<'a> = dsl::Filter<
    dsl::Filter<
        dsl::Filter<
            dsl::Filter<assets::table, dsl::Eq<assets::id, &'a String>>,
            dsl::Eq<assets::status, &'static str>,
        >,
        dsl::Eq<assets::current_reservation_id, &'a String>,
    >,
    dsl::Gt<assets::hold_expires_at, At>,
>;

/// What an asset whose hold or sale ends sets: `status`, the reservation
/// that now has it (`current`), no hold expiry, and its next event.
fn settled<'a>(status: &'static str, current: Option<&'a str>, now: Timestamp) -> Settled<'a> {
    (
        assets::status.eq(status),
        assets::current_reservation_id.eq(current),
        assets::hold_expires_at.eq(None),
        next_event(now),
    )
}

type Settled<'a> = (
    dsl::Eq<assets::status, &'static str>,
    dsl::Eq<assets::current_reservation_id, Option<&'a str>>,
    dsl::Eq<assets::hold_expires_at, Option<At>>,
    NextEvent,
);

/// The reservation `id` while it still has `status`.
fn reservation_in<'a>(id: &'a str, status: &'static str) -> ReservationIn<'a> {
    reservations::table
        .find(id)
        .filter(reservations::status.eq(status))
}

type ReservationIn<'a> = dsl::Filter<
    dsl::Find<reservations::table, &'a str>,
    dsl::Eq<reservations::status, &'static str>,
>;

/// What a reservation sold for `payment` at `now` sets.
fn committed(payment: PaymentKey<'_>, now: Timestamp) -> Committed<'_> {
    (
        reservations::status.eq("COMMITTED"),
        reservations::committed_at.eq(At(now)),
        reservations::payment_reference.eq(payment.reference),
        reservations::payment_scope.eq(payment.scope),
    )
}

type Committed<'a> = (
    dsl::Eq<reservations::status, &'static str>,
    dsl::Eq<reservations::committed_at, At>,
    dsl::Eq<reservations::payment_reference, &'a str>,
    dsl::Eq<reservations::payment_scope, &'a str>,
);

/// What a reservation released at `now` sets.
fn released(now: Timestamp) -> Released {
    (
        reservations::status.eq("RELEASED"),
        reservations::released_at.eq(At(now)),
    )
}

type Released = (
    dsl::Eq<reservations::status, &'static str>,
    dsl::Eq<reservations::released_at, At>,
);

/// What a change of a reservation wrote: the reservation as it became (by
/// its effective status at `now`), and the event number its asset took.
fn reservation_changed(
    row: ReservationRow,
    sequence: i64,
    now: Timestamp,
) -> StoreResult<Option<Changed>> {
    Ok(Some(Changed {
        now: Some(now),
        reservation: Some(row.into_reservation()?.effective(now)),
        sequence: Some(sequence),
        ..Changed::default()
    }))
}

/// The asset a statement returned (if any), by its effective status at `now`.
fn asset_at(row: Option<AssetRow>, now: Timestamp) -> StoreResult<Option<Asset>> {
    row.map(|row| row.into_asset(now)).transpose()
}

/// What a change of an asset alone wrote: the asset as it became, at `now`.
fn asset_changed(row: AssetRow, now: Timestamp) -> StoreResult<Changed> {
    Ok(Changed {
        now: Some(now),
        asset: Some(row.into_asset(now)?),
        ..Changed::default()
    })
}

both! {
    /// The reservation with its refunds, by effective status at `now`; with
    /// `visible_to`, only when that client owns it (another client's is not
    /// read beyond the filter, exactly like a missing one).
    fn load_reservation(
        conn,
        id: &str,
        now: Timestamp,
        visible_to: Option<&str>,
    ) -> StoreResult<Option<Reservation>> {
        let mut query = reservations::table
            .find(id)
            .select(ReservationRow::as_select())
            .into_boxed();
        if let Some(owner) = visible_to {
            query = query.filter(reservations::owner.eq(owner));
        }
        let Some(row) = exec!(query.first::<ReservationRow>(conn))
            .found("read a reservation")?
        else {
            return Ok(None);
        };
        let refund_rows = exec!(refunds::table
            .filter(refunds::reservation_id.eq(id))
            .order((refunds::created_at.asc(), refunds::id.asc()))
            .select(RefundRow::as_select())
            .load::<RefundRow>(conn))
        .context("read a reservation's refunds")?;
        Ok(with_refunds(vec![row], refund_rows, now)?.pop())
    }

    /// A reservation read before (so it exists) read again: see
    /// [`load_reservation`].
    fn reload(conn, id: &str, now: Timestamp) -> StoreResult<Reservation> {
        exec!(load_reservation(conn, id, now, None))?
            .ok_or_else(|| StoreError::Corrupt(format!("reservation {id} vanished")))
    }

    /// One page of reservations, newest first, with their refunds.
    fn reservations_page(
        conn,
        page: &ReservationPage,
        now: Timestamp,
    ) -> StoreResult<Vec<Reservation>> {
        let mut query = reservations::table
            .select(ReservationRow::as_select())
            .order(reservations::id.desc())
            .limit(page.limit)
            .into_boxed();
        if let Some(buyer) = &page.buyer_id {
            query = query.filter(reservations::buyer_id.eq(buyer));
        }
        if let Some(asset) = &page.asset_id {
            query = query.filter(reservations::asset_id.eq(asset));
        }
        if let Some(owner) = &page.owner {
            query = query.filter(reservations::owner.eq(owner));
        }
        if let Some(before) = &page.before {
            query = query.filter(reservations::id.lt(before));
        }
        match page.status {
            Some(ReservationStatus::Held) => {
                query = query
                    .filter(reservations::status.eq("HELD"))
                    .filter(reservations::expires_at.gt(At(now)));
            }
            Some(ReservationStatus::Expired) => {
                query = query.filter(
                    reservations::status.eq("EXPIRED").or(reservations::status
                        .eq("HELD")
                        .and(reservations::expires_at.le(At(now)))),
                );
            }
            Some(other) => query = query.filter(reservations::status.eq(other.as_str())),
            None => {}
        }
        let rows = exec!(query.load::<ReservationRow>(conn)).context("list reservations")?;
        let ids: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
        let refund_rows = exec!(refunds::table
            .filter(refunds::reservation_id.eq_any(&ids))
            .order((refunds::created_at.asc(), refunds::id.asc()))
            .select(RefundRow::as_select())
            .load::<RefundRow>(conn))
        .context("read the reservations' refunds")?;
        with_refunds(rows, refund_rows, now)
    }

    /// One page of refunds in id (creation) order.
    fn refunds_page(conn, page: &RefundPage) -> StoreResult<Vec<Refund>> {
        let mut query = refunds::table
            .select(RefundRow::as_select())
            .order(refunds::id.asc())
            .limit(page.limit)
            .into_boxed();
        if let Some(status) = page.status {
            query = query.filter(refunds::status.eq(status.as_str()));
        }
        if let Some(after) = &page.after {
            query = query.filter(refunds::id.gt(after));
        }
        exec!(query.load::<RefundRow>(conn))
            .context("list refunds")?
            .into_iter()
            .map(RefundRow::into_refund)
            .collect()
    }

    fn refund(conn, id: &str) -> StoreResult<Option<Refund>> {
        exec!(refunds::table
            .find(id)
            .select(RefundRow::as_select())
            .first::<RefundRow>(conn))
        .found("read a refund")?
        .map(RefundRow::into_refund)
        .transpose()
    }

    /// An asset with the owner of its current reservation, at `now`.
    fn asset(conn, id: &str, now: Timestamp) -> StoreResult<Option<Asset>> {
        let row = exec!(assets::table
            .left_join(
                reservations::table
                    .on(reservations::id.nullable().eq(assets::current_reservation_id)),
            )
            .filter(assets::id.eq(id))
            .select((AssetRow::as_select(), reservations::owner.nullable()))
            .first::<(AssetRow, Option<String>)>(conn))
        .found("read an asset")?;
        row.map(|(asset, holder)| asset.into_held_asset(now, holder)).transpose()
    }

    /// Up to `page.limit` assets in id order, by effective status at `now`.
    fn assets_page(conn, page: &AssetPage, now: Timestamp) -> StoreResult<Vec<Asset>> {
        let mut query = assets::table
            .left_join(
                reservations::table
                    .on(reservations::id.nullable().eq(assets::current_reservation_id)),
            )
            .select((AssetRow::as_select(), reservations::owner.nullable()))
            .order(assets::id.asc())
            .limit(page.limit)
            .into_boxed();
        if let Some(after) = &page.after {
            query = query.filter(assets::id.gt(after));
        }
        match page.status {
            Some(AssetStatus::Available) => {
                query = query.filter(
                    assets::status.eq("AVAILABLE").or(assets::status
                        .eq("HELD")
                        .and(assets::hold_expires_at.le(At(now)))),
                );
            }
            Some(AssetStatus::Held) => {
                query = query
                    .filter(assets::status.eq("HELD"))
                    .filter(assets::hold_expires_at.gt(At(now)));
            }
            Some(other) => query = query.filter(assets::status.eq(other.as_str())),
            None => {}
        }
        exec!(query.load::<(AssetRow, Option<String>)>(conn))
            .context("list assets")?
            .into_iter()
            .map(|(asset, holder)| asset.into_held_asset(now, holder))
            .collect()
    }

    /// Assets per effective status at `now` (a lapsed hold counts as
    /// AVAILABLE); statuses no asset has are left out. (`$1` is a numbered
    /// parameter on PostgreSQL and a named one on SQLite: one text serves
    /// both, grouped by position since the parameter is not an expression.)
    fn asset_counts(conn, now: Timestamp) -> StoreResult<Vec<(AssetStatus, i64)>> {
        exec!(diesel::sql_query(
            "SELECT CASE WHEN status = 'HELD' AND hold_expires_at <= $1 THEN 'AVAILABLE' \
             ELSE status END AS status, count(*) AS n FROM assets GROUP BY 1",
        )
        .bind::<Instant, _>(At(now))
        .load::<StatusCountRow>(conn))
        .context("count assets")?
        .into_iter()
        .map(StatusCountRow::into_count)
        .collect()
    }

    /// Up to `limit` of an asset's events after sequence `after`, oldest
    /// first; `None` when the asset does not exist.
    fn asset_events(
        conn,
        id: &str,
        after: i64,
        limit: i64,
    ) -> StoreResult<Option<Vec<Event>>> {
        let exists = exec!(assets::table.find(id).select(assets::id).first::<String>(conn))
            .found("find an asset")?
            .is_some();
        if !exists {
            return Ok(None);
        }
        exec!(events::table
            .filter(events::asset_id.eq(id))
            .filter(events::sequence.gt(after))
            .order(events::sequence.asc())
            .limit(limit)
            .select(EventRow::as_select())
            .load::<EventRow>(conn))
        .context("read an asset's events")?
        .into_iter()
        .map(EventRow::into_event)
        .collect::<StoreResult<_>>()
        .map(Some)
    }

    /// The fates of `reference`: in `scope` and in the scope `''` of sales
    /// recorded before scopes, or in every scope; own scope first.
    fn payment_fates(
        conn,
        scope: Option<&str>,
        reference: &str,
    ) -> StoreResult<Vec<PaymentRow>> {
        let mut query = payments::table
            .filter(payments::reference.eq(reference))
            .select(PaymentRow::as_select())
            .order(payments::scope.desc())
            .into_boxed();
        if let Some(scope) = scope {
            query = query.filter(payments::scope.eq_any([scope, ""]));
        }
        exec!(query.load::<PaymentRow>(conn)).context("read a payment")
    }

    /// Records a refund; a unique violation when this payment of this
    /// reservation has one.
    fn insert_refund(conn, refund: &Refund) -> StoreResult<()> {
        exec!(diesel::insert_into(refunds::table)
            .values((
                refunds::id.eq(&refund.refund_id),
                refunds::reservation_id.eq(&refund.reservation_id),
                refunds::asset_id.eq(&refund.asset_id),
                refunds::payment_reference.eq(&refund.payment_reference),
                refunds::payment_scope.eq(&refund.payment_scope),
                refunds::reason.eq(refund.reason.as_str()),
                refunds::status.eq(refund.status.as_str()),
                refunds::created_at.eq(At(refund.created_at)),
            ))
            .execute(conn))
        .context("record a refund")?;
        Ok(())
    }

    /// Records a payment's one fate: it bought `reservation_id`, or
    /// `refund_id` gives it back. A unique violation when it has one already.
    fn record_fate(
        conn,
        payment: PaymentKey<'_>,
        reservation_id: &str,
        refund_id: Option<&str>,
        now: Timestamp,
    ) -> StoreResult<()> {
        exec!(diesel::insert_into(payments::table)
            .values((
                payments::scope.eq(payment.scope),
                payments::reference.eq(payment.reference),
                payments::reservation_id.eq(reservation_id),
                payments::refund_id.eq(refund_id),
                payments::created_at.eq(At(now)),
            ))
            .execute(conn))
        .context("record the payment's fate")?;
        Ok(())
    }

    /// Writes the answer stored under the request's key; a unique violation
    /// when a concurrent duplicate stored one first.
    fn store_answer(
        conn,
        idempotency: &Idempotency,
        reply: &Reply,
        reservation_id: &str,
        now: Timestamp,
    ) -> StoreResult<()> {
        exec!(diesel::insert_into(idempotency_keys::table)
            .values((
                idempotency_keys::scope.eq(&idempotency.scope),
                idempotency_keys::key.eq(idempotency.key.as_str()),
                idempotency_keys::fingerprint.eq(&idempotency.fingerprint),
                idempotency_keys::status_code.eq(i32::from(reply.status)),
                idempotency_keys::body.eq(&reply.body),
                idempotency_keys::location.eq(reply.location.as_deref()),
                idempotency_keys::reservation_id.eq(reservation_id),
                idempotency_keys::created_at.eq(At(now)),
            ))
            .execute(conn))
        .context("store the answer")?;
        Ok(())
    }

    /// Takes the next `n` event numbers of an asset (locking its row); the
    /// last of them.
    fn take_sequences(conn, asset: &str, n: i64) -> StoreResult<i64> {
        exec!(diesel::update(assets::table.find(asset))
            .set(assets::last_event_sequence.eq(assets::last_event_sequence + n))
            .returning(assets::last_event_sequence)
            .get_result::<i64>(conn))
        .context("number an event")
    }

    /// Schedules an event for delivery again; `None` when it does not exist.
    fn redeliver(conn, id: &str) -> StoreResult<Option<Event>> {
        let update = diesel::update(events::table.filter(events::id.eq(id))).set((
            events::delivered_at.eq(None::<At>),
            events::dead_at.eq(None::<At>),
            events::attempts.eq(0),
            events::next_attempt_at.eq(None::<At>),
            events::last_error.eq(None::<String>),
        ));
        returned!(conn, update, EventRow, "schedule an event again")?
            .map(EventRow::into_event)
            .transpose()
    }

    /// Every invariant, one statement each; `events_since` is the start of
    /// event retention.
    fn audit(conn, events_since: Timestamp, postgres: bool) -> StoreResult<Vec<Finding>> {
        let mut findings = Vec::new();
        for check in CHECKS {
            let sql = match (postgres, check.postgres) {
                (true, Some(own)) => audit::statement(own, "$1::timestamptz"),
                (true, None) => audit::statement(check.sql, "$1::timestamptz"),
                (false, _) => audit::statement(check.sql, "$1"),
            };
            let rows = exec!(diesel::sql_query(sql)
                .bind::<Instant, _>(At(events_since))
                .load::<audit::Row>(conn))
            .context("run an audit check")?;
            findings.push(audit::finding(check, rows));
        }
        Ok(findings)
    }

    /// Writes what goes with a change: its events, numbered from the one
    /// the change took and then the asset's next, and the stored answer.
    fn write_after<T: Send>(
        conn,
        asset: &str,
        changed: &Changed,
        written: Written<T>,
        idempotency: Option<&Idempotency>,
    ) -> StoreResult<T> {
        let now = changed.at()?;
        let mut written = written;
        // The number the change took first, then the asset's next ones.
        let extra = written.events.len() as i64 - i64::from(changed.sequence.is_some());
        let mut next = if extra > 0 {
            exec!(take_sequences(conn, asset, extra))? - extra + 1
        } else {
            0
        };
        let mut taken = changed.sequence;
        for event in &mut written.events {
            event.sequence = taken.take().unwrap_or_else(|| {
                next += 1;
                next - 1
            });
        }
        for event in &written.events {
            exec!(insert_event(conn, event))?;
        }
        if let (Some(idempotency), Some((reply, reservation_id))) = (idempotency, &written.answer) {
            exec!(store_answer(conn, idempotency, reply, reservation_id, now))?;
        }
        Ok(written.value)
    }

    /// A new asset, unless one has this id.
    fn create_asset(
        conn,
        id: &AssetId,
        name: &str,
        available_from: Option<Timestamp>,
        now: Timestamp,
    ) -> StoreResult<Option<Asset>> {
        let insert = diesel::insert_into(assets::table)
            .values((
                assets::id.eq(id.as_str()),
                assets::name.eq(name),
                assets::available_from.eq(available_from.map(At)),
                assets::created_at.eq(At(now)),
                assets::updated_at.eq(At(now)),
            ))
            .on_conflict_do_nothing();
        asset_at(returned!(conn, insert, AssetRow, "create an asset")?, now)
    }

    /// Sets or clears when an asset's sale opens.
    fn set_available_from(
        conn,
        id: &AssetId,
        available_from: Option<Timestamp>,
        now: Timestamp,
    ) -> StoreResult<Option<Asset>> {
        let update = diesel::update(assets::table.find(id.as_str()))
            .set((assets::available_from.eq(available_from.map(At)), next_version(now)));
        asset_at(returned!(conn, update, AssetRow, "set when the sale opens")?, now)
    }

    /// Ends a hold still live at `now`: the asset SOLD to it (`payment`
    /// recording its fate), or AVAILABLE again. `None` when no longer live.
    fn finish_hold(
        conn,
        reservation: &Reservation,
        payment: Option<PaymentKey<'_>>,
        now: Timestamp,
    ) -> StoreResult<Option<Changed>> {
        let (status, current) = match payment {
            Some(_) => ("SOLD", Some(reservation.reservation_id.as_str())),
            None => ("AVAILABLE", None),
        };
        let update = diesel::update(held_live(reservation, now)).set(settled(status, current, now));
        let Some(sequence) = numbered!(conn, update, "change the asset")? else {
            return Ok(None);
        };
        let held = || reservation_in(&reservation.reservation_id, "HELD");
        let row = match payment {
            Some(payment) => exec!(diesel::update(held())
                .set(committed(payment, now))
                .returning(ReservationRow::as_returning())
                .get_result::<ReservationRow>(conn))
            .context("commit the reservation")?,
            None => exec!(diesel::update(held())
                .set(released(now))
                .returning(ReservationRow::as_returning())
                .get_result::<ReservationRow>(conn))
            .context("release the reservation")?,
        };
        if let Some(payment) = payment {
            exec!(record_fate(conn, payment, &reservation.reservation_id, None, now))?;
        }
        reservation_changed(row, sequence, now)
    }

    /// Moves a live hold's expiry to `hold_seconds` from `now`, within
    /// `max_total_seconds` of its creation. `None` otherwise.
    fn extend(
        conn,
        reservation: &Reservation,
        hold_seconds: i64,
        max_total_seconds: i64,
        now: Timestamp,
    ) -> StoreResult<Option<Changed>> {
        let until = now + chrono::Duration::seconds(hold_seconds);
        if !extension_allowed(reservation.created_at, until, max_total_seconds) {
            return Ok(None);
        }
        let update = diesel::update(held_live(reservation, now))
            .set((assets::hold_expires_at.eq(Some(At(until))), next_event(now)));
        let Some(sequence) = numbered!(conn, update, "extend the hold")? else {
            return Ok(None);
        };
        let row = exec!(diesel::update(reservation_in(&reservation.reservation_id, "HELD"))
            .set(reservations::expires_at.eq(At(until)))
            .returning(ReservationRow::as_returning())
            .get_result::<ReservationRow>(conn))
        .context("extend the reservation")?;
        reservation_changed(row, sequence, now)
    }

    /// Undoes a sale: COMMITTED becomes VOIDED, the asset AVAILABLE, and
    /// `refund` is recorded. `None` when it was no longer the asset's sale.
    fn void(
        conn,
        reservation: &Reservation,
        refund: Option<&Refund>,
        now: Timestamp,
    ) -> StoreResult<Option<Changed>> {
        let sold = assets::table
            .filter(assets::id.eq(&reservation.asset_id))
            .filter(assets::status.eq("SOLD"))
            .filter(assets::current_reservation_id.eq(&reservation.reservation_id));
        let update = diesel::update(sold).set(settled("AVAILABLE", None, now));
        let Some(sequence) = numbered!(conn, update, "void the sale")? else {
            return Ok(None);
        };
        let voided = exec!(diesel::update(reservation_in(&reservation.reservation_id, "COMMITTED"))
            .set((
                reservations::status.eq("VOIDED"),
                reservations::voided_at.eq(At(now)),
            ))
            .execute(conn))
        .context("void the reservation")?;
        if voided != 1 {
            return Ok(None);
        }
        if let Some(refund) = refund {
            exec!(insert_refund(conn, refund))?;
        }
        let current = exec!(load_reservation(conn, &reservation.reservation_id, now, None))?;
        Ok(Some(Changed {
            now: Some(now),
            reservation: current,
            refund: refund.cloned(),
            sequence: Some(sequence),
            ..Changed::default()
        }))
    }

    /// Sells the asset to a lapsed hold (already expired) when nobody held
    /// or bought it since, recording the payment's fate. `None` otherwise.
    fn commit_late(
        conn,
        reservation: &Reservation,
        payment: PaymentKey<'_>,
        now: Timestamp,
    ) -> StoreResult<Option<Changed>> {
        let later = reservations::table
            .filter(reservations::asset_id.eq(&reservation.asset_id))
            .filter(reservations::id.ne(&reservation.reservation_id))
            .filter(reservations::created_at.ge(At(reservation.created_at)));
        let free = assets::table
            .filter(assets::id.eq(&reservation.asset_id))
            .filter(assets::status.eq("AVAILABLE"))
            .filter(diesel::dsl::not(diesel::dsl::exists(later)));
        let sold = settled("SOLD", Some(&reservation.reservation_id), now);
        let update = diesel::update(free).set(sold);
        let Some(sequence) = numbered!(conn, update, "sell to a late payment")? else {
            return Ok(None);
        };
        let expired = reservation_in(&reservation.reservation_id, "EXPIRED");
        let update = diesel::update(expired).set(committed(payment, now));
        let Some(row) = returned!(conn, update, ReservationRow, "commit the reservation")? else {
            return Ok(None);
        };
        exec!(record_fate(conn, payment, &reservation.reservation_id, None, now))?;
        reservation_changed(row, sequence, now)
    }

    /// Records `refund` as its payment's fate (lapsed holds already
    /// expired); a unique violation when the payment has one.
    fn refund_payment(conn, refund: &Refund, now: Timestamp) -> StoreResult<Option<Changed>> {
        exec!(insert_refund(conn, refund))?;
        let payment = PaymentKey {
            scope: &refund.payment_scope,
            reference: &refund.payment_reference,
        };
        exec!(record_fate(conn, payment, &refund.reservation_id, Some(&refund.refund_id), now))?;
        let current = exec!(load_reservation(conn, &refund.reservation_id, now, None))?;
        Ok(Some(Changed {
            now: Some(now),
            reservation: current,
            refund: Some(refund.clone()),
            ..Changed::default()
        }))
    }

    /// A REQUESTED refund becomes COMPLETED. `None` when it no longer was.
    fn complete_refund(conn, refund: &Refund, now: Timestamp) -> StoreResult<Option<Changed>> {
        let requested = refunds::table
            .find(&refund.refund_id)
            .filter(refunds::status.eq("REQUESTED"));
        let update = diesel::update(requested).set((
            refunds::status.eq("COMPLETED"),
            refunds::completed_at.eq(Some(At(now))),
        ));
        let Some(row) = returned!(conn, update, RefundRow, "complete a refund")? else {
            return Ok(None);
        };
        Ok(Some(Changed {
            now: Some(now),
            refund: Some(row.into_refund()?),
            ..Changed::default()
        }))
    }

    /// Takes an asset off sale if it is still at `version`, ending its
    /// lapsed hold (EXPIRED) or its live one (RELEASED) with it. The asset
    /// row is locked first, as every change does. `None` when it moved, or
    /// when the hold is no longer what the decision saw at `now`: a hold
    /// found live may have lapsed while the write waited, and a lapsed
    /// hold is never released.
    fn withdraw(
        conn,
        asset: &str,
        version: i64,
        expire: Option<&str>,
        release: Option<&str>,
        now: Timestamp,
    ) -> StoreResult<Option<Changed>> {
        let unchanged = assets::table
            .find(asset)
            .filter(assets::version.eq(version));
        let withdrawn = || {
            (
                assets::status.eq("WITHDRAWN"),
                assets::hold_expires_at.eq(None::<At>),
                assets::current_reservation_id.eq(None::<String>),
                next_version(now),
            )
        };
        let row = if expire.is_none() && release.is_none() {
            let update = diesel::update(unchanged).set(withdrawn());
            returned!(conn, update, AssetRow, "withdraw the asset")
        } else {
            // Live for a release, lapsed for an expiry.
            let live = assets::hold_expires_at.gt(At(now)).eq(Some(expire.is_none()));
            let update = diesel::update(unchanged.filter(live)).set(withdrawn());
            returned!(conn, update, AssetRow, "withdraw the asset")
        };
        let Some(row) = row? else {
            return Ok(None);
        };
        let held = |id| diesel::update(reservation_in(id, "HELD"));
        let ended = match (expire, release) {
            (Some(id), _) => {
                let update = held(id).set(reservations::status.eq("EXPIRED"));
                returned!(conn, update, ReservationRow, "expire the hold")?.map(Some)
            }
            (None, Some(id)) => {
                let update = held(id).set(released(now));
                returned!(conn, update, ReservationRow, "release the hold")?.map(Some)
            }
            (None, None) => Some(None),
        };
        // The hold the decision was made on is gone: the state moved.
        let Some(ended) = ended else {
            return Ok(None);
        };
        Ok(Some(Changed {
            ended: ended.map(ReservationRow::into_reservation).transpose()?,
            ..asset_changed(row, now)?
        }))
    }

    /// Puts a WITHDRAWN asset back on sale. `None` when it was not withdrawn.
    fn reinstate(conn, asset: &str, now: Timestamp) -> StoreResult<Option<Changed>> {
        let withdrawn = assets::table
            .find(asset)
            .filter(assets::status.eq("WITHDRAWN"));
        let reinstated = (assets::status.eq("AVAILABLE"), next_version(now));
        let update = diesel::update(withdrawn).set(reinstated);
        let Some(row) = returned!(conn, update, AssetRow, "reinstate the asset")? else {
            return Ok(None);
        };
        asset_changed(row, now).map(Some)
    }

    /// Makes `change` with the shared statements at `now`.
    fn apply(conn, change: &Change, now: Timestamp) -> StoreResult<Option<Changed>> {
        match change {
            Change::Commit {
                reservation,
                scope,
                reference,
                ..
            } => {
                let payment = PaymentKey { scope, reference };
                exec!(finish_hold(conn, reservation, Some(payment), now))
            }
            Change::Release { reservation, .. } => {
                exec!(finish_hold(conn, reservation, None, now))
            }
            Change::Extend {
                reservation,
                hold_seconds,
                max_total_seconds,
            } => exec!(extend(conn, reservation, *hold_seconds, *max_total_seconds, now)),
            Change::Void {
                reservation,
                refund: given,
            } => exec!(void(conn, reservation, given.as_ref(), now)),
            Change::CommitLate {
                reservation,
                scope,
                reference,
            } => {
                // The lapsed hold, if nobody swept it yet, expires first
                // (waiting for a janitor expiring it right now).
                exec!(expire_lapsed(conn, Some(&reservation.asset_id), now, 1))?;
                let payment = PaymentKey { scope, reference };
                exec!(commit_late(conn, reservation, payment, now))
            }
            Change::Refund {
                reservation,
                refund: given,
            } => {
                // A lapsed hold nobody swept yet is expired first, so the
                // timeline reads held → expired → refund requested.
                exec!(expire_lapsed(conn, Some(&reservation.asset_id), now, 1))?;
                exec!(refund_payment(conn, given, now))
            }
            Change::CompleteRefund { refund: given } => exec!(complete_refund(conn, given, now)),
            Change::Withdraw {
                asset_id,
                version,
                expire,
                release,
            } => exec!(withdraw(
                conn,
                asset_id,
                *version,
                expire.as_deref(),
                release.as_deref(),
                now
            )),
            Change::Reinstate { asset_id } => exec!(reinstate(conn, asset_id, now)),
        }
    }
}
