//! The hold: a buyer claims an AVAILABLE asset (or one whose hold lapsed,
//! displacing that hold) for `hold_seconds`, unless the buyer is at the
//! limit of live holds.
//!
//! The first read is the clock, the asset and the answer stored under the
//! key, from one snapshot; the flash sale's losers stop there, having
//! written nothing. On PostgreSQL that read is coalesced: the holds that
//! arrive while one such read runs are read together by the next, one
//! statement for all of them ([`read_snapshots`]). The write is one
//! statement on PostgreSQL, the function `hold_asset` (migration `clients`),
//! so that the hold is one round trip with its commit; on SQLite the same
//! steps are statements in one transaction ([`claim_on_sqlite`]). Both take
//! the same steps in the same order: the buyer's live holds counted (on
//! PostgreSQL under a lock of that buyer's own, taken before the asset's
//! row, so that one buyer's burst cannot overshoot while other buyers run in
//! parallel; SQLite serialises every write), a lapsed hold displaced (its
//! reservation EXPIRED, its event written), the asset claimed under its
//! guard, then the reservation, its event and the answer kept under the key.

use chrono::Duration as Span;
use diesel::sql_query;
use diesel::sql_types::{Array, BigInt, Integer, Nullable, Text, Timestamptz};
use diesel::QueryableByName;

use super::expire::{expire_lapsed, Lapsed};
use super::{after_earlier, answered, contention, Snapshot, MAX_ATTEMPTS};
use crate::domain::{
    hold_decision, AssetId, AssetStatus, AssetUnavailable, BuyerId, EventId, EventType,
    HoldDecision, HoldTarget, Price, Reservation, ReservationStatus, Timestamp,
};
use crate::store::api::{Answer, HoldOutcome, HoldRequest, Keyed, Policy, Rendered};
use crate::store::conn::{Bind, Conn, Sql};
use crate::store::db::Store;
use crate::store::error::{Abort, Context};
use crate::store::error::{StoreError, StoreResult};
use crate::store::postgres::{Prepared, Sessions};
use crate::store::rows::{
    parse_status, Count, HoldBatchRow, HoldSnapshotRow, KeySnapshotRow, MaybeStoredRow, NewEvent,
    SnapshotAsset, SnapshotInput,
};
use crate::store::schema::Instant;

/// A hold's future is moved whole into the heap once (`Store::bounded`), and
/// its size is that of its largest branch. The branches that most holds
/// never take (SQLite's read, the write, an own hold, a hand-over, a
/// displacement) are therefore boxed where they run: a flash sale's
/// rejection then moves and allocates 936 bytes instead of 6,928.
pub(crate) async fn hold(store: &Store, req: &HoldRequest) -> StoreResult<Keyed<HoldOutcome>> {
    for _ in 0..MAX_ATTEMPTS {
        let snap = snapshot(store, req).await?;
        if let Some(stored) = snap.stored {
            return Ok(answered(stored, &req.idempotency));
        }
        let Some(seen) = snap.row else {
            return Ok(Keyed::NotFound);
        };
        let lapsed = seen.holding.clone();
        let decided = seen.decided(req, snap.now);
        let displaced = match hold_decision(Some(seen.target), decided) {
            HoldDecision::NotFound => return Ok(Keyed::NotFound),
            HoldDecision::SaleNotOpen { .. } | HoldDecision::Unavailable { .. }
                if req.idempotency.behind() =>
            {
                match after_earlier(store, &req.idempotency).await {
                    true => continue,
                    false => return Ok(Keyed::InUse),
                }
            }
            HoldDecision::SaleNotOpen { available_from } => {
                return Ok(Keyed::Done(HoldOutcome::SaleNotOpen { available_from }))
            }
            HoldDecision::Unavailable {
                status: AssetStatus::Held,
                ..
            } if seen.held_by(&req.client, &req.buyer_id) => {
                // The same buyer's own live hold: that reservation, answered
                // again under this key (or read again if it moved on).
                let Some(id) = lapsed else { continue };
                match Box::pin(keep_own(store, req, id)).await? {
                    Some(own) => return Ok(Keyed::Done(HoldOutcome::Own(Box::new(own)))),
                    None => continue,
                }
            }
            HoldDecision::Unavailable {
                status,
                hold_expires_at,
            } => {
                return Ok(Keyed::Done(HoldOutcome::Unavailable(AssetUnavailable {
                    status,
                    hold_expires_at,
                    waitlist_length: seen.waitlist_length,
                })))
            }
            HoldDecision::Reclaim if seen.waitlist_length > 0 => {
                // Buyers wait for it: the lapsed hold ends here and the first
                // of them gets the asset; then this hold reads again (it is
                // refused, unless this buyer was that first waiter).
                Box::pin(hand_over(store, &req.asset_id)).await?;
                continue;
            }
            HoldDecision::Claim => None,
            HoldDecision::Reclaim => match lapsed {
                Some(id) => Box::pin(displaced(store, &id, snap.now)).await?,
                None => None,
            },
        };
        let reservation = Reservation {
            price: seen.price,
            metadata: req.metadata.clone(),
            ..Reservation::held(
                &req.asset_id,
                &req.buyer_id,
                &req.client,
                snap.now,
                snap.now + Span::seconds(req.hold_seconds),
            )
        };
        let draft = Draft {
            answer: store.render(Answer::Held(&reservation)),
            reservation,
            event_id: EventId::at(snap.now).to_string(),
            request: req.clone(),
            policy: *store.policy(),
            displaced,
            decided,
        };
        let claimed = match store.postgres() {
            Some(_) => {
                let claim =
                    async move |c: &mut Conn<'_>| Ok((draft.claim_on_postgres(c).await?, draft));
                Box::pin(store.write_statement("hold the asset", claim)).await?
            }
            None => {
                let claim =
                    async move |c: &mut Conn<'_>| Ok((draft.claim_on_sqlite(c).await?, draft));
                Box::pin(store.write("hold the asset", claim)).await?
            }
        };
        // `None`: the key was used concurrently; read again.
        match claimed {
            Some((Claim::Claimed, draft)) => {
                return Ok(Keyed::Done(HoldOutcome::Created(Box::new(
                    draft.reservation,
                ))))
            }
            Some((Claim::LimitReached, _)) if req.idempotency.behind() => {
                match after_earlier(store, &req.idempotency).await {
                    true => continue,
                    false => return Ok(Keyed::InUse),
                }
            }
            Some((Claim::LimitReached, draft)) => {
                let limit = draft.policy.max_live_holds.unwrap_or_default();
                return Ok(Keyed::Done(HoldOutcome::LimitReached { limit }));
            }
            Some((Claim::Taken, _)) | None => continue,
        }
    }
    Err(contention("hold the asset"))
}

/// The asset as the hold's first read saw it.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    target: HoldTarget,
    /// When the read was sent, on the monotonic clock: the snapshot's clock
    /// was taken after it.
    sent: std::time::Instant,
    /// The reservation holding it (live or lapsed).
    holding: Option<String>,
    /// That reservation's client and buyer, while the asset is HELD.
    holder: Option<(String, String)>,
    price: Option<Price>,
    waitlist_length: i64,
}

impl Seen {
    /// The moment `req` is decided at: its arrival, on the clock of the read
    /// (`now`, the start of the read's statement): `now` less the time from
    /// the arrival to the read's sending, both on this instance's monotonic
    /// clock, so never before the arrival; the instance's wall clock plays no
    /// part. The buyer's own hold, live then but lapsed by `now`, is decided
    /// at `now`: no attempt was refused on it (the buyer's own hold is
    /// answered and kept under the key), and the buyer may take it again.
    fn decided(&self, req: &HoldRequest, now: Timestamp) -> Timestamp {
        let lapsed = self.target.hold_expires_at.is_some_and(|at| at <= now);
        if lapsed && self.held_by(&req.client, &req.buyer_id) {
            return now;
        }
        super::arrival(now, self.sent, req.arrived)
    }

    /// Whether `buyer` of `client` holds it.
    fn held_by(&self, client: &str, buyer: &BuyerId) -> bool {
        self.holder
            .as_ref()
            .is_some_and(|(c, b)| c == client && b == buyer.as_str())
    }
}

/// Ends the asset's lapsed hold and hands the asset to its first waiter.
async fn hand_over(store: &Store, asset: &AssetId) -> StoreResult<()> {
    let (asset, policy) = (asset.to_string(), *store.policy());
    store
        .write("hand the asset to its first waiter", async move |conn| {
            let now = conn.now().await?;
            Ok(expire_lapsed(conn, Lapsed::Of(&asset), now, &policy).await?)
        })
        .await?;
    Ok(())
}

/// Answers a hold of the buyer's own live hold with that reservation,
/// kept under the request's key; `None` when it is no longer that buyer's
/// live hold (or the key was used concurrently): the hold reads again.
async fn keep_own(
    store: &Store,
    req: &HoldRequest,
    id: String,
) -> StoreResult<Option<Reservation>> {
    let store_ = store.clone();
    let buyer = (req.client.clone(), req.buyer_id.as_str().to_owned());
    let idempotency = req.idempotency.clone();
    store
        .write("answer the buyer's own hold", async move |conn| {
            let now = conn.now().await?;
            let own = crate::store::read::reservation_in(conn, &id, now)
                .await?
                .filter(|r| {
                    r.status == ReservationStatus::Held
                        && (&r.client, &r.buyer_id) == (&buyer.0, &buyer.1)
                })
                .ok_or(Abort::Retry)?;
            let answer = store_.render(Answer::Changed(&own));
            let reservation_id = Some(own.reservation_id.as_str());
            let keep = super::Keep {
                idempotency: &idempotency,
                answer: &answer,
                reservation_id,
            };
            super::store_answer(conn, keep, now).await?;
            Ok(own)
        })
        .await
}

/// A lapsed hold that the claim displaces: its reservation and the event of
/// its expiry, whose data is the reservation as it became.
#[derive(Debug, Clone)]
struct Displaced {
    reservation_id: String,
    event_id: String,
    data: String,
}

/// The hold the claim displaces: the lapsed reservation `id`, EXPIRED at
/// `now`. `None` when it is not there (a janitor expired it and purged
/// nothing: the claim then finds the asset AVAILABLE, or taken).
async fn displaced(store: &Store, id: &str, now: Timestamp) -> StoreResult<Option<Displaced>> {
    let lapsed = crate::store::read::stored_reservation(store, id).await?;
    Ok(lapsed.map(|r| {
        let expired = r.effective(now);
        Displaced {
            data: serde_json::to_string(&expired).unwrap_or_default(),
            reservation_id: expired.reservation_id,
            event_id: EventId::at(now).to_string(),
        }
    }))
}

/// Whether `client`'s `buyer` already has the most live holds `policy`
/// allows at `now` (offers do not count; `false` without a limit). The
/// hold on SQLite and the hand-off to a waiter ask it; on PostgreSQL
/// `hold_asset` asks the same, under the buyer's lock. The holds live at
/// `now` are among the buyer's ids since [`Policy::live_holds_since`], a
/// range of `reservations_buyer_idx` (the status compared as an expression,
/// so that no plan reads every live hold through the index of HELD ones
/// instead).
pub(super) async fn at_limit(
    conn: &mut Conn<'_>,
    client: &str,
    buyer: &str,
    now: Timestamp,
    policy: &Policy,
) -> StoreResult<bool> {
    let Some(limit) = policy.max_live_holds else {
        return Ok(false);
    };
    let mut count = Sql::new("SELECT count(*) AS n FROM reservations WHERE buyer_id = ");
    count
        .bind(Bind::Text(buyer.to_owned()))
        .push(" AND id >= ")
        .bind(Bind::Text(policy.live_holds_since(now)))
        .push(" AND client = ")
        .bind(Bind::Text(client.to_owned()))
        .push(" AND status || '' = 'HELD' AND expires_at > ")
        .bind(Bind::At(now))
        .push(" AND (via IS NULL OR via <> 'offer')");
    let live = conn
        .load_sql::<Count>(&count)
        .await
        .context("count the buyer's live holds")?;
    Ok(live.first().is_some_and(|c| c.n >= limit))
}

/// A hold ready to be written.
struct Draft {
    request: HoldRequest,
    reservation: Reservation,
    answer: Rendered,
    event_id: String,
    policy: Policy,
    displaced: Option<Displaced>,
    /// The moment the hold was decided at (its arrival): the claim takes
    /// only an asset free then.
    decided: Timestamp,
}

/// What a hold's write found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claim {
    Claimed,
    /// Taken meanwhile: read again.
    Taken,
    /// The buyer is at the limit of live holds; nothing written.
    LimitReached,
}

/// The hold on PostgreSQL: `hold_asset` (migration `clients`). It begins
/// with `WITH`, as every write sent on its own may.
pub const HOLD_SQL: &str = "\
WITH hold AS (
    SELECT claimed, limit_reached
      FROM hold_asset(asset_id => $1, reservation_id => $2, buyer_id => $3, at => $4,
                      expires_at => $5, event_id => $6, body => $7, key_client => $8, key => $9,
                      fingerprint => $10, status_code => $11, location => $12, client => $13,
                      max_live_holds => $14, displaced => $15, displaced_event_id => $16,
                      displaced_data => $17, price_amount => $18, price_currency => $19,
                      metadata => $20, live_since => $21, decided_at => $22)
)
SELECT claimed, limit_reached FROM hold";

#[derive(QueryableByName)]
struct Claimed {
    #[diesel(sql_type = BigInt)]
    claimed: i64,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    limit_reached: bool,
}

#[derive(QueryableByName)]
struct Sequence {
    #[diesel(sql_type = BigInt)]
    last_event_sequence: i64,
}

impl Draft {
    /// Sent on its own, the statement commits after its row has been sent:
    /// its answer is read to the end (`load`), so that the hold is
    /// acknowledged only once it committed.
    async fn claim_on_postgres(&self, conn: &mut Conn<'_>) -> Result<Claim, Abort> {
        let Conn::Pg(c) = conn else {
            return Err(StoreError::Corrupt("the PostgreSQL hold on SQLite".into()).into());
        };
        let (r, idem, d) = (
            &self.reservation,
            &self.request.idempotency,
            &self.displaced,
        );
        let hold = Prepared(
            sql_query(HOLD_SQL)
                .bind::<Text, _>(&r.asset_id)
                .bind::<Text, _>(&r.reservation_id)
                .bind::<Text, _>(&r.buyer_id)
                .bind::<Timestamptz, _>(r.created_at)
                .bind::<Timestamptz, _>(r.expires_at)
                .bind::<Text, _>(&self.event_id)
                .bind::<Text, _>(&self.answer.body)
                .bind::<Text, _>(&idem.client)
                .bind::<Text, _>(idem.key.as_str())
                .bind::<Text, _>(&idem.fingerprint)
                .bind::<Integer, _>(i32::from(self.answer.status))
                .bind::<Nullable<Text>, _>(self.answer.location.as_deref())
                .bind::<Text, _>(&r.client)
                .bind::<Nullable<BigInt>, _>(self.policy.max_live_holds)
                .bind::<Nullable<Text>, _>(d.as_ref().map(|d| d.reservation_id.as_str()))
                .bind::<Nullable<Text>, _>(d.as_ref().map(|d| d.event_id.as_str()))
                .bind::<Nullable<Text>, _>(d.as_ref().map(|d| d.data.as_str()))
                .bind::<Nullable<BigInt>, _>(r.price.as_ref().map(|p| p.amount))
                .bind::<Nullable<Text>, _>(r.price.as_ref().map(|p| p.currency.as_str()))
                .bind::<Nullable<Text>, _>(self.metadata_json())
                .bind::<Text, _>(self.policy.live_holds_since(r.created_at))
                .bind::<Timestamptz, _>(self.decided),
        );
        let rows = diesel_async::RunQueryDsl::load::<Claimed>(hold, &mut **c)
            .await
            .context("hold the asset")?;
        let row = rows
            .into_iter()
            .next()
            .ok_or_else(|| StoreError::Corrupt("the hold statement answered no row".into()))?;
        Ok(if row.claimed > 0 {
            Claim::Claimed
        } else if row.limit_reached {
            Claim::LimitReached
        } else {
            Claim::Taken
        })
    }

    /// The reservation's metadata as stored.
    fn metadata_json(&self) -> Option<String> {
        let metadata = self.reservation.metadata.as_ref()?;
        serde_json::to_string(metadata).ok()
    }

    /// The same steps as `hold_asset`, on SQLite's one writer: its count is
    /// current, since no other write runs meanwhile.
    async fn claim_on_sqlite(&self, conn: &mut Conn<'_>) -> Result<Claim, Abort> {
        let (r, now) = (&self.reservation, self.reservation.created_at);
        if at_limit(conn, &r.client, &r.buyer_id, now, &self.policy).await? {
            return Ok(Claim::LimitReached);
        }
        if let Some(d) = &self.displaced {
            let expire = sql_query(
                "UPDATE assets SET status = 'AVAILABLE', hold_expires_at = NULL, \
                     current_reservation_id = NULL, version = version + 1, \
                     last_event_sequence = last_event_sequence + 1, updated_at = $1, \
                     available_since = hold_expires_at \
                 WHERE id = $2 AND status = 'HELD' AND current_reservation_id = $3 \
                   AND hold_expires_at <= $4 AND waitlist_length = 0 \
                 RETURNING last_event_sequence",
            )
            .bind::<Instant, _>(now)
            .bind::<Text, _>(&r.asset_id)
            .bind::<Text, _>(&d.reservation_id)
            .bind::<Instant, _>(self.decided);
            let expired: Option<Sequence> = conn
                .optional(expire)
                .await
                .context("displace a lapsed hold")?;
            if let Some(expired) = expired {
                let ended = sql_query(
                    "UPDATE reservations SET status = 'EXPIRED' WHERE id = $1 AND status = 'HELD'",
                )
                .bind::<Text, _>(&d.reservation_id);
                conn.execute(ended).await.context("expire a lapsed hold")?;
                let mut event = NewEvent::new(
                    &r.asset_id,
                    EventType::ReservationExpired,
                    d.data.clone(),
                    now,
                )
                .about(&d.reservation_id);
                event.id = d.event_id.clone();
                event.sequence = expired.last_event_sequence;
                conn.insert_event(&event).await?;
            }
        }
        let claim = sql_query(
            "UPDATE assets SET status = 'HELD', hold_expires_at = $1, current_reservation_id = $2, \
                 version = version + 1, last_event_sequence = last_event_sequence + 1, \
                 updated_at = $3 \
             WHERE id = $4 AND status = 'AVAILABLE' \
               AND price_amount IS $5 AND price_currency IS $6 AND waitlist_length = 0 \
               AND (available_from IS NULL OR available_from <= $7) \
               AND (available_since IS NULL OR available_since <= $7) \
             RETURNING last_event_sequence",
        )
        .bind::<Instant, _>(r.expires_at)
        .bind::<Text, _>(&r.reservation_id)
        .bind::<Instant, _>(now)
        .bind::<Text, _>(&r.asset_id)
        .bind::<Nullable<BigInt>, _>(r.price.as_ref().map(|p| p.amount))
        .bind::<Nullable<Text>, _>(r.price.as_ref().map(|p| p.currency.as_str()))
        .bind::<Instant, _>(self.decided);
        let Some(sequence) = conn
            .optional::<_, Sequence>(claim)
            .await
            .context("hold the asset")?
        else {
            return Err(Abort::Retry);
        };
        // The hold begins here, for a waiting list: SQLite's one writer has
        // waited for its turn by now (on PostgreSQL, `began_at`'s default
        // when `hold_asset` inserts the reservation after its claim).
        let began = conn.now_after_locks().await?;
        let insert = sql_query(
            "INSERT INTO reservations (id, asset_id, buyer_id, status, expires_at, created_at, \
                 client, price_amount, price_currency, metadata, began_at) \
             VALUES ($1, $2, $3, 'HELD', $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind::<Text, _>(&r.reservation_id)
        .bind::<Text, _>(&r.asset_id)
        .bind::<Text, _>(&r.buyer_id)
        .bind::<Instant, _>(r.expires_at)
        .bind::<Instant, _>(now)
        .bind::<Text, _>(&r.client)
        .bind::<Nullable<BigInt>, _>(r.price.as_ref().map(|p| p.amount))
        .bind::<Nullable<Text>, _>(r.price.as_ref().map(|p| p.currency.as_str()))
        .bind::<Nullable<Text>, _>(self.metadata_json())
        .bind::<Instant, _>(began);
        conn.execute(insert)
            .await
            .context("record the reservation")?;
        let mut event = super::about(r, EventType::ReservationHeld, self.answer.body.clone(), now);
        event.id = self.event_id.clone();
        event.sequence = sequence.last_event_sequence;
        conn.insert_event(&event).await?;
        let keep = super::Keep {
            idempotency: &self.request.idempotency,
            answer: &self.answer,
            reservation_id: Some(&r.reservation_id),
        };
        super::store_answer(conn, keep, now).await?;
        Ok(Claim::Claimed)
    }
}

/// The hold's first read of one request: the clock, the asset and the
/// answer stored under the key.
async fn snapshot(store: &Store, req: &HoldRequest) -> StoreResult<Snapshot<Seen>> {
    let input = (
        req.asset_id.to_string(),
        req.idempotency.client.clone(),
        req.idempotency.key.to_string(),
    );
    if let Some(snapshots) = store.hold_snapshots() {
        return seen(snapshots.call(input).await?);
    }
    // Boxed where it runs, as the writes of `hold` are: SQLite's read alone.
    Box::pin(store.run("read the asset to hold", async move |conn| {
        let (asset, client, key) = input;
        let sent = std::time::Instant::now();
        let now = conn.now().await?;
        let read = sql_query(
            "SELECT $1 AS now, a.status, a.hold_expires_at, a.available_from, a.available_since,
           \
                        a.current_reservation_id, a.price_amount, a.price_currency, \
                        a.waitlist_length, \
                        h.client AS holder_client, h.buyer_id AS holder_buyer, \
                        i.fingerprint, i.status_code, i.body, i.location \
                 FROM (SELECT 1) AS one \
                 LEFT JOIN assets a ON a.id = $2 \
                 LEFT JOIN reservations h ON h.id = a.current_reservation_id \
                     AND a.status = 'HELD' \
                 LEFT JOIN idempotency_keys i ON i.client = $3 AND i.key = $4",
        )
        .bind::<Instant, _>(now)
        .bind::<Text, _>(asset)
        .bind::<Text, _>(client)
        .bind::<Text, _>(key);
        let row = conn.first::<_, HoldSnapshotRow>(read).await;
        seen(HoldSnapshotRow {
            sent,
            ..row.context("read the asset to hold")?
        })
    }))
    .await
}

/// A hold's first read on PostgreSQL, for many requests at once: `$1`, `$2`
/// and `$3` are the requests' asset ids, key clients and keys. One row per
/// asset named that exists (with its holder; one row of NULLs when none
/// does), however many requests name it, then one row per key that has an
/// answer stored under it, numbered by `ord` in the order of the keys: in a
/// flash sale, where every request names one asset under a new key, one row
/// answers them all. Both halves are one statement, hence one snapshot and
/// one clock.
///
/// `$1` holds an id per request, not per asset, so that PostgreSQL keeps the
/// statement's general plan: after a statement's first executions it keeps
/// that plan only while the plans made for their values do not look
/// cheaper, and a plan made for the one id of a flash sale looked ten times
/// cheaper than one made for any ten ids. With the ids made distinct,
/// PostgreSQL planned every batch again, which doubled its CPU per
/// rejection (`bench/compare.py`, hot-held: 5.5 → 10.3 µs).
///
/// A plan made for fewer than ten requests still looks cheaper than the
/// general one: a session whose first five batches were that small (the
/// first holds after a start, or after the store remade the session's
/// plans, at light load) plans every batch again. Reading the
/// arrays through subqueries that no plan sees into, as
/// [`super::RESERVATION_SNAPSHOT_BATCH_SQL`] does, would end that, but
/// cost a flash sale's rejections 5 % of their rate (PostgreSQL's CPU per
/// rejection 4.5 → 4.9 µs, `compare.py` both ways round, 2026-12-07), where
/// the batches are large and the general plan is kept anyway.
pub const HOLD_SNAPSHOT_SQL: &str = "\
SELECT statement_timestamp() AS now, NULL::bigint AS ord, a.id,
       a.status, a.hold_expires_at, a.available_from, a.available_since, a.current_reservation_id,
       a.price_amount, a.price_currency, a.waitlist_length, h.client AS holder_client,
       h.buyer_id AS holder_buyer,
       NULL::text AS fingerprint, NULL::integer AS status_code, NULL::text AS body,
       NULL::text AS location
  FROM (SELECT 1) AS one
  LEFT JOIN assets a ON a.id = ANY($1::text[])
  LEFT JOIN reservations h ON h.id = a.current_reservation_id AND a.status = 'HELD'
UNION ALL
SELECT statement_timestamp(), r.ord, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, i.fingerprint, i.status_code, i.body, i.location
  FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS r(client, key, ord)
  JOIN idempotency_keys i ON i.client = r.client AND i.key = r.key";

/// A hold's first read on PostgreSQL for one request (or for retries of one
/// key): the same row as [`HOLD_SNAPSHOT_SQL`]'s. Its parameters are plain
/// values, so that no plan made for one execution looks cheaper than the
/// statement's general plan: PostgreSQL plans it once per session, where
/// the arrays of the batch statement are planned again for their lengths at
/// every execution, which costs more than the reading when there is one
/// request to read for (a replay's retries, a hold that came alone).
pub const HOLD_SNAPSHOT_ONE_SQL: &str = "\
SELECT statement_timestamp() AS now, a.status, a.hold_expires_at, a.available_from, a.available_since,
           a.current_reservation_id,
       a.price_amount, a.price_currency, a.waitlist_length, h.client AS holder_client,
       h.buyer_id AS holder_buyer, i.fingerprint, i.status_code, i.body, i.location
  FROM (SELECT 1) AS one
  LEFT JOIN assets a ON a.id = $1
  LEFT JOIN reservations h ON h.id = a.current_reservation_id AND a.status = 'HELD'
  LEFT JOIN idempotency_keys i ON i.client = $2 AND i.key = $3";

/// Reads the snapshots of a batch of holds in one statement.
pub(crate) async fn read_snapshots(
    db: Sessions,
    inputs: Vec<SnapshotInput>,
) -> StoreResult<Vec<HoldSnapshotRow>> {
    // Identical requests (retries of one key) are read once.
    let mut unique: Vec<&SnapshotInput> = Vec::with_capacity(inputs.len());
    let mut index = std::collections::HashMap::with_capacity(inputs.len());
    let slots: Vec<usize> = inputs
        .iter()
        .map(|input| {
            *index.entry(input).or_insert_with(|| {
                unique.push(input);
                unique.len() - 1
            })
        })
        .collect();
    // One request has a statement of its own (see HOLD_SNAPSHOT_ONE_SQL).
    let rows = if let [(asset, client, key)] = unique.as_slice() {
        let read = sql_query(HOLD_SNAPSHOT_ONE_SQL)
            .bind::<Text, _>(asset.as_str())
            .bind::<Text, _>(client.as_str())
            .bind::<Text, _>(key.as_str());
        let (sent, row) = db
            .run(async |c| {
                let sent = std::time::Instant::now();
                let row: HoldSnapshotRow = diesel_async::RunQueryDsl::get_result(Prepared(read), c)
                    .await
                    .context("read the asset to hold")?;
                Ok((sent, row))
            })
            .await?;
        vec![HoldSnapshotRow { sent, ..row }]
    } else {
        // One id per request, however many name the same asset (see
        // HOLD_SNAPSHOT_SQL).
        let assets: Vec<&str> = unique.iter().map(|(a, _, _)| a.as_str()).collect();
        let clients: Vec<&str> = unique.iter().map(|(_, c, _)| c.as_str()).collect();
        let keys: Vec<&str> = unique.iter().map(|(_, _, k)| k.as_str()).collect();
        let read = sql_query(HOLD_SNAPSHOT_SQL)
            .bind::<Array<Text>, _>(assets)
            .bind::<Array<Text>, _>(clients)
            .bind::<Array<Text>, _>(keys);
        let (sent, rows) = db
            .run(async |c| {
                let sent = std::time::Instant::now();
                let rows: Vec<HoldBatchRow> = diesel_async::RunQueryDsl::load(Prepared(read), c)
                    .await
                    .context("read the asset to hold")?;
                Ok((sent, rows))
            })
            .await?;
        assemble(&unique, rows, sent)?
    };
    if rows.len() == slots.len() {
        // Every request was its own: the rows are the answers, in order.
        return Ok(rows);
    }
    Ok(slots.into_iter().map(|slot| rows[slot].clone()).collect())
}

/// Each request's snapshot from the batch statement's rows: the asset it
/// names (none when the statement found none by that id) and the answer
/// stored under its key, with the statement's one clock and the moment it
/// was `sent`.
fn assemble(
    unique: &[&SnapshotInput],
    rows: Vec<HoldBatchRow>,
    sent: std::time::Instant,
) -> StoreResult<Vec<HoldSnapshotRow>> {
    let now = rows
        .first()
        .map(|row| row.now)
        .ok_or_else(|| StoreError::Corrupt("the holds' first read returned no row".into()))?;
    let mut assets: Vec<(String, SnapshotAsset)> = Vec::new();
    let mut stored: Vec<MaybeStoredRow> = vec![MaybeStoredRow::default(); unique.len()];
    for row in rows {
        match (row.ord, row.id) {
            (Some(ord), _) => {
                let slot = usize::try_from(ord - 1)
                    .ok()
                    .and_then(|at| stored.get_mut(at))
                    .ok_or_else(|| {
                        StoreError::Corrupt(format!(
                            "a stored answer for key {ord} of {}",
                            unique.len()
                        ))
                    })?;
                *slot = row.stored;
            }
            (None, Some(id)) => assets.push((id, row.asset)),
            (None, None) => {}
        }
    }
    // Found by id for each request: a batch of holds spread over many
    // assets names as many as it has requests.
    assets.sort_unstable_by(|(a, _), (b, _)| a.cmp(b));
    Ok(unique
        .iter()
        .zip(stored)
        .map(|((asset, _, _), stored)| HoldSnapshotRow {
            key: KeySnapshotRow { now, stored },
            asset: assets
                .binary_search_by(|(id, _)| id.as_str().cmp(asset))
                .map(|at| assets[at].1.clone())
                .unwrap_or_default(),
            sent,
        })
        .collect())
}

/// What a hold's first read saw of the asset.
fn seen(row: HoldSnapshotRow) -> StoreResult<Snapshot<Seen>> {
    let asset = row.asset;
    let seen = match asset.status {
        Some(s) => Some(Seen {
            target: HoldTarget {
                status: parse_status(AssetStatus::parse, &s)?,
                hold_expires_at: asset.hold_expires_at,
                available_from: asset.available_from,
                available_since: asset.available_since,
            },
            sent: row.sent,
            holding: asset.current_reservation_id,
            holder: asset.holder_client.zip(asset.holder_buyer),
            price: crate::store::rows::price_of(asset.price_amount, asset.price_currency),
            waitlist_length: i64::from(asset.waitlist_length.unwrap_or_default()),
        }),
        None => None,
    };
    Ok(row.key.with_row(seen))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asset_row(now: Timestamp, id: &str, status: &str) -> HoldBatchRow {
        HoldBatchRow {
            now,
            ord: None,
            id: Some(id.into()),
            asset: SnapshotAsset {
                status: Some(status.into()),
                ..SnapshotAsset::default()
            },
            stored: MaybeStoredRow::default(),
        }
    }

    fn key_row(now: Timestamp, ord: i64, fingerprint: &str) -> HoldBatchRow {
        HoldBatchRow {
            now,
            ord: Some(ord),
            id: None,
            asset: SnapshotAsset::default(),
            stored: MaybeStoredRow {
                fingerprint: Some(fingerprint.into()),
                ..MaybeStoredRow::default()
            },
        }
    }

    fn input(asset: &str, key: &str) -> SnapshotInput {
        (asset.into(), "shop".into(), key.into())
    }

    #[test]
    fn each_request_gets_its_own_asset_and_its_own_stored_answer() {
        let now = chrono::Utc::now();
        let inputs = [
            input("A", "k1"),
            input("B", "k2"),
            input("A", "k3"),
            input("GONE", "k4"),
        ];
        let unique: Vec<&SnapshotInput> = inputs.iter().collect();
        let rows = vec![
            asset_row(now, "B", "SOLD"),
            asset_row(now, "A", "HELD"),
            key_row(now, 3, "third"),
            key_row(now, 2, "second"),
        ];
        let read = assemble(&unique, rows, std::time::Instant::now()).expect("assembled");
        let seen: Vec<(Option<&str>, Option<&str>)> = read
            .iter()
            .map(|row| {
                assert_eq!(row.key.now, now);
                (
                    row.asset.status.as_deref(),
                    row.key.stored.fingerprint.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                (Some("HELD"), None),
                (Some("SOLD"), Some("second")),
                (Some("HELD"), Some("third")),
                (None, None),
            ]
        );
    }

    #[test]
    fn a_batch_read_that_names_no_request_is_corrupt() {
        let now = chrono::Utc::now();
        let inputs = [input("A", "k1"), input("A", "k2")];
        let unique: Vec<&SnapshotInput> = inputs.iter().collect();
        for ord in [0, 3] {
            let rows = vec![asset_row(now, "A", "HELD"), key_row(now, ord, "x")];
            assert!(matches!(
                assemble(&unique, rows, std::time::Instant::now()),
                Err(StoreError::Corrupt(_))
            ));
        }
        assert!(matches!(
            assemble(&unique, Vec::new(), std::time::Instant::now()),
            Err(StoreError::Corrupt(_))
        ));
    }
}
