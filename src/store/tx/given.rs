//! Holds given to a named buyer rather than taken by one: an admin's offer,
//! and the hold a waiting list hands its first waiter. Both read the asset
//! and the request's key in one snapshot ([`asset_snapshot`]), and write the
//! hold the same way ([`give`]).

use diesel::sql_types::{Nullable, Text};
use diesel::QueryableByName;

use super::{arrival, Snapshot};
use crate::domain::{AssetStatus, HoldTarget, Reservation, Timestamp};
use crate::store::api::Idempotency;
use crate::store::conn::{Bind, Conn, Sql};
use crate::store::db::Store;
use crate::store::error::{Context, StoreError, StoreResult};
use crate::store::rows::{parse_status, price_of, KeySnapshotRow};
use crate::store::schema::Instant;

/// The asset as a first read saw it.
pub(crate) struct AssetSeen {
    /// Its effective status: a lapsed hold frees it, unless buyers wait
    /// for it (then it is theirs next, and reads HELD).
    pub status: AssetStatus,
    pub waitlist_length: i64,
    /// When a waiter last left its waiting list full.
    pub waitlist_full_at: Option<Timestamp>,
    /// The live hold's client and buyer.
    pub holder: Option<(String, String)>,
    /// The asset as stored, for a decision at the request's arrival
    /// (`hold_decision`). Its opening is left out: an offer may be made
    /// before the sale opens.
    pub target: HoldTarget,
    /// The hold the asset has (live or lapsed): its reservation, and when
    /// that hold began (its write's clock once it held the asset's row;
    /// `created_at` for a reservation written before `began_at` existed).
    pub holding: Option<(String, Timestamp)>,
    /// The request's arrival on the read's clock ([`arrival`]).
    pub decided: Timestamp,
}

#[derive(QueryableByName)]
struct AssetSeenRow {
    #[diesel(embed)]
    key: KeySnapshotRow,
    #[diesel(sql_type = Nullable<Text>)]
    status: Option<String>,
    #[diesel(sql_type = Nullable<Instant>)]
    hold_expires_at: Option<Timestamp>,
    #[diesel(sql_type = Nullable<Instant>)]
    available_since: Option<Timestamp>,
    #[diesel(sql_type = Nullable<diesel::sql_types::Integer>)]
    waitlist_length: Option<i32>,
    #[diesel(sql_type = Nullable<Instant>)]
    waitlist_full_at: Option<Timestamp>,
    #[diesel(sql_type = Nullable<Text>)]
    current_reservation_id: Option<String>,
    #[diesel(sql_type = Nullable<Instant>)]
    held_since: Option<Timestamp>,
    #[diesel(sql_type = Nullable<Text>)]
    holder_client: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    holder_buyer: Option<String>,
}

/// The clock, the asset (`None` when it does not exist) and the answer kept
/// under the request's key, in one statement; the request `arrived` then.
pub(crate) async fn asset_snapshot(
    store: &Store,
    context: &'static str,
    asset: &str,
    idempotency: &Idempotency,
    arrived: std::time::Instant,
) -> StoreResult<Snapshot<AssetSeen>> {
    let (asset, idempotency) = (asset.to_owned(), idempotency.clone());
    store
        .run(context, async move |conn| {
            let sent = std::time::Instant::now();
            let now = conn.now_after_locks().await?;
            let decided = arrival(now, sent, arrived);
            let mut read = Sql::new("SELECT ");
            read.bind(Bind::At(now)).push(
                " AS now, a.status, a.hold_expires_at, a.available_since, a.waitlist_length, \
                   a.waitlist_full_at, a.current_reservation_id, \
                   coalesce(h.began_at, h.created_at) AS held_since, \
                   h.client AS holder_client, h.buyer_id AS holder_buyer, \
                   i.fingerprint, i.status_code, i.body, i.location \
                 FROM (SELECT 1) AS one LEFT JOIN assets a ON a.id = ",
            );
            read.bind(Bind::Text(asset))
                .push(
                    " LEFT JOIN reservations h ON h.id = a.current_reservation_id \
                     LEFT JOIN idempotency_keys i ON i.client = ",
                )
                .bind(Bind::Text(idempotency.client.clone()))
                .push(" AND i.key = ")
                .bind(Bind::Text(idempotency.key.to_string()));
            let row = conn
                .load_sql::<AssetSeenRow>(&read)
                .await
                .context(context)?
                .into_iter()
                .next()
                .ok_or_else(|| {
                    StoreError::Corrupt(format!("{context}: the read answered no row"))
                })?;
            let seen = match row.status {
                Some(status) => {
                    let stored = parse_status(AssetStatus::parse, &status)?;
                    let waitlist_length = i64::from(row.waitlist_length.unwrap_or_default());
                    let live = row.hold_expires_at.filter(|e| *e > now);
                    let status = match stored {
                        AssetStatus::Held if live.is_none() && waitlist_length == 0 => {
                            AssetStatus::Available
                        }
                        other => other,
                    };
                    let holder = match (live, row.holder_client, row.holder_buyer) {
                        (Some(_), Some(client), Some(buyer)) => Some((client, buyer)),
                        _ => None,
                    };
                    let holding = match stored {
                        AssetStatus::Held => row.current_reservation_id.zip(row.held_since),
                        _ => None,
                    };
                    Some(AssetSeen {
                        status,
                        waitlist_length,
                        waitlist_full_at: row.waitlist_full_at,
                        holder,
                        target: HoldTarget {
                            status: stored,
                            hold_expires_at: row.hold_expires_at,
                            available_from: None,
                            available_since: row.available_since,
                        },
                        holding,
                        decided,
                    })
                }
                None => None,
            };
            Ok(row.key.with_row(seen))
        })
        .await
}

/// How a hold claims its asset, and when it begins for a waiting list (a
/// join queues only for a hold that began before its arrival).
pub(crate) enum Claim<'a> {
    /// An offer, decided at its arrival: the asset must have been free
    /// then. The hold begins at this write's clock once it holds the
    /// asset's row: `now` may precede a wait for that lock, during which
    /// the asset had no hold.
    FreeAt(Timestamp),
    /// A hand-over to the head of the queue, which the hold `ended` (its
    /// reservation) made in this transaction: the asset passes from one
    /// hold to the next, and the new one continues it, beginning when it
    /// began.
    Continues(&'a str),
}

/// Holds the AVAILABLE asset for `held` (its buyer and client, its expiry,
/// how it was made and its metadata): the asset HELD until then with this
/// reservation current and a new version, and the reservation written at
/// the asset's price, which `held` takes. `false` when the asset was not
/// AVAILABLE, or, for [`Claim::FreeAt`], had become free after that moment.
pub(crate) async fn give(
    conn: &mut Conn<'_>,
    held: &mut Reservation,
    now: Timestamp,
    how: Claim<'_>,
) -> StoreResult<bool> {
    #[derive(QueryableByName)]
    struct Priced {
        #[diesel(sql_type = Nullable<diesel::sql_types::BigInt>)]
        price_amount: Option<i64>,
        #[diesel(sql_type = Nullable<Text>)]
        price_currency: Option<String>,
    }
    #[derive(QueryableByName)]
    struct Began {
        #[diesel(sql_type = Instant)]
        began: Timestamp,
    }
    let mut claim = Sql::new("UPDATE assets SET status = 'HELD', hold_expires_at = ");
    claim
        .bind(Bind::At(held.expires_at))
        .push(", current_reservation_id = ")
        .bind(Bind::Text(held.reservation_id.clone()))
        .push(", version = version + 1, updated_at = ")
        .bind(Bind::At(now))
        .push(" WHERE id = ")
        .bind(Bind::Text(held.asset_id.clone()))
        .push(" AND status = 'AVAILABLE'");
    if let Claim::FreeAt(at) = how {
        claim
            .push(" AND (available_since IS NULL OR available_since <= ")
            .bind(Bind::At(at))
            .push(")");
    }
    claim.push(" RETURNING price_amount, price_currency");
    let Some(priced) = conn
        .load_sql::<Priced>(&claim)
        .await
        .context("hold the asset")?
        .into_iter()
        .next()
    else {
        return Ok(false);
    };
    held.price = price_of(priced.price_amount, priced.price_currency);
    let began = match how {
        Claim::FreeAt(_) => conn.now_after_locks().await?,
        Claim::Continues(ended) => {
            let mut start = Sql::new(
                "SELECT coalesce(began_at, created_at) AS began FROM reservations WHERE id = ",
            );
            start.bind(Bind::Text(ended.to_owned()));
            conn.load_sql::<Began>(&start)
                .await
                .context("read when the hold handed over began")?
                .into_iter()
                .next()
                .ok_or_else(|| StoreError::Corrupt(format!("hold {ended} handed over is gone")))?
                .began
        }
    };
    let metadata = held
        .metadata
        .as_ref()
        .and_then(|m| serde_json::to_string(m).ok());
    let mut insert = Sql::new(
        "INSERT INTO reservations (id, asset_id, buyer_id, status, expires_at, created_at, \
             client, price_amount, price_currency, metadata, via, began_at) VALUES (",
    );
    insert
        .bind(Bind::Text(held.reservation_id.clone()))
        .push(", ")
        .bind(Bind::Text(held.asset_id.clone()))
        .push(", ")
        .bind(Bind::Text(held.buyer_id.clone()))
        .push(", 'HELD', ")
        .bind(Bind::At(held.expires_at))
        .push(", ")
        .bind(Bind::At(now))
        .push(", ")
        .bind(Bind::Text(held.client.clone()))
        .push(", ")
        .bind(Bind::OptBigInt(held.price.as_ref().map(|p| p.amount)))
        .push(", ")
        .bind(Bind::OptText(
            held.price.as_ref().map(|p| p.currency.clone()),
        ))
        .push(", ")
        .bind(Bind::OptText(metadata))
        .push(", ")
        .bind(Bind::OptText(held.via.map(|v| v.as_str().to_owned())))
        .push(", ")
        .bind(Bind::At(began))
        .push(")");
    conn.execute_sql(&insert).await.context("hold the asset")?;
    Ok(true)
}
