//! The transitions, one module each, and what they share: the first read
//! of a keyed request ([`Target`]), the answer of a key already used, and
//! what every change writes after itself in its transaction (its events,
//! numbered per asset, and the answer stored under its key).
//!
//! Every transition follows one shape. It reads what its decision needs in
//! one snapshot (the database clock included); decides with the domain
//! rules; and, when something is to change, makes one conditional write
//! guarded by the state the decision saw, whose answer is built from that
//! snapshot. A write that finds the state moved changes nothing and the
//! transition reads and decides again, so every answer agrees with one
//! order of the requests.

pub(crate) mod assets;
pub(crate) mod catalogue;
pub(crate) mod commit;
pub(crate) mod end_hold;
pub(crate) mod expire;
pub(crate) mod extend;
pub(crate) mod given;
pub(crate) mod hold;
pub(crate) mod import;
pub(crate) mod offer;
pub(crate) mod refund;
pub(crate) mod release;
pub(crate) mod void;
pub(crate) mod waitlist;

use std::sync::LazyLock;

use diesel::sql_query;
use diesel::sql_types::{Array, Integer, Nullable, Text};

use super::api::{Client, Idempotency, Keyed, Rendered};
use super::conn::Conn;
use super::conn::{Bind, Sql};
use super::db::Store;
use super::error::Context;
use super::error::{StoreError, StoreResult};
use super::postgres::{Prepared, Sessions};
use super::rows::{NewEvent, ReservationBatchRow, ReservationInput, ReservationSnapshotRow};
pub(crate) use super::rows::{Snapshot, StoredAnswer};
use super::schema::Instant;
use crate::domain::{EventType, PaymentFate, Reservation, ReservationId, Timestamp};

/// The clock `now` and the answer kept under `idempotency`, if any, read
/// on `conn`: the first read of a request that reads nothing else with it.
pub(crate) async fn read_key(
    conn: &mut Conn<'_>,
    idempotency: &Idempotency,
    now: crate::domain::Timestamp,
) -> StoreResult<super::rows::KeySnapshotRow> {
    let read = sql_query(
        "SELECT $1 AS now, i.fingerprint, i.status_code, i.body, i.location \
         FROM (SELECT 1) AS one \
         LEFT JOIN idempotency_keys i ON i.client = $2 AND i.key = $3",
    )
    .bind::<super::schema::Instant, _>(now)
    .bind::<Text, _>(idempotency.client.clone())
    .bind::<Text, _>(idempotency.key.to_string());
    conn.first(read).await.context("read the idempotency key")
}

/// How often a request reads again after losing a race before giving up
/// with 503.
pub(crate) const MAX_ATTEMPTS: usize = 8;

/// What a request gets when its key already has an answer: that answer
/// again, or KEY_REUSED when the key was used for another request.
pub(crate) fn answered<T>(stored: StoredAnswer, idempotency: &Idempotency) -> Keyed<T> {
    if stored.fingerprint == idempotency.fingerprint {
        Keyed::Replayed(stored.answer)
    } else {
        Keyed::KeyReused
    }
}

/// A request's arrival on the database's clock: `now`, read by a statement
/// sent at `sent`, less the time from `arrived` to `sent`, both on this
/// instance's monotonic clock (its wall clock plays no part). Never after
/// `now`, and never before the arrival.
pub(crate) fn arrival(
    now: Timestamp,
    sent: std::time::Instant,
    arrived: std::time::Instant,
) -> Timestamp {
    let waited = sent.saturating_duration_since(arrived);
    chrono::Duration::from_std(waited)
        .ok()
        .and_then(|waited| now.checked_sub_signed(waited))
        .unwrap_or(now)
}

/// Before an answer that wrote nothing: waits for the earlier attempts of
/// this request still running here, for at most half the call's time (which
/// leaves it the other half); false when one still runs then.
pub(crate) async fn after_earlier(store: &Store, idempotency: &Idempotency) -> bool {
    match &idempotency.running {
        Some(mark) if mark.behind() => {
            Box::pin(mark.after_earlier(store.settings().call_timeout / 2)).await
        }
        _ => true,
    }
}

/// The 503 of a request whose row kept changing under it.
pub(crate) fn contention(context: &'static str) -> StoreError {
    StoreError::unavailable(context, "the row kept changing under concurrent requests")
}

/// The reservation a keyed request is about, and what its first read
/// takes along.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// What the request does, for its 503 when the row keeps changing.
    context: &'static str,
    id: ReservationId,
    idempotency: Idempotency,
    /// The caller, when only its own reservations exist for it.
    client: Option<Client>,
    /// The payment a commit carries (its client and reference), whose fate
    /// is read with the reservation.
    payment: Option<(String, String)>,
}

impl Target {
    pub(crate) fn new(
        context: &'static str,
        id: &ReservationId,
        idempotency: &Idempotency,
    ) -> Self {
        Self {
            context,
            id: *id,
            idempotency: idempotency.clone(),
            client: None,
            payment: None,
        }
    }

    /// Only a reservation this caller sees exists for it.
    pub(crate) fn seen_by(self, client: &Client) -> Self {
        Self {
            client: Some(client.clone()),
            ..self
        }
    }

    /// The fate of this payment (of this payments client) is read with the
    /// reservation.
    pub(crate) fn paying(self, client: &str, reference: &str) -> Self {
        Self {
            payment: Some((client.to_owned(), reference.to_owned())),
            ..self
        }
    }

    /// Runs the keyed request. Its snapshot answers a stored answer's
    /// replay, a reused key, or a reservation the caller cannot see at once;
    /// else `act` decides on the reservation (with its refunds, by its
    /// effective status at the snapshot's clock, with the fate of the
    /// target's payment) and answers from it. While `act` answers `None`
    /// (its write found the state moved), the reservation is read again and
    /// decided again.
    ///
    /// An answer that wrote nothing is given only from a snapshot taken
    /// after the earlier attempts of this request running on this instance
    /// ended (or `InUse` when one outlasts [`after_earlier`]), and after the
    /// writes then in flight on the asset ended. An earlier attempt (a
    /// client that gave up on it, a retry sent to another instance) may be
    /// one of them: its answer is then replayed, instead of a refusal
    /// decided on a read it had not reached.
    pub(crate) async fn act<T, A>(self, store: &Store, mut act: A) -> StoreResult<Keyed<T>>
    where
        A: AsyncFnMut(Reservation, Timestamp, Option<PaymentFate>) -> StoreResult<Option<T>>,
    {
        let mut settled = false;
        for _ in 0..MAX_ATTEMPTS {
            let snap = self.snapshot(store).await?;
            if let Some(stored) = snap.stored {
                return Ok(answered(stored, &self.idempotency));
            }
            let seen = snap
                .row
                .filter(|r| self.client.as_ref().is_none_or(|c| c.sees(&r.client)));
            let Some(reservation) = seen else {
                return Ok(Keyed::NotFound);
            };
            let asset = reservation.asset_id.clone();
            let wrote_before = super::outcome::wrote();
            if let Some(outcome) = act(reservation, snap.now, snap.fate).await? {
                if settled || wrote_before || super::outcome::wrote() {
                    return Ok(Keyed::Done(outcome));
                }
                if !after_earlier(store, &self.idempotency).await {
                    return Ok(Keyed::InUse);
                }
                store.after_writes_on(&asset).await?;
                settled = true;
            }
        }
        Err(contention(self.context))
    }

    /// The first read: clock, reservation with its refunds (a row each),
    /// stored answer and payment fate, in one statement; on PostgreSQL, one
    /// statement for every request about a reservation that came meanwhile
    /// ([`read_snapshots`]). Sales recorded before payments had clients
    /// (client `''`) count for every client.
    async fn snapshot(&self, store: &Store) -> StoreResult<Snapshot<Reservation>> {
        let input = ReservationInput {
            id: self.id.to_string(),
            key_client: self.idempotency.client.clone(),
            key: self.idempotency.key.to_string(),
            payment: self.payment.clone(),
        };
        if let Some(snapshots) = store.reservation_snapshots() {
            return ReservationSnapshotRow::into_snapshot(snapshots.call(input).await?);
        }
        let lite = &*RESERVATION_SNAPSHOT_LITE;
        let rows = store
            .run("read the reservation", async move |conn| {
                let now = conn.now().await?;
                let (client, reference) = input.payment();
                let query = sql_query(lite.as_str())
                    .bind::<super::schema::Instant, _>(now)
                    .bind::<Text, _>(&input.id)
                    .bind::<Text, _>(&input.key_client)
                    .bind::<Text, _>(&input.key)
                    .bind::<Nullable<Text>, _>(client)
                    .bind::<Nullable<Text>, _>(reference);
                let rows = conn.load::<_, ReservationSnapshotRow>(query).await;
                rows.context("read the reservation")
            })
            .await?;
        ReservationSnapshotRow::into_snapshot(rows)
    }
}

impl ReservationInput {
    /// The payment's client and reference, each `None` without a payment.
    fn payment(&self) -> (Option<&str>, Option<&str>) {
        let payment = self.payment.as_ref();
        payment.map(|(c, r)| (c.as_str(), r.as_str())).unzip()
    }
}

/// The first reads of requests about reservations on PostgreSQL: the rows
/// of each request's snapshot, in the order of `inputs`. A request alone
/// is read by [`RESERVATION_SNAPSHOT_SQL`], whose plain parameters
/// PostgreSQL plans once per session; more, by
/// [`RESERVATION_SNAPSHOT_BATCH_SQL`] in one statement, hence one snapshot
/// and one clock for all of them.
pub(crate) async fn read_snapshots(
    db: Sessions,
    inputs: Vec<ReservationInput>,
) -> StoreResult<Vec<Vec<ReservationSnapshotRow>>> {
    if let [input] = inputs.as_slice() {
        let (client, reference) = input.payment();
        let read = Prepared(
            sql_query(RESERVATION_SNAPSHOT_SQL.as_str())
                .bind::<Text, _>(&input.id)
                .bind::<Text, _>(&input.key_client)
                .bind::<Text, _>(&input.key)
                .bind::<Nullable<Text>, _>(client)
                .bind::<Nullable<Text>, _>(reference),
        );
        let rows = db
            .run(async |c| {
                let rows = diesel_async::RunQueryDsl::load::<ReservationSnapshotRow>(read, c).await;
                rows.context("read the reservation")
            })
            .await?;
        return Ok(vec![rows]);
    }
    let ids: Vec<&str> = inputs.iter().map(|i| i.id.as_str()).collect();
    let key_clients: Vec<&str> = inputs.iter().map(|i| i.key_client.as_str()).collect();
    let keys: Vec<&str> = inputs.iter().map(|i| i.key.as_str()).collect();
    let (clients, references): (Vec<_>, Vec<_>) = inputs.iter().map(|i| i.payment()).unzip();
    let read = Prepared(
        sql_query(RESERVATION_SNAPSHOT_BATCH_SQL.as_str())
            .bind::<Array<Text>, _>(ids)
            .bind::<Array<Text>, _>(key_clients)
            .bind::<Array<Text>, _>(keys)
            .bind::<Array<Nullable<Text>>, _>(clients)
            .bind::<Array<Nullable<Text>>, _>(references),
    );
    let rows = db
        .run(async |c| {
            let rows = diesel_async::RunQueryDsl::load::<ReservationBatchRow>(read, c).await;
            rows.context("read the reservation")
        })
        .await?;
    let mut snapshots: Vec<Vec<ReservationSnapshotRow>> =
        inputs.iter().map(|_| Vec::new()).collect();
    for row in rows {
        let slot = usize::try_from(row.ord - 1)
            .ok()
            .and_then(|at| snapshots.get_mut(at))
            .ok_or_else(|| {
                let n = inputs.len();
                StoreError::Corrupt(format!(
                    "a reservation's read for request {} of {n}",
                    row.ord
                ))
            })?;
        slot.push(row.row);
    }
    Ok(snapshots)
}

/// The columns of a reservation's first read after its clock: the
/// reservation, the answer stored under the key, the payment's fate, and
/// one of the reservation's refunds (a row each).
const SNAPSHOT_COLUMNS: &str = " r.id, r.asset_id, r.buyer_id, r.status, r.expires_at,
       r.created_at, r.committed_at, r.released_at, r.payment_reference, r.client,
       r.voided_at, r.payment_client, r.price_amount, r.price_currency, r.metadata, r.via, i.fingerprint, i.status_code, i.body, i.location,
       p.reservation_id AS fate_reservation_id, p.refund_id AS fate_refund_id,
       f.id AS refund_id, f.reservation_id AS refund_reservation_id,
       f.asset_id AS refund_asset_id, f.payment_reference AS refund_payment_reference,
       f.reason AS refund_reason, f.status AS refund_status,
       f.created_at AS refund_created_at, f.completed_at AS refund_completed_at,
       f.payment_client AS refund_payment_client";

/// A reservation's first read after its clock, both dialects: parameters
/// are numbered in the order they first appear (PostgreSQL reads `$n` as
/// positions, SQLite as names numbered by first appearance, so SQLite's
/// clock, `$0`, comes first).
const SNAPSHOT_FROM: &str = "
  FROM (SELECT 1) AS one
  LEFT JOIN reservations r ON r.id = $1
  LEFT JOIN idempotency_keys i ON i.client = $2 AND i.key = $3
  LEFT JOIN (SELECT reservation_id, refund_id FROM payments
              WHERE client IN ($4, '') AND reference = $5
              ORDER BY client DESC LIMIT 1) AS p ON true
  LEFT JOIN refunds f ON f.reservation_id = r.id
 ORDER BY f.created_at, f.id";

static RESERVATION_SNAPSHOT_SQL: LazyLock<String> =
    LazyLock::new(|| format!("SELECT now() AS now,{SNAPSHOT_COLUMNS}{SNAPSHOT_FROM}"));
static RESERVATION_SNAPSHOT_LITE: LazyLock<String> =
    LazyLock::new(|| format!("SELECT $0 AS now,{SNAPSHOT_COLUMNS}{SNAPSHOT_FROM}"));

/// The first reads of many requests about reservations on PostgreSQL, the
/// same rows as [`RESERVATION_SNAPSHOT_SQL`]'s for each, numbered by `ord` in the order
/// of the requests: `$1` to `$5` are arrays of their reservation ids, key
/// clients, keys, payment clients and payment references (NULL without a
/// payment), each read through a subquery that no plan sees into, so that
/// PostgreSQL keeps the statement's general plan: after a prepared
/// statement's first five executions, it keeps that plan only while the
/// plans made for their values do not look cheaper, and a plan made for an
/// array it can see looks cheaper whenever the array is shorter than the
/// ten rows the general plan assumes. Commits come a few at a time: a
/// session whose first batches were small would plan every batch again for
/// as long as it lived, which costs the database more than the reading.
pub static RESERVATION_SNAPSHOT_BATCH_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT statement_timestamp() AS now, q.ord,{SNAPSHOT_COLUMNS}
  FROM unnest((SELECT $1::text[]), (SELECT $2::text[]), (SELECT $3::text[]),
              (SELECT $4::text[]), (SELECT $5::text[]))
       WITH ORDINALITY AS q(id, key_client, key, payment_client, reference, ord)
  LEFT JOIN reservations r ON r.id = q.id
  LEFT JOIN idempotency_keys i ON i.client = q.key_client AND i.key = q.key
  LEFT JOIN LATERAL (SELECT reservation_id, refund_id FROM payments
              WHERE client IN (q.payment_client, '') AND reference = q.reference
              ORDER BY client DESC LIMIT 1) AS p ON true
  LEFT JOIN refunds f ON f.reservation_id = r.id
 ORDER BY q.ord, f.created_at, f.id"
    )
});

/// An event about `reservation`, whose data is the reservation as its
/// answer shows it.
pub(crate) fn about(
    reservation: &Reservation,
    event_type: EventType,
    data: String,
    now: Timestamp,
) -> NewEvent {
    NewEvent::new(&reservation.asset_id, event_type, data, now).about(&reservation.reservation_id)
}

/// The answer stored under a key: what a change writes with itself.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keep<'a> {
    pub idempotency: &'a Idempotency,
    pub answer: &'a Rendered,
    /// The reservation the answer is about, if one.
    pub reservation_id: Option<&'a str>,
}

/// Writes what goes with a change in its transaction: its events, numbered
/// from `first` (the number the change's own update of the asset took,
/// when it took one) and then the asset's next ones, and the answer kept
/// under the request's key.
pub(crate) async fn write_after(
    conn: &mut Conn<'_>,
    asset: &str,
    first: Option<i64>,
    mut events: Vec<NewEvent>,
    keep: Option<Keep<'_>>,
    now: Timestamp,
) -> StoreResult<()> {
    let extra = events.len() as i64 - i64::from(first.is_some());
    let mut next = if extra > 0 {
        take_sequences(conn, asset, extra).await? - extra + 1
    } else {
        0
    };
    let mut taken = first;
    for event in &mut events {
        event.sequence = taken.take().unwrap_or_else(|| {
            next += 1;
            next - 1
        });
        conn.insert_event(event).await?;
    }
    if let Some(keep) = keep {
        store_answer(conn, keep, now).await?;
    }
    Ok(())
}

/// Takes the next `n` event numbers of an asset (locking its row); the
/// last of them.
async fn take_sequences(conn: &mut Conn<'_>, asset: &str, n: i64) -> StoreResult<i64> {
    #[derive(diesel::QueryableByName)]
    struct Last {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        last_event_sequence: i64,
    }
    let mut take = Sql::new("UPDATE assets SET last_event_sequence = last_event_sequence + ");
    take.bind(Bind::BigInt(n))
        .push(" WHERE id = ")
        .bind(Bind::Text(asset.to_owned()))
        .push(" RETURNING last_event_sequence");
    let last = conn
        .load_sql::<Last>(&take)
        .await
        .context("number an event")?
        .into_iter()
        .next()
        .ok_or_else(|| StoreError::Corrupt(format!("asset {asset} went missing")))?;
    Ok(last.last_event_sequence)
}

/// Writes the answer kept under the request's key; a unique violation when
/// a concurrent duplicate kept one first.
pub(crate) async fn store_answer(
    conn: &mut Conn<'_>,
    keep: Keep<'_>,
    now: Timestamp,
) -> StoreResult<()> {
    let Keep {
        idempotency,
        answer,
        reservation_id,
    } = keep;
    let insert = sql_query(
        "INSERT INTO idempotency_keys \
             (client, key, fingerprint, status_code, body, location, reservation_id, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind::<Text, _>(&idempotency.client)
    .bind::<Text, _>(idempotency.key.as_str())
    .bind::<Text, _>(&idempotency.fingerprint)
    .bind::<Integer, _>(i32::from(answer.status))
    .bind::<Text, _>(&answer.body)
    .bind::<Nullable<Text>, _>(answer.location.as_deref())
    .bind::<Nullable<Text>, _>(reservation_id)
    .bind::<Instant, _>(now);
    conn.execute(insert).await.context("store the answer")?;
    Ok(())
}
