//! The reads: assets, reservations, refunds, an asset's events and a
//! payment's fate, each by effective status at the database's clock.

use diesel::sql_types::{Nullable, Text};
use diesel::QueryableByName;

use super::api::{AssetPage, Client, RefundPage, ReservationPage};
use super::conn::{Bind, Conn, Sql};
use super::db::Store;
use super::error::Context;
use super::error::{StoreError, StoreResult};
use super::rows::{
    AssetRow, Count, EventRow, PaymentRow, RefundRow, ReservationRow, StatusCountRow,
};
use crate::domain::{
    Asset, AssetId, AssetStatus, Event, Payment, PaymentOutcome, PaymentReference, Refund,
    RefundReason, Reservation, ReservationId, ReservationStatus, Timestamp,
};

pub(crate) async fn ping(store: &Store) -> StoreResult<()> {
    store
        .run("answer a ping", async |conn| {
            let ping = Sql::new("SELECT 1");
            conn.execute_sql(&ping).await.context("answer a ping")?;
            Ok(())
        })
        .await
}

/// An asset with the client whose reservation holds it.
#[derive(QueryableByName)]
struct HeldAssetRow {
    #[diesel(embed)]
    asset: AssetRow,
    #[diesel(sql_type = Nullable<Text>)]
    holder: Option<String>,
}

impl HeldAssetRow {
    fn into_asset(self, now: Timestamp) -> StoreResult<Asset> {
        self.asset.into_held_asset(now, self.holder)
    }
}

const ASSETS: &str = "SELECT a.*, r.client AS holder FROM assets a \
     LEFT JOIN reservations r ON r.id = a.current_reservation_id";

pub(crate) async fn asset(store: &Store, id: &AssetId) -> StoreResult<Option<Asset>> {
    let id = id.to_string();
    store
        .run("read an asset", async move |conn| {
            let now = conn.now().await?;
            let mut read = Sql::new(ASSETS);
            read.push(" WHERE a.id = ").bind(Bind::Text(id));
            let rows = conn
                .load_sql::<HeldAssetRow>(&read)
                .await
                .context("read an asset")?;
            rows.into_iter()
                .next()
                .map(|r| r.into_asset(now))
                .transpose()
        })
        .await
}

/// Up to `page.limit` assets in the byte order of their ids, by effective
/// status and the page's filters. With an attribute filter, the page walks
/// the attribute index from that key and value in id order; otherwise the
/// ids' own index (in byte order on PostgreSQL, whatever the database's
/// collation, so that a prefix is a range of it). Either way a page reads
/// about as many rows as it answers when the filters match often, and never
/// sorts what it read.
///
/// A price filter that few assets pass is read through the price index
/// instead (those few read and sorted). PostgreSQL's planner tells the two
/// apart from its statistics; SQLite's would always take the price index,
/// so on SQLite a probe of at most [`FEW_PRICED`] index entries decides.
pub(crate) async fn assets_page(store: &Store, page: &AssetPage) -> StoreResult<Vec<Asset>> {
    let page = page.clone();
    store
        .run("list assets", async move |conn| {
            let now = conn.now().await?;
            let postgres = conn.is_postgres();
            let price_as_check = match &page.price_max {
                Some(max) if !postgres => {
                    let mut probe = Sql::new(
                        "SELECT count(*) AS n FROM (SELECT 1 FROM assets WHERE price_currency = ",
                    );
                    probe
                        .bind(Bind::Text(max.currency.clone()))
                        .push(" AND price_amount <= ")
                        .bind(Bind::BigInt(max.amount))
                        .push(" LIMIT ")
                        .bind(Bind::BigInt(FEW_PRICED))
                        .push(")");
                    let found = conn
                        .load_sql::<Count>(&probe)
                        .await
                        .context("list assets")?;
                    found.first().is_some_and(|c| c.n >= FEW_PRICED)
                }
                _ => false,
            };
            let list = assets_query(&page, now, postgres, price_as_check);
            let rows = conn
                .load_sql::<HeldAssetRow>(&list)
                .await
                .context("list assets")?;
            rows.into_iter().map(|r| r.into_asset(now)).collect()
        })
        .await
}

/// Below this many assets passing a price filter, SQLite reads them through
/// the price index; from it on, the page walks the ids and checks prices.
const FEW_PRICED: i64 = 1000;

/// The statement of one page of assets (see [`assets_page`]); with
/// `price_as_check`, SQLite may not read the price index (`+column`).
///
/// On PostgreSQL no index of `assets` covers a hold's columns (so that a
/// hold updates the asset in place): a status's page walks its `shelf` in
/// id order (AVAILABLE and HELD assets share ON_SALE, where the HELD ones
/// are few), and the HELD page reads the assets of the HELD reservations.
/// On SQLite, effective AVAILABLE is two statuses: the AVAILABLE assets and
/// the lapsed holds nobody waits for, each read in id order from the index
/// of its status and the page the first of both. Either way a page reads
/// about as many rows as it answers however many assets of other statuses
/// come first.
fn assets_query(page: &AssetPage, now: Timestamp, postgres: bool, price_as_check: bool) -> Sql {
    let mut list = Sql::new("");
    // The ids in byte order. A page of one shelf names that order as its
    // index does, `COLLATE "POSIX"` (the same order as "C", under another
    // name), so that only the shelf's index can serve it: with "C" the
    // planner could walk every asset's id in order and filter by shelf,
    // which reads all the SOLD assets that come first.
    let ids = match page.status {
        _ if !postgres => "a.id",
        Some(AssetStatus::Available | AssetStatus::Sold | AssetStatus::Withdrawn) => {
            "a.id COLLATE \"POSIX\""
        }
        _ => "a.id COLLATE \"C\"",
    };
    let page_of = |list: &mut Sql, status: &dyn Fn(&mut Sql)| {
        one_status(list, page, ids, price_as_check, status);
    };
    let lapsed = |l: &mut Sql| {
        l.push("a.status = 'HELD' AND a.hold_expires_at <= ")
            .bind(Bind::At(now))
            .push(" AND a.waitlist_length = 0");
    };
    match page.status {
        Some(AssetStatus::Available) if postgres => page_of(&mut list, &|l| {
            l.push(" AND a.shelf = 'ON_SALE' AND (a.status = 'AVAILABLE' OR ");
            lapsed(l);
            l.push(")");
        }),
        Some(AssetStatus::Available) => {
            list.push("SELECT * FROM (SELECT * FROM (");
            page_of(&mut list, &|l| {
                l.push(" AND a.status = 'AVAILABLE'");
            });
            list.push(") available UNION ALL SELECT * FROM (");
            page_of(&mut list, &|l| {
                l.push(" AND ");
                lapsed(l);
            });
            list.push(") lapsed) page ORDER BY page.id LIMIT ")
                .bind(Bind::BigInt(page.limit));
        }
        Some(AssetStatus::Held) => page_of(&mut list, &|l| {
            if postgres {
                l.push(
                    " AND a.id IN (SELECT h.asset_id FROM reservations h \
                     WHERE h.status = 'HELD')",
                );
            }
            l.push(" AND a.status = 'HELD' AND (a.hold_expires_at > ")
                .bind(Bind::At(now))
                .push(" OR a.waitlist_length > 0)");
        }),
        Some(other) => page_of(&mut list, &|l| {
            let column = if postgres { "a.shelf" } else { "a.status" };
            l.push(&format!(" AND {column} = "))
                .bind(Bind::Text(other.as_str().to_owned()));
        }),
        None => page_of(&mut list, &|_| {}),
    }
    list
}

/// Appends to `list` the first page of assets that pass the page's filters
/// and `status` (which appends its condition), in the order of `ids` (the
/// ids' expression when no attribute filter leads).
fn one_status(
    list: &mut Sql,
    page: &AssetPage,
    ids: &str,
    price_as_check: bool,
    status: &dyn Fn(&mut Sql),
) {
    let mut attributes = page.attributes.iter();
    let id = match attributes.next() {
        Some((key, value)) => {
            let (kind, text) = value.indexed();
            list.push(
                "SELECT a.*, r.client AS holder FROM asset_attributes x \
                 JOIN assets a ON a.id = x.asset_id \
                 LEFT JOIN reservations r ON r.id = a.current_reservation_id \
                 WHERE x.key = ",
            )
            .bind(Bind::Text(key.clone()))
            .push(" AND x.kind = ")
            .bind(Bind::Text(kind.to_owned()))
            .push(" AND x.value = ")
            .bind(Bind::Text(text));
            "x.asset_id"
        }
        None => {
            list.push(ASSETS).push(" WHERE true");
            ids
        }
    };
    for (key, value) in attributes {
        let (kind, text) = value.indexed();
        list.push(
            " AND EXISTS (SELECT 1 FROM asset_attributes y WHERE y.asset_id = a.id AND y.key = ",
        )
        .bind(Bind::Text(key.clone()))
        .push(" AND y.kind = ")
        .bind(Bind::Text(kind.to_owned()))
        .push(" AND y.value = ")
        .bind(Bind::Text(text))
        .push(")");
    }
    if let Some(prefix) = &page.id_prefix {
        list.push(&format!(" AND {id} >= "))
            .bind(Bind::Text(prefix.clone()))
            .push(&format!(" AND {id} < "))
            // Above every id that starts with it: ids are printable ASCII.
            .bind(Bind::Text(format!("{prefix}\u{7f}")));
    }
    if let Some(after) = &page.after {
        list.push(&format!(" AND {id} > "))
            .bind(Bind::Text(after.clone()));
    }
    if let Some(max) = &page.price_max {
        let unindexed = if price_as_check { "+" } else { "" };
        list.push(&format!(" AND {unindexed}a.price_currency = "))
            .bind(Bind::Text(max.currency.clone()))
            .push(&format!(" AND {unindexed}a.price_amount <= "))
            .bind(Bind::BigInt(max.amount));
    }
    status(list);
    list.push(&format!(" ORDER BY {id}"));
    match page.price_max {
        // Which plan suits a price filter depends on the price bound.
        Some(_) => list.push(" LIMIT ").bind(Bind::BigInt(page.limit)),
        None => list.limit(page.limit),
    };
}

/// Assets per effective status (a lapsed hold counts as AVAILABLE, unless
/// buyers wait for the asset), every status listed; a cost that does not
/// grow with the catalogue (see [`COUNTS`]).
pub(crate) async fn asset_counts(store: &Store) -> StoreResult<Vec<(AssetStatus, i64)>> {
    store
        .run("count assets", async |conn| {
            let now = conn.now().await?;
            let count = Sql::new(COUNTS).with(Bind::At(now));
            let rows = conn
                .load_sql::<StatusCountRow>(&count)
                .await
                .context("count assets")?;
            let of = |status: &str| rows.iter().find(|r| r.status == status).map_or(0, |r| r.n);
            let (sold, withdrawn, held) = (of("SOLD"), of("WITHDRAWN"), of("HELD"));
            Ok(vec![
                (AssetStatus::Available, of("ALL") - sold - withdrawn - held),
                (AssetStatus::Held, held),
                (AssetStatus::Sold, sold),
                (AssetStatus::Withdrawn, withdrawn),
            ])
        })
        .await
}

/// The counts kept of all, SOLD and WITHDRAWN assets with the changes not
/// folded in yet, and the HELD ones by effective status ($1: now) read
/// through their HELD reservations (each HELD asset has one, of the same
/// expiry; a lapsed one still counts while buyers wait for its asset): one
/// statement, so one snapshot.
const COUNTS: &str = "\
SELECT m.status, CAST(sum(m.n) AS BIGINT) AS n
  FROM (SELECT status, n FROM asset_counts
        UNION ALL SELECT status, delta FROM asset_count_changes) m
 GROUP BY m.status
UNION ALL
SELECT 'HELD', count(*) FROM reservations r
 WHERE r.status = 'HELD' AND (r.expires_at > $1
       OR EXISTS (SELECT 1 FROM assets a WHERE a.id = r.asset_id AND a.waitlist_length > 0))";

/// Up to `limit` of an asset's events after sequence `after`, oldest
/// first; `None` when the asset does not exist.
pub(crate) async fn asset_events(
    store: &Store,
    id: &AssetId,
    after: i64,
    limit: i64,
) -> StoreResult<Option<Vec<Event>>> {
    let id = id.to_string();
    store
        .run("read an asset's events", async move |conn| {
            let mut exists = Sql::new("SELECT count(*) AS n FROM assets WHERE id = ");
            exists.bind(Bind::Text(id.clone()));
            let found = conn
                .load_sql::<Count>(&exists)
                .await
                .context("find an asset")?;
            if found.first().is_none_or(|c| c.n == 0) {
                return Ok(None);
            }
            let mut read = Sql::new(&format!(
                "SELECT {} FROM events WHERE asset_id = ",
                super::rows::EVENT_COLUMNS
            ));
            read.bind(Bind::Text(id))
                .push(" AND sequence > ")
                .bind(Bind::BigInt(after))
                .push(" ORDER BY sequence")
                .limit(limit);
            let rows = conn
                .load_sql::<EventRow>(&read)
                .await
                .context("read an asset's events")?;
            rows.into_iter()
                .map(EventRow::into_event)
                .collect::<StoreResult<_>>()
                .map(Some)
        })
        .await
}

/// The reservation with its refunds, when it exists for `client`.
pub(crate) async fn reservation(
    store: &Store,
    id: &ReservationId,
    client: &Client,
) -> StoreResult<Option<Reservation>> {
    let (id, client) = (id.to_string(), client.clone());
    store
        .run("read a reservation", async move |conn| {
            let now = conn.now().await?;
            // Another client's reservation is not read beyond the filter,
            // exactly like a missing one.
            let mut read = Sql::new("SELECT * FROM reservations WHERE id = ");
            read.bind(Bind::Text(id));
            if let Some(own) = client.own_filter() {
                read.push(" AND client = ").bind(Bind::Text(own.to_owned()));
            }
            let rows = conn
                .load_sql::<ReservationRow>(&read)
                .await
                .context("read a reservation")?;
            Ok(with_refunds(conn, rows, now).await?.pop())
        })
        .await
}

/// A reservation as stored (no refunds, its status not made effective).
pub(crate) async fn stored_reservation(
    store: &Store,
    id: &str,
) -> StoreResult<Option<Reservation>> {
    let id = id.to_owned();
    store
        .run("read a reservation", async move |conn| {
            let mut read = Sql::new("SELECT * FROM reservations WHERE id = ");
            read.bind(Bind::Text(id));
            let rows = conn
                .load_sql::<ReservationRow>(&read)
                .await
                .context("read a reservation")?;
            rows.into_iter()
                .next()
                .map(ReservationRow::into_reservation)
                .transpose()
        })
        .await
}

/// The reservation with its refunds, by effective status at `now`, on
/// `conn` (inside a transaction: as that transaction sees it).
pub(crate) async fn reservation_in(
    conn: &mut Conn<'_>,
    id: &str,
    now: Timestamp,
) -> StoreResult<Option<Reservation>> {
    let mut read = Sql::new("SELECT * FROM reservations WHERE id = ");
    read.bind(Bind::Text(id.to_owned()));
    let rows = conn
        .load_sql::<ReservationRow>(&read)
        .await
        .context("read a reservation")?;
    Ok(with_refunds(conn, rows, now).await?.pop())
}

/// The reservations of `rows` with their refunds, by effective status at `now`.
async fn with_refunds(
    conn: &mut Conn<'_>,
    rows: Vec<ReservationRow>,
    now: Timestamp,
) -> StoreResult<Vec<Reservation>> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let mut read = Sql::new("SELECT * FROM refunds WHERE reservation_id IN (");
    for (i, row) in rows.iter().enumerate() {
        if i > 0 {
            read.push(", ");
        }
        read.bind(Bind::Text(row.id.clone()));
    }
    read.push(") ORDER BY created_at, id");
    let refund_rows = conn
        .load_sql::<RefundRow>(&read)
        .await
        .context("read refunds")?;
    super::rows::with_refunds(rows, refund_rows, now)
}

/// One page of reservations, newest first, with their refunds.
pub(crate) async fn reservations_page(
    store: &Store,
    page: &ReservationPage,
) -> StoreResult<Vec<Reservation>> {
    let page = page.clone();
    let policy = *store.policy();
    store
        .run("list reservations", async move |conn| {
            let now = conn.now().await?;
            let one_buyer = page.buyer_id.is_some();
            let mut list = Sql::new("SELECT * FROM reservations WHERE true");
            for (column, value) in [
                ("buyer_id", page.buyer_id),
                ("asset_id", page.asset_id),
                ("client", page.client),
            ] {
                if let Some(value) = value {
                    list.push(&format!(" AND {column} = "))
                        .bind(Bind::Text(value));
                }
            }
            if let Some(before) = page.before {
                list.push(" AND id < ").bind(Bind::Text(before));
            }
            match page.status {
                // One buyer's live reservations are among the buyer's ids of
                // the last days, a range of `reservations_buyer_idx`; the
                // status as an expression, so that no plan reads every live
                // hold through the index of HELD ones instead.
                Some(ReservationStatus::Held) if one_buyer => {
                    list.push(" AND id >= ")
                        .bind(Bind::Text(policy.live_since(now)))
                        .push(" AND status || '' = 'HELD' AND expires_at > ")
                        .bind(Bind::At(now));
                }
                Some(ReservationStatus::Held) => {
                    list.push(" AND status = 'HELD' AND expires_at > ")
                        .bind(Bind::At(now));
                }
                Some(ReservationStatus::Expired) => {
                    list.push(" AND (status = 'EXPIRED' OR (status = 'HELD' AND expires_at <= ")
                        .bind(Bind::At(now))
                        .push("))");
                }
                Some(other) => {
                    list.push(" AND status = ")
                        .bind(Bind::Text(other.as_str().to_owned()));
                }
                None => {}
            }
            list.push(" ORDER BY id DESC LIMIT ")
                .bind(Bind::BigInt(page.limit));
            let rows = conn
                .load_sql::<ReservationRow>(&list)
                .await
                .context("list reservations")?;
            with_refunds(conn, rows, now).await
        })
        .await
}

/// One page of refunds in id (creation) order.
pub(crate) async fn refunds_page(store: &Store, page: &RefundPage) -> StoreResult<Vec<Refund>> {
    let page = page.clone();
    store
        .run("list refunds", async move |conn| {
            let mut list = Sql::new("SELECT * FROM refunds WHERE true");
            if let Some(status) = page.status {
                list.push(" AND status = ")
                    .bind(Bind::Text(status.as_str().to_owned()));
            }
            if let Some(after) = page.after {
                list.push(" AND id > ").bind(Bind::Text(after));
            }
            list.push(" ORDER BY id LIMIT ")
                .bind(Bind::BigInt(page.limit));
            let rows = conn
                .load_sql::<RefundRow>(&list)
                .await
                .context("list refunds")?;
            rows.into_iter().map(RefundRow::into_refund).collect()
        })
        .await
}

/// The fates of `reference` with their reservation and refund: for
/// `client` (sales recorded before payments had clients, client `''`, count
/// for every client; its own first), or for every client.
pub(crate) async fn payment_of(
    store: &Store,
    client: Option<&str>,
    reference: &PaymentReference,
) -> StoreResult<Vec<(String, Payment)>> {
    let (client, reference) = (client.map(str::to_owned), reference.to_string());
    store
        .run("read a payment", async move |conn| {
            let now = conn.now().await?;
            let mut read = Sql::new("SELECT * FROM payments WHERE reference = ");
            read.bind(Bind::Text(reference));
            if let Some(client) = client {
                read.push(" AND client IN (")
                    .bind(Bind::Text(client))
                    .push(", '')");
            }
            read.push(" ORDER BY client DESC");
            let rows = conn
                .load_sql::<PaymentRow>(&read)
                .await
                .context("read a payment")?;
            let mut found = Vec::with_capacity(rows.len());
            for row in rows {
                let reservation = reservation_in(conn, &row.reservation_id, now)
                    .await?
                    .ok_or_else(|| {
                        StoreError::Corrupt(format!("reservation {} vanished", row.reservation_id))
                    })?;
                let refund = match &row.refund_id {
                    Some(id) => reservation
                        .refunds
                        .iter()
                        .find(|r| &r.refund_id == id)
                        .cloned(),
                    // A voided sale's own refund belongs to its fate.
                    None => reservation
                        .refunds
                        .iter()
                        .find(|r| {
                            r.reason == RefundReason::SaleVoided
                                && r.payment_reference == row.reference
                                && Some(&r.payment_client) == reservation.payment_client.as_ref()
                        })
                        .cloned(),
                };
                let fate = match row.refund_id {
                    Some(_) => PaymentOutcome::Refunded,
                    None => PaymentOutcome::Bought,
                };
                let payment = Payment {
                    payment_reference: row.reference,
                    fate,
                    reservation,
                    refund,
                };
                found.push((row.client, payment));
            }
            Ok(found)
        })
        .await
}

/// The stored asset (status not yet made effective), on `conn`.
pub(crate) async fn stored_asset(conn: &mut Conn<'_>, id: &str) -> StoreResult<Option<Asset>> {
    let mut read = Sql::new("SELECT * FROM assets WHERE id = ");
    read.bind(Bind::Text(id.to_owned()));
    let rows = conn
        .load_sql::<AssetRow>(&read)
        .await
        .context("read an asset")?;
    rows.into_iter()
        .next()
        .map(AssetRow::into_stored_asset)
        .transpose()
}
