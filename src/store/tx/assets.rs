//! An asset's sale: withdrawing it (ending its hold) and reinstating it.

use diesel::sql_query;
use diesel::sql_types::{BigInt, Text};

use super::{about, contention, write_after, MAX_ATTEMPTS};
use crate::domain::{
    withdraw_decision, Asset, AssetId, AssetStatus, EventType, ReservationStatus, WithdrawDecision,
};
use crate::store::api::{ReinstateOutcome, WithdrawOutcome};
use crate::store::conn::Conn;
use crate::store::db::Store;
use crate::store::error::StoreResult;
use crate::store::error::{Abort, Context};
use crate::store::rows::{AssetRow, NewEvent, ReservationRow};
use crate::store::schema::Instant;

/// Takes an asset off sale; with `force`, a live hold is released first.
/// One conditional write guarded by the version the decision was made on.
pub(crate) async fn withdraw(
    store: &Store,
    id: &AssetId,
    force: bool,
    client: &str,
) -> StoreResult<WithdrawOutcome> {
    for _ in 0..MAX_ATTEMPTS {
        let id = id.to_string();
        let read = id.clone();
        let seen = store
            .run("read an asset", async move |conn| {
                let now = conn.now().await?;
                Ok((now, crate::store::read::stored_asset(conn, &read).await?))
            })
            .await?;
        let (now, Some(stored)) = seen else {
            return Ok(WithdrawOutcome::NotFound);
        };
        let (version, held_by) = (stored.version, stored.current_reservation_id.clone());
        // A lapsed hold is over, whether or not buyers wait for the asset
        // (their queue is cleared with the withdrawal).
        let lapsed =
            stored.status == AssetStatus::Held && stored.hold_expires_at.is_none_or(|e| e <= now);
        let asset = stored.effective(now);
        let status = match lapsed {
            true => AssetStatus::Available,
            false => asset.status,
        };
        let end = match withdraw_decision(status, force) {
            WithdrawDecision::AlreadyWithdrawn => return Ok(WithdrawOutcome::Unchanged(asset)),
            WithdrawDecision::Held => return Ok(WithdrawOutcome::Held(asset)),
            WithdrawDecision::Sold => return Ok(WithdrawOutcome::Sold(asset)),
            WithdrawDecision::ReleaseAndWithdraw => {
                held_by.map(|r| (r, ReservationStatus::Released))
            }
            WithdrawDecision::Withdraw if lapsed => {
                held_by.map(|r| (r, ReservationStatus::Expired))
            }
            WithdrawDecision::Withdraw => None,
        };
        let client = client.to_owned();
        let written = store
            .write("withdraw the asset", async move |conn| {
                withdrawn(conn, &id, version, end, &client).await
            })
            .await?;
        if let Some(asset) = written {
            return Ok(WithdrawOutcome::Withdrawn(asset));
        }
    }
    Err(contention("withdraw the asset"))
}

/// Withdraws the asset if it is still at `version`, ending the hold the
/// decision saw with it: EXPIRED when it had lapsed, RELEASED when it was
/// live (and is, at the write's own clock: a lapsed hold is never
/// released). Its events name `client`, but for an expiry.
async fn withdrawn(
    conn: &mut Conn<'_>,
    id: &str,
    version: i64,
    end: Option<(String, ReservationStatus)>,
    client: &str,
) -> Result<Asset, Abort> {
    let now = conn.now().await?;
    // With a hold to end: still live for a release, lapsed for an expiry.
    let live = match &end {
        Some((_, ReservationStatus::Released)) => " AND hold_expires_at > $1",
        Some(_) => " AND hold_expires_at <= $1",
        None => "",
    };
    let update = sql_query(format!(
        "UPDATE assets SET status = 'WITHDRAWN', hold_expires_at = NULL, \
             current_reservation_id = NULL, version = version + 1, updated_at = $1 \
         WHERE id = $2 AND version = $3{live} RETURNING *"
    ))
    .bind::<Instant, _>(now)
    .bind::<Text, _>(id)
    .bind::<BigInt, _>(version);
    let Some(row) = conn
        .optional::<_, AssetRow>(update)
        .await
        .context("withdraw the asset")?
    else {
        return Err(Abort::Retry);
    };
    let asset = row.into_asset(now)?;
    let mut events = Vec::new();
    if let Some((reservation, status)) = &end {
        let ended = sql_query(
            "UPDATE reservations SET status = $1, \
                 released_at = CASE WHEN $1 = 'RELEASED' THEN $2 END \
             WHERE id = $3 AND status = 'HELD' RETURNING *",
        )
        .bind::<Text, _>(status.as_str())
        .bind::<Instant, _>(now)
        .bind::<Text, _>(reservation);
        // The hold the decision was made on is gone: the state moved.
        let Some(ended) = conn
            .optional::<_, ReservationRow>(ended)
            .await
            .context("end the hold")?
        else {
            return Err(Abort::Retry);
        };
        let ended = ended.into_reservation()?;
        let data = serde_json::to_string(&ended).unwrap_or_default();
        events.push(match status {
            ReservationStatus::Expired => about(&ended, EventType::ReservationExpired, data, now),
            _ => about(&ended, EventType::ReservationReleased, data, now).by(client),
        });
    }
    let data = serde_json::to_string(&asset).unwrap_or_default();
    events.push(NewEvent::new(&asset.id, EventType::AssetWithdrawn, data, now).by(client));
    // Nobody waits for an asset off sale.
    events.extend(super::waitlist::clear(conn, id, "withdrawn", now).await?);
    write_after(conn, id, None, events, None, now).await?;
    Ok(asset)
}

/// Puts a WITHDRAWN asset back on sale; anything else stays as it is.
pub(crate) async fn reinstate(
    store: &Store,
    id: &AssetId,
    client: &str,
) -> StoreResult<ReinstateOutcome> {
    let (id, client) = (id.to_string(), client.to_owned());
    let outcome = store
        .write("reinstate the asset", async move |conn| {
            let now = conn.now().await?;
            let update = sql_query(
                "UPDATE assets SET status = 'AVAILABLE', version = version + 1, updated_at = $1, \
                     available_since = $1 \
                 WHERE id = $2 AND status = 'WITHDRAWN' RETURNING *",
            )
            .bind::<Instant, _>(now)
            .bind::<Text, _>(&id);
            let Some(row) = conn
                .optional::<_, AssetRow>(update)
                .await
                .context("reinstate the asset")?
            else {
                let current = crate::store::read::stored_asset(conn, &id).await?;
                return Ok(match current {
                    Some(asset) => ReinstateOutcome::Unchanged(asset.effective(now)),
                    None => ReinstateOutcome::NotFound,
                });
            };
            let asset = row.into_asset(now)?;
            let data = serde_json::to_string(&asset).unwrap_or_default();
            let event = NewEvent::new(&asset.id, EventType::AssetReinstated, data, now).by(&client);
            write_after(conn, &id, None, vec![event], None, now).await?;
            Ok(ReinstateOutcome::Reinstated(asset))
        })
        .await?;
    outcome.ok_or_else(|| contention("reinstate the asset"))
}
