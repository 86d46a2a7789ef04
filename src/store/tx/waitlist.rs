//! Waiting lists: buyers queue for an asset held by someone else, and
//! while an asset has waiters nobody jumps the queue. Whenever its hold ends
//! without a sale (it lapses, found by the janitor or by the next write, or
//! it is released), the same transaction hands the asset to the first
//! waiter instead ([`hand_off`]); a sale or a withdrawal clears the queue
//! ([`clear`]).
//!
//! Each asset counts its waiters (`waitlist_length`) and numbers them in
//! the order they joined (`waitlist_seq`, never reused); a waiter's
//! position is its rank in that order, so positions stay dense and only
//! ever decrease. Joining and every hand-off change the asset's row, which
//! serialises them with every other change of the asset.

use chrono::Duration;
use diesel::sql_types::{BigInt, Text};
use diesel::QueryableByName;

use super::given::{asset_snapshot, give, Claim};
use super::hold::at_limit;
use super::{answered, contention, write_after, Keep, MAX_ATTEMPTS};
use crate::domain::{
    AssetStatus, BuyerId, ClearedEntry, EventType, Reservation, Timestamp, Via, WaitlistCleared,
    WaitlistEntry, WaitlistSkipped,
};
use crate::store::api::{Answer, Client, Idempotency, JoinOutcome, JoinRequest, Keyed, Policy};
use crate::store::conn::{Bind, Conn, Sql};
use crate::store::db::Store;
use crate::store::error::{Abort, Context, StoreError, StoreResult};
use crate::store::rows::NewEvent;
use crate::store::schema::Instant;

/// A waiter as stored, with its position.
#[derive(QueryableByName)]
struct EntryRow {
    #[diesel(sql_type = Text)]
    client: String,
    #[diesel(sql_type = Text)]
    buyer_id: String,
    #[diesel(sql_type = Instant)]
    joined_at: Timestamp,
    #[diesel(sql_type = BigInt)]
    position: i64,
}

impl EntryRow {
    fn into_entry(self, asset_id: &str) -> WaitlistEntry {
        WaitlistEntry {
            asset_id: asset_id.to_owned(),
            buyer_id: self.buyer_id,
            position: self.position,
            joined_at: self.joined_at,
            client: self.client,
        }
    }
}

/// The waiters of `asset` in queue order, with their positions; only
/// `client`'s when given (positions still count everyone before them).
async fn entries(
    conn: &mut Conn<'_>,
    asset: &str,
    client: Option<&str>,
) -> StoreResult<Vec<WaitlistEntry>> {
    let mut read = Sql::new(
        "SELECT client, buyer_id, joined_at, position FROM ( \
           SELECT client, buyer_id, seq, joined_at, \
                  row_number() OVER (ORDER BY seq) AS position \
             FROM waitlist WHERE asset_id = ",
    );
    read.bind(Bind::Text(asset.to_owned())).push(") q");
    if let Some(client) = client {
        read.push(" WHERE client = ")
            .bind(Bind::Text(client.to_owned()));
    }
    read.push(" ORDER BY position");
    let rows = conn
        .load_sql::<EntryRow>(&read)
        .await
        .context("read the waiting list")?;
    Ok(rows.into_iter().map(|r| r.into_entry(asset)).collect())
}

/// The entry of `buyer` of `client` in `asset`'s queue, with its position:
/// read by its key, however long the queue.
async fn entry_of(
    conn: &mut Conn<'_>,
    asset: &str,
    client: &str,
    buyer: &str,
) -> StoreResult<Option<WaitlistEntry>> {
    let read = Sql::new(
        "SELECT w.client, w.buyer_id, w.joined_at, \
                (SELECT count(*) FROM waitlist q \
                  WHERE q.asset_id = w.asset_id AND q.seq <= w.seq) AS position \
           FROM waitlist w WHERE w.asset_id = $1 AND w.client = $2 AND w.buyer_id = $3",
    )
    .with(Bind::Text(asset.to_owned()))
    .with(Bind::Text(client.to_owned()))
    .with(Bind::Text(buyer.to_owned()));
    let rows = conn
        .load_sql::<EntryRow>(&read)
        .await
        .context("read the buyer's place in the queue")?;
    Ok(rows.into_iter().next().map(|r| r.into_entry(asset)))
}

/// The waiting list of an asset, as `client` sees it (a storefront its own
/// entries, everyone else all); `None` when the asset does not exist.
pub(crate) async fn list(
    store: &Store,
    asset: &str,
    client: &Client,
) -> StoreResult<Option<Vec<WaitlistEntry>>> {
    let (asset, client) = (asset.to_owned(), client.clone());
    store
        .run("read the waiting list", async move |conn| {
            if crate::store::read::stored_asset(conn, &asset)
                .await?
                .is_none()
            {
                return Ok(None);
            }
            entries(conn, &asset, client.own_filter()).await.map(Some)
        })
        .await
}

/// What leaving a waiting list did.
#[derive(Debug, PartialEq, Eq)]
pub enum LeaveOutcome {
    Left,
    /// This buyer of this client was not waiting.
    NotQueued,
    NoAsset,
}

/// Takes a buyer of `client` off an asset's waiting list; those after it
/// move up by one.
pub(crate) async fn leave(
    store: &Store,
    asset: &str,
    client: &str,
    buyer: &BuyerId,
) -> StoreResult<LeaveOutcome> {
    let (asset, client, buyer) = (asset.to_owned(), client.to_owned(), buyer.to_string());
    let max = store.policy().waitlist_max;
    let left = store
        .write("leave the waiting list", async move |conn| {
            // The asset first, as every change of it: `shorten` then takes
            // its stamp once no other change of the queue can move.
            conn.lock_asset(&asset).await?;
            let mut delete = Sql::new("DELETE FROM waitlist WHERE asset_id = ");
            delete
                .bind(Bind::Text(asset.clone()))
                .push(" AND client = ")
                .bind(Bind::Text(client))
                .push(" AND buyer_id = ")
                .bind(Bind::Text(buyer));
            if conn
                .execute_sql(&delete)
                .await
                .context("leave the waiting list")?
                == 0
            {
                let exists = crate::store::read::stored_asset(conn, &asset).await?;
                return Ok(match exists {
                    Some(_) => LeaveOutcome::NotQueued,
                    None => LeaveOutcome::NoAsset,
                });
            }
            shorten(conn, &asset, max).await?;
            Ok(LeaveOutcome::Left)
        })
        .await?;
    left.ok_or_else(|| contention("leave the waiting list"))
}

/// Counts out one waiter of `asset`, whose row this transaction has locked
/// (a leave, or the head of the queue handed the asset). Leaving a full
/// queue is stamped (`waitlist_full_at`): a join that arrived before it may
/// have been refused as full by a later attempt, and is refused again. The
/// stamp is taken once no other change of the queue can move before this
/// one commits.
async fn shorten(conn: &mut Conn<'_>, asset: &str, max: i64) -> StoreResult<()> {
    let now = conn.now_after_locks().await?;
    let mut shorter = Sql::new(
        "UPDATE assets SET waitlist_length = waitlist_length - 1, \
         waitlist_full_at = CASE WHEN waitlist_length >= ",
    );
    shorter
        .bind(Bind::BigInt(max))
        .push(" THEN ")
        .bind(Bind::At(now))
        .push(" ELSE waitlist_full_at END WHERE id = ")
        .bind(Bind::Text(asset.to_owned()));
    conn.execute_sql(&shorter)
        .await
        .context("count out a waiter")?;
    Ok(())
}

/// Queues a buyer of `client` for an asset held by someone else.
pub(crate) async fn join(store: &Store, req: &JoinRequest) -> StoreResult<Keyed<JoinOutcome>> {
    let max = store.policy().waitlist_max;
    for _ in 0..MAX_ATTEMPTS {
        let context = "read the waiting list";
        let asset = req.asset_id.as_str();
        let snap = asset_snapshot(store, context, asset, &req.idempotency, req.arrived).await?;
        if let Some(stored) = snap.stored {
            return Ok(answered(stored, &req.idempotency));
        }
        let Some(seen) = snap.row else {
            return Ok(Keyed::NotFound);
        };
        let mine = (req.client.as_str(), req.buyer_id.as_str());
        let written = if seen
            .holder
            .as_ref()
            .is_some_and(|(c, b)| (c.as_str(), b.as_str()) == mine)
        {
            return Ok(Keyed::Done(JoinOutcome::NotOpen(AssetStatus::Held)));
        } else if seen.status != AssetStatus::Held {
            return Ok(Keyed::Done(JoinOutcome::NotOpen(seen.status)));
        } else {
            match seen.holding {
                // The hold began after the request arrived: as the asset
                // stood then, it had no hold to queue for (a later attempt
                // of the same request may have been refused on that).
                Some((_, since)) if since > seen.decided => {
                    return Ok(Keyed::Done(JoinOutcome::NotOpen(AssetStatus::Available)));
                }
                holding => {
                    // Room now, and none lost since the arrival: a queue
                    // left by a waiter while full may have been full then.
                    let room = seen.waitlist_length < max
                        && seen.waitlist_full_at.is_none_or(|at| at <= seen.decided);
                    let since = Since {
                        holding: holding.map(|(id, _)| id),
                        decided: seen.decided,
                    };
                    keep_entry(store, req, room, since).await?
                }
            }
        };
        match written {
            Some(Ok(outcome)) => return Ok(Keyed::Done(outcome)),
            Some(Err(Full)) => return Ok(Keyed::Done(JoinOutcome::Full { max })),
            // The asset moved, or the key or the entry was taken
            // concurrently: read again.
            None => continue,
        }
    }
    Err(contention("join the waiting list"))
}

/// The queue is full.
struct Full;

/// What a join's write checks is unchanged since its read: the asset's
/// hold, and that no waiter left the queue full after the arrival.
struct Since {
    holding: Option<String>,
    decided: Timestamp,
}

/// The buyer's entry: the one it has (200), or a new one at the end of the
/// queue when there is room (201), the hold still live at the write's clock
/// and nothing in `since` moved; either way kept under the request's key.
async fn keep_entry(
    store: &Store,
    req: &JoinRequest,
    room: bool,
    since: Since,
) -> StoreResult<Option<Result<JoinOutcome, Full>>> {
    let (store_, req) = (store.clone(), req.clone());
    store
        .write("join the waiting list", async move |conn| {
            // The write's own clock, not the read's: the write may have
            // waited for its connection past the hold's lapse.
            let now = conn.now_after_locks().await?;
            let asset = req.asset_id.as_str();
            let mine = entry_of(conn, asset, &req.client, req.buyer_id.as_str()).await?;
            if let Some(entry) = mine {
                keep(conn, &store_, &req.idempotency, &entry, false, now).await?;
                return Ok(Ok(JoinOutcome::Already(entry)));
            }
            if !room {
                return Ok(Err(Full));
            }
            #[derive(QueryableByName)]
            struct Place {
                #[diesel(sql_type = BigInt)]
                waitlist_seq: i64,
                #[diesel(sql_type = diesel::sql_types::Integer)]
                waitlist_length: i32,
            }
            // Still held by someone else (a lapsed hold counts while others
            // wait: the asset is theirs next), and still room.
            let mut longer = Sql::new(
                "UPDATE assets SET waitlist_length = waitlist_length + 1, \
                     waitlist_seq = waitlist_seq + 1 WHERE id = ",
            );
            longer
                .bind(Bind::Text(asset.to_owned()))
                .push(" AND status = 'HELD' AND (hold_expires_at > ")
                .bind(Bind::At(now))
                .push(" OR waitlist_length > 0) AND waitlist_length < ")
                .bind(Bind::BigInt(store_.policy().waitlist_max));
            longer
                .push(" AND (waitlist_full_at IS NULL OR waitlist_full_at <= ")
                .bind(Bind::At(since.decided))
                .push(")");
            if let Some(holding) = since.holding {
                longer
                    .push(" AND current_reservation_id = ")
                    .bind(Bind::Text(holding));
            }
            longer.push(" RETURNING waitlist_seq, waitlist_length");
            let Some(place) = conn
                .load_sql::<Place>(&longer)
                .await
                .context("join the waiting list")?
                .into_iter()
                .next()
            else {
                return Err(Abort::Retry);
            };
            let mut insert = Sql::new(
                "INSERT INTO waitlist (asset_id, client, buyer_id, seq, joined_at) VALUES (",
            );
            insert
                .bind(Bind::Text(asset.to_owned()))
                .push(", ")
                .bind(Bind::Text(req.client.clone()))
                .push(", ")
                .bind(Bind::Text(req.buyer_id.to_string()))
                .push(", ")
                .bind(Bind::BigInt(place.waitlist_seq))
                .push(", ")
                .bind(Bind::At(now))
                .push(")");
            conn.execute_sql(&insert)
                .await
                .context("join the waiting list")?;
            let entry = WaitlistEntry {
                asset_id: asset.to_owned(),
                buyer_id: req.buyer_id.to_string(),
                position: i64::from(place.waitlist_length),
                joined_at: now,
                client: req.client.clone(),
            };
            keep(conn, &store_, &req.idempotency, &entry, true, now).await?;
            metrics::counter!("holdfast_waitlist_joins_total").increment(1);
            Ok(Ok(JoinOutcome::Joined(entry)))
        })
        .await
}

/// Keeps the answer about `entry` under the request's key.
async fn keep(
    conn: &mut Conn<'_>,
    store: &Store,
    idempotency: &Idempotency,
    entry: &WaitlistEntry,
    joined: bool,
    now: Timestamp,
) -> StoreResult<()> {
    let answer = store.render(Answer::Waiting { entry, joined });
    let keep = Keep {
        idempotency,
        answer: &answer,
        reservation_id: None,
    };
    super::store_answer(conn, keep, now).await
}

/// The head of a queue.
#[derive(QueryableByName)]
struct Head {
    #[diesel(sql_type = Text)]
    client: String,
    #[diesel(sql_type = Text)]
    buyer_id: String,
    #[diesel(sql_type = BigInt)]
    seq: i64,
}

/// Hands the AVAILABLE `asset` (whose hold `ended` just ended in this
/// transaction) to its first waiter: a hold of the policy's
/// `waitlist_hold_seconds` from `now` that continues the ended one (it
/// began when that one began), owned by the waiter's client, with event
/// `reservation.held` via `waitlist`. A waiter that already has its most
/// live holds is passed over and leaves the queue (`waitlist.skipped`).
/// Without waiters, or when every one was passed over, the asset stays
/// AVAILABLE. The new hold, if any.
pub(crate) async fn hand_off(
    conn: &mut Conn<'_>,
    asset: &str,
    ended: &str,
    now: Timestamp,
    policy: &Policy,
) -> StoreResult<Option<Reservation>> {
    let mut events = Vec::new();
    let handed = loop {
        let mut first = Sql::new("SELECT client, buyer_id, seq FROM waitlist WHERE asset_id = ");
        first
            .bind(Bind::Text(asset.to_owned()))
            .push(" ORDER BY seq LIMIT 1");
        let Some(head) = conn
            .load_sql::<Head>(&first)
            .await
            .context("read the waiting list")?
            .into_iter()
            .next()
        else {
            break None;
        };
        let mut leave = Sql::new("DELETE FROM waitlist WHERE asset_id = ");
        leave
            .bind(Bind::Text(asset.to_owned()))
            .push(" AND seq = ")
            .bind(Bind::BigInt(head.seq));
        conn.execute_sql(&leave)
            .await
            .context("hand the asset over")?;
        shorten(conn, asset, policy.waitlist_max).await?;
        if at_limit(conn, &head.client, &head.buyer_id, now, policy).await? {
            let data = WaitlistSkipped {
                asset_id: asset.to_owned(),
                buyer_id: head.buyer_id.clone(),
                reason: "The buyer already has the most live holds allowed.".to_owned(),
            };
            let data = serde_json::to_string(&data).unwrap_or_default();
            let mut skipped = NewEvent::new(asset, EventType::WaitlistSkipped, data, now);
            skipped.client = Some(head.client.clone());
            events.push(skipped);
            metrics::counter!("holdfast_waitlist_skips_total").increment(1);
            continue;
        }
        break Some(hold_for(conn, asset, ended, &head, now, policy).await?);
    };
    if let Some(held) = &handed {
        let data = serde_json::to_string(held).unwrap_or_default();
        let event =
            super::about(held, EventType::ReservationHeld, data, now).via(Some(Via::Waitlist));
        events.push(event);
        metrics::counter!("holdfast_waitlist_handoffs_total").increment(1);
    }
    write_after(conn, asset, None, events, None, now).await?;
    Ok(handed)
}

/// Writes the waiter's hold of the asset, at the asset's price.
async fn hold_for(
    conn: &mut Conn<'_>,
    asset: &str,
    ended: &str,
    head: &Head,
    now: Timestamp,
    policy: &Policy,
) -> StoreResult<Reservation> {
    let until = now + Duration::seconds(policy.waitlist_hold_seconds);
    let mut held = Reservation {
        via: Some(Via::Waitlist),
        ..Reservation::held(&asset, &head.buyer_id, &head.client, now, until)
    };
    match give(conn, &mut held, now, Claim::Continues(ended)).await? {
        true => Ok(held),
        false => Err(StoreError::Corrupt(format!(
            "asset {asset} was not free to hand over"
        ))),
    }
}

/// Empties an asset's waiting list (its sale or withdrawal ended every
/// wait): the event `waitlist.cleared` naming every entry, `None` when
/// nobody waited.
pub(crate) async fn clear(
    conn: &mut Conn<'_>,
    asset: &str,
    reason: &str,
    now: Timestamp,
) -> StoreResult<Option<NewEvent>> {
    let cleared = entries(conn, asset, None).await?;
    if cleared.is_empty() {
        return Ok(None);
    }
    let mut delete = Sql::new("DELETE FROM waitlist WHERE asset_id = ");
    delete.bind(Bind::Text(asset.to_owned()));
    conn.execute_sql(&delete)
        .await
        .context("clear the waiting list")?;
    let mut empty = Sql::new("UPDATE assets SET waitlist_length = 0 WHERE id = ");
    empty.bind(Bind::Text(asset.to_owned()));
    conn.execute_sql(&empty)
        .await
        .context("clear the waiting list")?;
    let data = WaitlistCleared {
        asset_id: asset.to_owned(),
        reason: reason.to_owned(),
        entries: cleared
            .into_iter()
            .map(|e| ClearedEntry {
                buyer_id: e.buyer_id,
                position: e.position,
                client: Some(e.client),
            })
            .collect(),
    };
    let data = serde_json::to_string(&data).unwrap_or_default();
    Ok(Some(NewEvent::new(
        asset,
        EventType::WaitlistCleared,
        data,
        now,
    )))
}
