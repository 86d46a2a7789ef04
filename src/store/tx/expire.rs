//! The expiry of lapsed holds: each asset back to AVAILABLE, its HELD
//! reservation EXPIRED, one `reservation.expired` event each.
//!
//! The janitor expires batches of any assets; a change about to act on one
//! asset (a late sale, a refund, a withdrawal) first expires that asset's
//! lapsed hold, so that its timeline reads held → expired → what followed.
//! Each lapsed hold's reservation is reached by the asset's
//! `current_reservation_id`, by primary key, and on PostgreSQL the batch by
//! the index of HELD reservations by expiry, each asset then by its primary
//! key: no plan can make either a join over the asset's reservations,
//! whatever the statistics say.

use std::sync::LazyLock;

use diesel::sql_query;
use diesel::sql_types::{BigInt, Text};
use diesel::QueryableByName;

use super::waitlist::hand_off;
use crate::domain::{EventType, Timestamp};
use crate::store::api::Policy;
use crate::store::conn::Conn;
use crate::store::error::Context;
use crate::store::error::StoreResult;
use crate::store::rows::{ReservationRow, TransitionRow};
use crate::store::schema::Instant;

/// Which lapsed holds to expire.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Lapsed<'a> {
    /// This asset's, waiting for a transaction that is expiring it right
    /// now (a janitor): what the caller does next then reads after it.
    Of(&'a str),
    /// Up to this many of any assets (on SQLite oldest expiry first),
    /// skipping those another transaction holds (on PostgreSQL), so that
    /// janitors of several instances share the work.
    Any(i64),
}

/// PostgreSQL's expiry after its choice of lapsed assets (`lapsed`, locked
/// there): each asset freed, then its reservation, by primary key. The
/// reservation's status is compared as an expression (`|| ''`) so that no
/// partial index of HELD reservations can serve the join: with statistics
/// taken when none was HELD, the planner took one (estimated one row) and
/// compared every HELD reservation with every lapsed asset, past the
/// statement timeout.
const PG_EXPIRE: &str = "\
, a AS (
    UPDATE assets SET status = 'AVAILABLE', hold_expires_at = NULL, current_reservation_id = NULL,
           version = version + 1, last_event_sequence = last_event_sequence + 1, updated_at = $1,
           available_since = assets.hold_expires_at
      FROM lapsed WHERE assets.id = lapsed.id
 RETURNING assets.id, lapsed.current_reservation_id AS reservation_id, assets.last_event_sequence,
           assets.waitlist_length
)
UPDATE reservations SET status = 'EXPIRED' FROM a
 WHERE reservations.id = a.reservation_id AND reservations.status || '' = 'HELD'
RETURNING reservations.*, a.last_event_sequence AS event_sequence,
          a.waitlist_length AS waiters";

/// One asset's lapsed hold ($2), waiting for a transaction that holds it.
static PG_ONE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH lapsed AS (SELECT id, current_reservation_id FROM assets \
           WHERE id = $2 AND status = 'HELD' AND hold_expires_at <= $1 FOR UPDATE){PG_EXPIRE}"
    )
});

/// Up to $2 lapsed holds of any assets: found among the HELD reservations
/// (no index of `assets` covers a hold's columns, so that holds update the
/// asset in place; HELD reservations are few, and partially indexed), each
/// asset then by its primary key (`= ANY` of an array: a plan cannot turn
/// the lookups into a scan of all assets), skipping those another
/// transaction holds.
static PG_ANY: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH lapsed AS (SELECT id, current_reservation_id FROM assets \
           WHERE id = ANY (ARRAY(SELECT asset_id FROM reservations WHERE status = 'HELD' \
                                   AND expires_at <= $1 LIMIT $2)) \
             AND status = 'HELD' AND hold_expires_at <= $1 \
           FOR UPDATE SKIP LOCKED){PG_EXPIRE}"
    )
});

#[derive(QueryableByName)]
struct LapsedRow {
    #[diesel(sql_type = Text)]
    id: String,
    #[diesel(sql_type = Text)]
    current_reservation_id: String,
    #[diesel(sql_type = diesel::sql_types::Integer)]
    waitlist_length: i32,
}

#[derive(QueryableByName)]
struct Sequence {
    #[diesel(sql_type = BigInt)]
    last_event_sequence: i64,
}

/// Expires the lapsed holds `which` names as of `now`, handing each asset
/// that has waiters to the first of them in the same transaction; how many.
/// (Its statements bind owned values: the janitor runs it on a task of its
/// own, and the compiler cannot show a future holding borrowed binds `Send`
/// for every lifetime.)
pub(crate) async fn expire_lapsed(
    conn: &mut Conn<'_>,
    which: Lapsed<'_>,
    now: Timestamp,
    policy: &Policy,
) -> StoreResult<usize> {
    let expired = match conn {
        Conn::Pg(_) => {
            let rows = match which {
                Lapsed::Of(asset) => {
                    let query = sql_query(PG_ONE.as_str())
                        .bind::<Instant, _>(now)
                        .bind::<Text, _>(asset.to_owned());
                    conn.load::<_, TransitionRow>(query).await
                }
                Lapsed::Any(limit) => {
                    let query = sql_query(PG_ANY.as_str())
                        .bind::<Instant, _>(now)
                        .bind::<BigInt, _>(limit);
                    conn.load::<_, TransitionRow>(query).await
                }
            };
            rows.context("expire lapsed holds")?
        }
        Conn::Lite(_) => expire_on_sqlite(conn, which, now).await?,
    };
    let mut events = Vec::with_capacity(expired.len());
    let mut waited_for = Vec::new();
    for row in &expired {
        let reservation = row.reservation.clone().into_reservation()?;
        let data = serde_json::to_string(&reservation).unwrap_or_default();
        let mut event = super::about(&reservation, EventType::ReservationExpired, data, now);
        event.sequence = row.event_sequence;
        event.client = Some(reservation.client.clone());
        events.push(event);
        if row.waiters > 0 {
            waited_for.push((reservation.asset_id, reservation.reservation_id));
        }
    }
    // The expiries' events first: a hand-off numbers its own after them.
    conn.insert_events(&events).await?;
    for (asset, ended) in &waited_for {
        hand_off(conn, asset, ended, now, policy).await?;
    }
    Ok(expired.len())
}

/// SQLite's one writer runs no other write meanwhile: the lapsed holds are
/// found, then each is expired.
async fn expire_on_sqlite(
    conn: &mut Conn<'_>,
    which: Lapsed<'_>,
    now: Timestamp,
) -> StoreResult<Vec<TransitionRow>> {
    let lapsed = match which {
        Lapsed::Of(asset) => {
            let find = sql_query(
                "SELECT id, current_reservation_id, waitlist_length FROM assets \
                 WHERE id = $1 AND status = 'HELD' AND hold_expires_at <= $2",
            )
            .bind::<Text, _>(asset.to_owned())
            .bind::<Instant, _>(now);
            conn.load::<_, LapsedRow>(find).await
        }
        Lapsed::Any(limit) => {
            let find = sql_query(
                "SELECT id, current_reservation_id, waitlist_length FROM assets \
                 WHERE status = 'HELD' AND hold_expires_at <= $1 \
                 ORDER BY hold_expires_at LIMIT $2",
            )
            .bind::<Instant, _>(now)
            .bind::<BigInt, _>(limit);
            conn.load::<_, LapsedRow>(find).await
        }
    }
    .context("find lapsed holds")?;
    let mut expired = Vec::with_capacity(lapsed.len());
    for LapsedRow {
        id,
        current_reservation_id,
        waitlist_length,
    } in lapsed
    {
        let asset = sql_query(
            "UPDATE assets SET status = 'AVAILABLE', hold_expires_at = NULL, \
                 current_reservation_id = NULL, version = version + 1, \
                 last_event_sequence = last_event_sequence + 1, updated_at = $1, \
                 available_since = hold_expires_at \
             WHERE id = $2 RETURNING last_event_sequence",
        )
        .bind::<Instant, _>(now)
        .bind::<Text, _>(id.clone());
        let sequence: Sequence = conn.first(asset).await.context("expire a lapsed hold")?;
        let reservation = sql_query(
            "UPDATE reservations SET status = 'EXPIRED' WHERE id = $1 AND status = 'HELD' \
             RETURNING *",
        )
        .bind::<Text, _>(current_reservation_id);
        let row: ReservationRow = conn
            .first(reservation)
            .await
            .context("expire a lapsed reservation")?;
        expired.push(TransitionRow {
            reservation: row,
            event_sequence: sequence.last_event_sequence,
            waiters: waitlist_length,
        });
    }
    Ok(expired)
}
