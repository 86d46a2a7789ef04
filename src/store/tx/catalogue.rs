//! The catalogue: assets created one by one or in batches, and their
//! catalogue data changed (name, price, attributes). Catalogue changes bump
//! no version and never touch a hold; each writes an `asset.updated` event.
//!
//! Every write of an asset's attributes also writes its rows of
//! `asset_attributes`, the index the list's filters walk (see `read.rs`).

use std::collections::{HashMap, HashSet};

use diesel::sql_query;
use diesel::sql_types::{BigInt, Nullable, Text};

use super::{answered, contention, write_after, Keep, MAX_ATTEMPTS};
use serde_json::json;

use crate::domain::{format_timestamp, merged, Asset, AssetId, Attributes, EventType, Timestamp};
use crate::store::api::{
    Answer, AssetChange, BatchOutcome, ChangeOutcome, Idempotency, Keyed, NewAsset,
};
use crate::store::conn::{Bind, Conn, Sql};
use crate::store::db::Store;
use crate::store::error::{Abort, Context, StoreError, StoreResult};
use crate::store::rows::{AssetRow, NewEvent};
use crate::store::schema::Instant;

/// A new asset; `None` when one has this id.
pub(crate) async fn create(store: &Store, asset: &NewAsset) -> StoreResult<Option<Asset>> {
    let asset = asset.clone();
    let created = store
        .write("create an asset", async move |conn| {
            let now = conn.now().await?;
            Ok(insert(conn, &asset, now).await?)
        })
        .await?;
    Ok(created.flatten())
}

/// Writes `asset` at `now`, unless its id exists (`None`): the row and its
/// attributes' index rows.
pub(crate) async fn insert(
    conn: &mut Conn<'_>,
    asset: &NewAsset,
    now: Timestamp,
) -> StoreResult<Option<Asset>> {
    let mut insert = Sql::new(
        "INSERT INTO assets (id, name, price_amount, price_currency, attributes, \
             available_from, created_at, updated_at) VALUES (",
    );
    insert
        .bind(Bind::Text(asset.id.to_string()))
        .push(", ")
        .bind(Bind::Text(asset.name.clone()))
        .push(", ")
        .bind(Bind::OptBigInt(asset.price.as_ref().map(|p| p.amount)))
        .push(", ")
        .bind(Bind::OptText(
            asset.price.as_ref().map(|p| p.currency.clone()),
        ))
        .push(", ")
        .bind(Bind::Text(to_json(&asset.attributes)))
        .push(", ")
        .bind(Bind::OptAt(asset.available_from))
        .push(", ")
        .bind(Bind::At(now))
        .push(", ")
        .bind(Bind::At(now))
        .push(") ON CONFLICT DO NOTHING RETURNING *");
    let Some(row) = conn
        .load_sql::<AssetRow>(&insert)
        .await
        .context("create an asset")?
        .into_iter()
        .next()
    else {
        return Ok(None);
    };
    index_attributes(conn, asset.id.as_str(), &asset.attributes, false).await?;
    row.into_asset(now).map(Some)
}

/// Writes an asset's rows of the attribute index; with `replace`, its old
/// rows go first.
async fn index_attributes(
    conn: &mut Conn<'_>,
    id: &str,
    attributes: &Attributes,
    replace: bool,
) -> StoreResult<()> {
    if replace {
        let mut delete = Sql::new("DELETE FROM asset_attributes WHERE asset_id = ");
        delete.bind(Bind::Text(id.to_owned()));
        conn.execute_sql(&delete)
            .await
            .context("index the attributes")?;
    }
    if attributes.is_empty() {
        return Ok(());
    }
    let mut insert = Sql::new("INSERT INTO asset_attributes (asset_id, key, kind, value) VALUES ");
    for (i, (key, value)) in attributes.iter().enumerate() {
        let (kind, text) = value.indexed();
        insert.push(if i == 0 { "(" } else { ", (" });
        insert
            .bind(Bind::Text(id.to_owned()))
            .push(", ")
            .bind(Bind::Text(key.clone()))
            .push(", ")
            .bind(Bind::Text(kind.to_owned()))
            .push(", ")
            .bind(Bind::Text(text))
            .push(")");
    }
    conn.execute_sql(&insert)
        .await
        .context("index the attributes")?;
    Ok(())
}

fn to_json(attributes: &Attributes) -> String {
    serde_json::to_string(attributes).unwrap_or_else(|_| "{}".to_owned())
}

/// Changes an asset's catalogue data (and when its sale opens), its row
/// locked while the new attributes are merged.
pub(crate) async fn update(
    store: &Store,
    id: &AssetId,
    change: &AssetChange,
    client: &str,
) -> StoreResult<ChangeOutcome> {
    let (id, change, client) = (id.to_string(), change.clone(), client.to_owned());
    let changed = store
        .write("change the asset", async move |conn| {
            let now = conn.now().await?;
            let mut read = Sql::new("SELECT * FROM assets WHERE id = ");
            read.bind(Bind::Text(id.clone()));
            if conn.is_postgres() {
                read.push(" FOR UPDATE");
            }
            let rows = conn
                .load_sql::<AssetRow>(&read)
                .await
                .context("read the asset")?;
            let Some(current) = rows.into_iter().next() else {
                return Ok(ChangeOutcome::NotFound);
            };
            let current = current.into_stored_asset()?;
            let attributes = match change.attributes.clone() {
                Some(patch) => match merged(&current.attributes, patch) {
                    Ok(attributes) => Some(attributes),
                    Err(error) => return Ok(ChangeOutcome::TooManyAttributes(error)),
                },
                None => None,
            };
            let name = change.name.clone().unwrap_or(current.name.clone());
            let price = change.price.clone().unwrap_or(current.price.clone());
            let catalogue = change.name.is_some() || change.price.is_some() || attributes.is_some();
            let attributes = attributes.unwrap_or(current.attributes.clone());
            let (available_from, opening) = match change.available_from {
                Some(at) => (at, 1),
                None => (current.available_from, 0),
            };
            // An opening moved earlier or removed: the asset stays free to hold
            // only since it was by the opening before (`hold_decision`), or
            // since now when that opening was still ahead.
            let opened = match (opening, current.available_from) {
                (1, Some(before)) if available_from != Some(before) => Some(before.min(now)),
                _ => None,
            };
            let update = sql_query(
                "UPDATE assets SET name = $1, price_amount = $2, price_currency = $3, \
                     attributes = $4, available_from = $5, version = version + $6, \
                     updated_at = $7, \
                     available_since = CASE WHEN $8 IS NULL OR available_since >= $8 \
                         THEN available_since ELSE $8 END \
                 WHERE id = $9 RETURNING *",
            )
            .bind::<Text, _>(&name)
            .bind::<Nullable<BigInt>, _>(price.as_ref().map(|p| p.amount))
            .bind::<Nullable<Text>, _>(price.as_ref().map(|p| p.currency.clone()))
            .bind::<Text, _>(to_json(&attributes))
            .bind::<Nullable<Instant>, _>(available_from)
            .bind::<BigInt, _>(opening)
            .bind::<Instant, _>(now)
            .bind::<Nullable<Instant>, _>(opened)
            .bind::<Text, _>(&id);
            let row: AssetRow = conn.first(update).await.context("change the asset")?;
            if attributes != current.attributes {
                index_attributes(conn, &id, &attributes, true).await?;
            }
            let asset = row.into_asset(now)?;
            if catalogue {
                let data = serde_json::to_string(&asset).unwrap_or_default();
                let event = NewEvent::new(&id, EventType::AssetUpdated, data, now).by(&client);
                write_after(conn, &id, None, vec![event], None, now).await?;
            }
            Ok(ChangeOutcome::Changed(asset))
        })
        .await?;
    changed.ok_or_else(|| contention("change the asset"))
}

/// Creates a batch of assets, all or none: an item identical to an existing
/// asset counts as unchanged, one naming an existing asset with other data
/// is a conflict, and any conflict writes nothing. The answer is kept under
/// the request's key.
pub(crate) async fn create_many(
    store: &Store,
    items: &[NewAsset],
    idempotency: &Idempotency,
) -> StoreResult<Keyed<BatchOutcome>> {
    for _ in 0..MAX_ATTEMPTS {
        if let Some(stored) = stored_answer(store, idempotency).await? {
            return Ok(answered(stored, idempotency));
        }
        let (store_, items, key) = (store.clone(), items.to_vec(), idempotency.clone());
        let written = store
            .write("create the assets", async move |conn| {
                let now = conn.now().await?;
                let (mut created, mut unchanged, mut conflicts) =
                    (Vec::new(), Vec::new(), Vec::new());
                let written = insert_many(conn, &items, now).await?;
                for (index, (item, written)) in items.iter().zip(written).enumerate() {
                    match written {
                        Written::Created => created.push(item.id.to_string()),
                        Written::Same => unchanged.push(item.id.to_string()),
                        Written::Differs => conflicts.push((index, item.id.to_string())),
                    }
                }
                if !conflicts.is_empty() {
                    return Err(Abort::Conflict(conflicts));
                }
                let answer = store_.render(Answer::Batch {
                    created: &created,
                    unchanged: &unchanged,
                });
                let keep = Keep {
                    idempotency: &key,
                    answer: &answer,
                    reservation_id: None,
                };
                super::store_answer(conn, keep, now).await?;
                Ok(BatchOutcome::Created { created, unchanged })
            })
            .await;
        match written {
            Ok(Some(outcome)) => return Ok(Keyed::Done(outcome)),
            // The key was kept by a concurrent duplicate: replay it.
            Ok(None) => continue,
            Err(StoreError::Conflicts(conflicts)) => {
                return Ok(Keyed::Done(BatchOutcome::Conflicts(conflicts)))
            }
            Err(e) => return Err(e),
        }
    }
    Err(contention("create the assets"))
}

/// What writing a new asset did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Written {
    Created,
    /// Its id existed with the same catalogue data.
    Same,
    /// Its id existed with other data, left as it is.
    Differs,
}

/// The new assets, from a JSON array of rows; `$1` the clock, `$2` the
/// array. Written in id order, so that two batches naming the same ids wait
/// for each other rather than deadlock.
const PG_INSERT_MANY: &str = "INSERT INTO assets (id, name, price_amount, price_currency, \
         attributes, available_from, created_at, updated_at) \
     SELECT x.id, x.name, x.price_amount, x.price_currency, x.attributes, x.available_from, \
         $1, $1 \
     FROM jsonb_to_recordset($2::jsonb) AS x(id text, name text, price_amount bigint, \
         price_currency text, attributes text, available_from timestamptz) \
     ORDER BY x.id \
     ON CONFLICT DO NOTHING RETURNING id";
const LITE_INSERT_MANY: &str = "INSERT INTO assets (id, name, price_amount, price_currency, \
         attributes, available_from, created_at, updated_at) \
     SELECT json_extract(value, '$.id'), json_extract(value, '$.name'), \
         json_extract(value, '$.price_amount'), json_extract(value, '$.price_currency'), \
         json_extract(value, '$.attributes'), json_extract(value, '$.available_from'), $1, $1 \
     FROM json_each($2) WHERE true \
     ON CONFLICT DO NOTHING RETURNING id";
/// The attributes' index rows, from a JSON array of rows.
const PG_INDEX_MANY: &str = "INSERT INTO asset_attributes (asset_id, key, kind, value) \
     SELECT x.asset_id, x.key, x.kind, x.value \
     FROM jsonb_to_recordset($1::jsonb) AS x(asset_id text, key text, kind text, value text)";
const LITE_INDEX_MANY: &str = "INSERT INTO asset_attributes (asset_id, key, kind, value) \
     SELECT json_extract(value, '$.asset_id'), json_extract(value, '$.key'), \
         json_extract(value, '$.kind'), json_extract(value, '$.value') \
     FROM json_each($1)";
/// The assets whose ids a JSON array names.
const PG_READ_MANY: &str =
    "SELECT * FROM assets WHERE id IN (SELECT jsonb_array_elements_text($1::jsonb))";
const LITE_READ_MANY: &str = "SELECT * FROM assets WHERE id IN (SELECT value FROM json_each($1))";

/// Writes at `now` every item whose id does not exist, and compares the
/// others (and an item repeating an earlier item's id) with what is
/// stored: what happened to each item, in item order. A few statements
/// whatever the number of items, each with the same text every time.
pub(crate) async fn insert_many(
    conn: &mut Conn<'_>,
    items: &[NewAsset],
    now: Timestamp,
) -> StoreResult<Vec<Written>> {
    let mut first: HashMap<&str, &NewAsset> = HashMap::with_capacity(items.len());
    let mut unique = Vec::with_capacity(items.len());
    for item in items {
        first.entry(item.id.as_str()).or_insert_with(|| {
            unique.push(item);
            item
        });
    }
    let rows: Vec<serde_json::Value> = unique
        .iter()
        .map(|item| {
            json!({
                "id": item.id.as_str(),
                "name": item.name,
                "price_amount": item.price.as_ref().map(|p| p.amount),
                "price_currency": item.price.as_ref().map(|p| p.currency.as_str()),
                "attributes": to_json(&item.attributes),
                "available_from": item.available_from.as_ref().map(format_timestamp),
            })
        })
        .collect();
    let pg = conn.is_postgres();
    let insert = Sql::new(if pg { PG_INSERT_MANY } else { LITE_INSERT_MANY })
        .with(Bind::At(now))
        .with(Bind::Text(serde_json::Value::Array(rows).to_string()));
    let created: HashSet<String> = conn
        .load_sql::<IdRow>(&insert)
        .await
        .context("create the assets")?
        .into_iter()
        .map(|row| row.id)
        .collect();
    let index: Vec<serde_json::Value> = unique
        .iter()
        .filter(|item| created.contains(item.id.as_str()))
        .flat_map(|item| {
            item.attributes.iter().map(|(key, value)| {
                let (kind, text) = value.indexed();
                json!({"asset_id": item.id.as_str(), "key": key, "kind": kind, "value": text})
            })
        })
        .collect();
    if !index.is_empty() {
        let insert = Sql::new(if pg { PG_INDEX_MANY } else { LITE_INDEX_MANY })
            .with(Bind::Text(serde_json::Value::Array(index).to_string()));
        conn.execute_sql(&insert)
            .await
            .context("index the attributes")?;
    }
    let existing: Vec<&str> = unique
        .iter()
        .map(|item| item.id.as_str())
        .filter(|id| !created.contains(*id))
        .collect();
    let mut stored: HashMap<String, Asset> = HashMap::with_capacity(existing.len());
    if !existing.is_empty() {
        let read = Sql::new(if pg { PG_READ_MANY } else { LITE_READ_MANY })
            .with(Bind::Text(json!(existing).to_string()));
        for row in conn
            .load_sql::<AssetRow>(&read)
            .await
            .context("read the existing assets")?
        {
            let asset = row.into_stored_asset()?;
            stored.insert(asset.id.to_string(), asset);
        }
    }
    Ok(items
        .iter()
        .map(|item| {
            let id = item.id.as_str();
            if created.contains(id) {
                // Created by its first item; a later one repeats it or not.
                let earlier = first[id];
                if std::ptr::eq(earlier, item) {
                    Written::Created
                } else if same_data(earlier, item) {
                    Written::Same
                } else {
                    Written::Differs
                }
            } else {
                match stored.get(id) {
                    Some(asset) if identical(asset, item) => Written::Same,
                    _ => Written::Differs,
                }
            }
        })
        .collect())
}

#[derive(diesel::QueryableByName)]
struct IdRow {
    #[diesel(sql_type = Text)]
    id: String,
}

/// Whether two items carry the same catalogue data.
pub(crate) fn same_data(a: &NewAsset, b: &NewAsset) -> bool {
    a.name == b.name
        && a.price == b.price
        && a.attributes == b.attributes
        && a.available_from == b.available_from
}

/// Whether an existing asset has exactly the catalogue data of `item`.
fn identical(existing: &Asset, item: &NewAsset) -> bool {
    existing.name == item.name
        && existing.price == item.price
        && existing.attributes == item.attributes
        && existing.available_from == item.available_from
}

/// The answer kept under a key, if any.
async fn stored_answer(
    store: &Store,
    idempotency: &Idempotency,
) -> StoreResult<Option<super::StoredAnswer>> {
    let key = idempotency.clone();
    store
        .run("read the idempotency key", async move |conn| {
            let now = conn.now().await?;
            let row = super::read_key(conn, &key, now).await?;
            Ok(row.stored.into_answer())
        })
        .await
}
