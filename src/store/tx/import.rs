//! Importing a catalogue: batches of new assets written straight into the
//! database, each batch in one transaction, an id that exists left as it
//! is (and reported when its data differs). As the API's creation, an
//! import writes each asset's row and its rows of the attribute index, and
//! no event.
//!
//! PostgreSQL copies each batch into temporary tables (`COPY`, one round
//! trip for thousands of rows) and inserts from them in one statement, on a
//! connection of the importer's own; SQLite runs the API batch's statements
//! on its writer.

use std::collections::HashMap;

use futures_util::SinkExt;
use tokio_postgres::{Client, NoTls};

use super::catalogue::{insert_many, same_data, Written};
use crate::domain::AttributeValue;
use crate::store::api::NewAsset;
use crate::store::db::Store;
use crate::store::error::{StoreError, StoreResult};

/// What a batch did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ImportReport {
    /// Assets written.
    pub created: u64,
    /// Rows whose id existed with the same data (or appeared earlier in the
    /// batch with it): nothing to do.
    pub present: u64,
    /// Ids that existed with other data, left as they are.
    pub differing: Vec<String>,
}

impl ImportReport {
    pub fn add(&mut self, other: ImportReport) {
        self.created += other.created;
        self.present += other.present;
        self.differing.extend(other.differing);
    }
}

/// Writes batches of new assets into one store.
pub struct Importer {
    store: Store,
    /// PostgreSQL: the importer's own connection.
    postgres: Option<Client>,
}

impl Importer {
    pub(crate) async fn open(store: &Store) -> StoreResult<Self> {
        let postgres = match store.postgres_url() {
            Some(url) => Some(connect(url).await?),
            None => None,
        };
        Ok(Self {
            store: store.clone(),
            postgres,
        })
    }

    /// Whether another importer writes beside this one in parallel
    /// (PostgreSQL), rather than after it (SQLite's one writer).
    pub fn writes_concurrently(&self) -> bool {
        self.postgres.is_some()
    }

    /// After the last batch: PostgreSQL's statistics of the tables the
    /// import filled, so that the list's filters are planned for the
    /// catalogue as it now is rather than as it was before (autovacuum would
    /// catch up later).
    pub async fn finish(&mut self) -> StoreResult<()> {
        if let Some(client) = &self.postgres {
            client
                .batch_execute("ANALYZE assets, asset_attributes")
                .await
                .map_err(|e| {
                    StoreError::unavailable("analyze the imported tables", e.to_string())
                })?;
        }
        Ok(())
    }

    /// Writes one batch in one transaction: all of it, or (on an error)
    /// none of it.
    pub async fn write(&mut self, batch: &[NewAsset]) -> StoreResult<ImportReport> {
        let (unique, mut report) = first_of_each(batch);
        let written = match &mut self.postgres {
            Some(client) => copy(client, &unique).await?,
            None => on_writer(&self.store, unique).await?,
        };
        report.add(written);
        Ok(report)
    }
}

async fn connect(url: &str) -> StoreResult<Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .map_err(|e| StoreError::unavailable("connect for the import", e.to_string()))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "the import's connection ended");
        }
    });
    Ok(client)
}

/// The first row of each id in the batch, and the report of the others:
/// present when they repeat it, differing when they do not.
fn first_of_each(batch: &[NewAsset]) -> (Vec<NewAsset>, ImportReport) {
    let mut first: HashMap<&str, &NewAsset> = HashMap::with_capacity(batch.len());
    let mut unique = Vec::with_capacity(batch.len());
    let mut report = ImportReport::default();
    for item in batch {
        match first.get(item.id.as_str()) {
            None => {
                first.insert(item.id.as_str(), item);
                unique.push(item.clone());
            }
            Some(earlier) if same_data(earlier, item) => report.present += 1,
            Some(_) => report.differing.push(item.id.to_string()),
        }
    }
    (unique, report)
}

/// SQLite: the API batch's statements, on the writer, in one transaction.
async fn on_writer(store: &Store, batch: Vec<NewAsset>) -> StoreResult<ImportReport> {
    let written = store
        .write("import assets", async move |conn| {
            let now = conn.now().await?;
            let mut report = ImportReport::default();
            let written = insert_many(conn, &batch, now).await?;
            for (item, written) in batch.iter().zip(written) {
                match written {
                    Written::Created => report.created += 1,
                    Written::Same => report.present += 1,
                    Written::Differs => report.differing.push(item.id.to_string()),
                }
            }
            Ok(report)
        })
        .await?;
    written.ok_or_else(|| StoreError::unavailable("import assets", "the write did not run"))
}

/// PostgreSQL: the batch copied into temporary tables, the assets that
/// exist compared with it, then the new ones and their attributes
/// inserted in one statement.
async fn copy(client: &mut Client, batch: &[NewAsset]) -> StoreResult<ImportReport> {
    let failed = |e: tokio_postgres::Error| StoreError::unavailable("import assets", e.to_string());
    let tx = client.transaction().await.map_err(failed)?;
    tx.batch_execute(
        "CREATE TEMP TABLE import_assets (id text, name text, price_amount bigint, \
             price_currency text, attributes text) ON COMMIT DROP; \
         CREATE TEMP TABLE import_attributes (asset_id text, key text, kind text, \
             value text) ON COMMIT DROP",
    )
    .await
    .map_err(failed)?;
    let (assets, attributes) = copy_text(batch);
    for (table, rows) in [("import_assets", assets), ("import_attributes", attributes)] {
        let sink = tx
            .copy_in(&format!("COPY {table} FROM STDIN"))
            .await
            .map_err(failed)?;
        let mut sink = std::pin::pin!(sink);
        sink.send(bytes::Bytes::from(rows)).await.map_err(failed)?;
        sink.as_mut().finish().await.map_err(failed)?;
    }
    let created = tx
        .query_one(
            "WITH new AS ( \
                 INSERT INTO assets (id, name, price_amount, price_currency, attributes, \
                     created_at, updated_at) \
                 SELECT id, name, price_amount, price_currency, attributes, now(), now() \
                   FROM import_assets ORDER BY id \
                 ON CONFLICT (id) DO NOTHING RETURNING id), \
             indexed AS ( \
                 INSERT INTO asset_attributes (asset_id, key, kind, value) \
                 SELECT x.asset_id, x.key, x.kind, x.value \
                   FROM import_attributes x JOIN new ON new.id = x.asset_id) \
             SELECT count(*) FROM new",
            &[],
        )
        .await
        .map_err(failed)?
        .get::<_, i64>(0);
    let created = usize::try_from(created).unwrap_or_default();
    let mut report = ImportReport {
        created: created as u64,
        ..ImportReport::default()
    };
    if created < batch.len() {
        // Some ids existed: the rows just written are the file's, so every
        // other row that differs from the file existed with other data.
        let differing = tx
            .query(
                "SELECT i.id FROM import_assets i JOIN assets a ON a.id = i.id \
                 WHERE NOT (a.name = i.name \
                     AND a.price_amount IS NOT DISTINCT FROM i.price_amount \
                     AND a.price_currency IS NOT DISTINCT FROM i.price_currency \
                     AND a.attributes = i.attributes AND a.available_from IS NULL)",
                &[],
            )
            .await
            .map_err(failed)?;
        report.differing = differing.iter().map(|row| row.get(0)).collect();
        report.present = (batch.len() - created - report.differing.len()) as u64;
    }
    tx.commit().await.map_err(failed)?;
    Ok(report)
}

/// The batch in COPY's text format: the assets' rows and their
/// attributes' rows.
fn copy_text(batch: &[NewAsset]) -> (Vec<u8>, Vec<u8>) {
    let (mut assets, mut attributes) = (String::new(), String::new());
    for item in batch {
        let id = escaped(item.id.as_str());
        let (amount, currency) = match &item.price {
            Some(p) => (p.amount.to_string(), escaped(&p.currency)),
            None => (NULL.to_owned(), NULL.to_owned()),
        };
        let json = serde_json::to_string(&item.attributes).unwrap_or_else(|_| "{}".to_owned());
        let name = escaped(&item.name);
        let json = escaped(&json);
        assets.push_str(&format!("{id}\t{name}\t{amount}\t{currency}\t{json}\n"));
        for (key, value) in &item.attributes {
            let (kind, text) = AttributeValue::indexed(value);
            let (key, text) = (escaped(key), escaped(&text));
            attributes.push_str(&format!("{id}\t{key}\t{kind}\t{text}\n"));
        }
    }
    (assets.into_bytes(), attributes.into_bytes())
}

const NULL: &str = "\\N";

/// A value in COPY's text format: backslash, tab, newline and carriage
/// return escaped.
fn escaped(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_text_escapes_what_would_split_a_row() {
        assert_eq!(escaped("a\\b\tc\nd\re"), "a\\\\b\\tc\\nd\\re");
        assert_eq!(escaped("Plat B 1234 XYZ"), "Plat B 1234 XYZ");
    }
}
