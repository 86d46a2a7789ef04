//! One connection of either backend, so that a statement both dialects
//! share is written once.
//!
//! A transition is an `async fn` over a [`Conn`]. A statement built with
//! diesel's query builder is sent with [`Conn::execute`], [`Conn::load`],
//! [`Conn::first`] or [`Conn::optional`], which accept any query that both
//! backends can run: the query's type is concrete where it is built, so the
//! compiler checks it against both dialects there, with no generic backend
//! in sight. Where the dialects' SQL must differ, the transition matches on
//! the connection and shows both side by side.
//!
//! Raw SQL that both dialects run numbers its parameters `$1`, `$2`… in the
//! order they first appear in its text: PostgreSQL reads them as positions,
//! SQLite as names, numbered in the order they first appear.
//!
//! On PostgreSQL the statement is awaited on diesel-async's connection. On
//! SQLite it runs as it is on the blocking thread that owns the connection:
//! its branch never waits, so a whole SQLite transaction, written as async
//! code, completes in one poll ([`on_sqlite`]). This was chosen over
//! diesel-async's `SyncConnectionWrapper`, which would send every SQLite
//! statement to a blocking thread of its own (one hop per statement instead
//! of one per transaction), and over instantiating the shared code once per
//! backend with a macro, which hid it from rustfmt and the IDE.

use std::future::Future;

use diesel::backend::Backend;
use diesel::connection::LoadConnection;
use diesel::pg::Pg;
use diesel::query_builder::{AstPass, BoxedSqlQuery, Query, QueryFragment, QueryId, SqlQuery};
use diesel::query_dsl::methods::LoadQuery;
use diesel::serialize::ToSql;
use diesel::sql_query;
use diesel::sql_types::{Array, BigInt, HasSqlType, Nullable, Text, Untyped};
use diesel::sqlite::{Sqlite, SqliteConnection};
use diesel::QueryResult;
use diesel::QueryableByName;
use diesel_async::AsyncPgConnection;

use super::api::{EVENTS_PAGE_DEFAULT, PAGE_DEFAULT};
use super::error::Context;
use super::error::{StoreError, StoreResult};
use super::postgres::Prepared;
use super::rows::{Count, NewEvent};
use super::schema::Instant;
use crate::domain::{Timestamp, Via};

/// A query both backends can load rows of type `U` from; on SQLite it is
/// sent [`Prepared`], kept by the connection under its text.
pub(crate) trait Loads<'q, U>:
    diesel_async::methods::LoadQuery<'q, AsyncPgConnection, U> + Send + 'q
{
    fn load_on_sqlite(self, conn: &mut SqliteConnection) -> QueryResult<Vec<U>>;
}

impl<'q, U, Q> Loads<'q, U> for Q
where
    Q: diesel_async::methods::LoadQuery<'q, AsyncPgConnection, U> + Send + 'q,
    Prepared<Q>: LoadQuery<'q, SqliteConnection, U>,
{
    fn load_on_sqlite(self, conn: &mut SqliteConnection) -> QueryResult<Vec<U>> {
        diesel::RunQueryDsl::load(Prepared(self), conn)
    }
}

/// A statement both backends can run; on SQLite it is sent [`Prepared`].
pub(crate) trait Executes:
    diesel_async::methods::ExecuteDsl<AsyncPgConnection> + Send
{
    fn execute_on_sqlite(self, conn: &mut SqliteConnection) -> QueryResult<usize>;
}

impl<Q> Executes for Q
where
    Q: diesel_async::methods::ExecuteDsl<AsyncPgConnection> + Send,
    Prepared<Q>: Query<SqlType = Untyped> + QueryFragment<Sqlite> + QueryId,
{
    /// Runs it as a query whose rows are read (none): that path hands the
    /// statement to diesel's cache by value, where [`Prepared`] keeps it.
    /// diesel's `execute` passes it by reference, through which a raw
    /// statement never counts as safe to keep, and every call would compile
    /// it again (a fifth of the SQLite writer's time). Then `changes()`: the
    /// rows it changed.
    fn execute_on_sqlite(self, conn: &mut SqliteConnection) -> QueryResult<usize> {
        for row in LoadConnection::load(conn, Prepared(self))? {
            row?;
        }
        let changed: Vec<Count> =
            diesel::RunQueryDsl::load(Prepared(sql_query("SELECT changes() AS n")), conn)?;
        let n = changed.first().map_or(0, |c| c.n);
        usize::try_from(n).map_err(|e| diesel::result::Error::DeserializationError(e.into()))
    }
}

impl<Q: QueryFragment<Sqlite>> QueryFragment<Sqlite> for Prepared<Q> {
    fn walk_ast<'b>(&'b self, pass: AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
        self.0.walk_ast(pass)
    }

    fn is_safe_to_cache_prepared(&self, _: &Sqlite) -> QueryResult<bool> {
        Ok(true)
    }
}

impl<Q, C> diesel::RunQueryDsl<C> for Prepared<Q> {}

/// A connection of either backend, inside or outside a transaction.
pub(crate) enum Conn<'c> {
    Pg(&'c mut AsyncPgConnection),
    Lite(&'c mut SqliteConnection),
}

impl Conn<'_> {
    /// Runs a statement; how many rows it changed.
    pub(crate) async fn execute<Q: Executes>(&mut self, query: Q) -> QueryResult<usize> {
        match self {
            Conn::Pg(c) => diesel_async::RunQueryDsl::execute(query, *c).await,
            Conn::Lite(c) => query.execute_on_sqlite(c),
        }
    }

    /// Every row a query answers.
    pub(crate) async fn load<'q, Q, U>(&mut self, query: Q) -> QueryResult<Vec<U>>
    where
        Q: Loads<'q, U>,
        U: Send,
    {
        match self {
            Conn::Pg(c) => diesel_async::RunQueryDsl::load(query, *c).await,
            Conn::Lite(c) => query.load_on_sqlite(c),
        }
    }

    /// The first row a query answers; `NotFound` when there is none.
    pub(crate) async fn first<'q, Q, U>(&mut self, query: Q) -> QueryResult<U>
    where
        Q: Loads<'q, U>,
        U: Send,
    {
        self.load(query)
            .await?
            .into_iter()
            .next()
            .ok_or(diesel::result::Error::NotFound)
    }

    /// The first row a query answers, if any.
    pub(crate) async fn optional<'q, Q, U>(&mut self, query: Q) -> QueryResult<Option<U>>
    where
        Q: Loads<'q, U>,
        U: Send,
    {
        Ok(self.load(query).await?.into_iter().next())
    }

    pub(crate) fn is_postgres(&self) -> bool {
        matches!(self, Conn::Pg(_))
    }

    /// The database's clock: PostgreSQL's `now()` (the transaction's start,
    /// inside one), SQLite's process clock.
    pub(crate) async fn now(&mut self) -> StoreResult<Timestamp> {
        match self {
            Conn::Pg(c) => super::postgres::db_now(c).await,
            Conn::Lite(_) => Ok(super::sqlite::clock()),
        }
    }

    /// The clock once the transaction holds what it waited for: on
    /// PostgreSQL the start of this statement (`now()` is the transaction's
    /// start, which may precede a wait for a lock, and a change that came
    /// first would then seem to come after), SQLite's process clock.
    pub(crate) async fn now_after_locks(&mut self) -> StoreResult<Timestamp> {
        match self {
            Conn::Pg(c) => super::postgres::db_clock(c, "statement_timestamp()").await,
            Conn::Lite(_) => Ok(super::sqlite::clock()),
        }
    }

    /// Locks an asset's row until the end of the transaction, as every change
    /// of the asset or of its reservations does first: what the transaction
    /// reads afterwards no concurrent change can move before it commits.
    /// SQLite's write transactions hold the database's one write lock from
    /// their `BEGIN IMMEDIATE`: there an asset needs no lock of its own.
    pub(crate) async fn lock_asset(&mut self, asset: &str) -> StoreResult<()> {
        if let Conn::Pg(c) = self {
            let lock = sql_query("SELECT 1 FROM assets WHERE id = $1 FOR UPDATE");
            diesel_async::RunQueryDsl::execute(Prepared(lock.bind::<Text, _>(asset)), *c)
                .await
                .context("lock the asset")?;
        }
        Ok(())
    }

    /// Records an event; its client is the one it names, else the client
    /// of the reservation it reports. On SQLite its feed position is one above the last one handed
    /// out, which `feed_position` keeps in a row that purging never deletes
    /// (its trigger moves it up in the same transaction): positions only ever
    /// grow, whatever the clock does. PostgreSQL orders its feed by
    /// transaction id instead (`feed.rs`).
    pub(crate) async fn insert_event(&mut self, event: &NewEvent) -> StoreResult<()> {
        const PG: &str = "\
INSERT INTO events (id, asset_id, sequence, type, data, created_at, client, actor, via)
VALUES ($1, $2, $3, $4, $5, $6,
        coalesce($10, (SELECT client FROM reservations WHERE id = $7)), $8, $9)";
        const LITE: &str = "\
INSERT INTO events (position, id, asset_id, sequence, type, data, created_at, client, actor, via)
VALUES ((SELECT last_position FROM feed_position) + 1,
        ?1, ?2, ?3, ?4, ?5, ?6, coalesce(?10, (SELECT client FROM reservations WHERE id = ?7)),
        ?8, ?9)";
        match self {
            Conn::Pg(c) => {
                diesel_async::RunQueryDsl::execute(Prepared(event.bound::<Pg>(PG)), *c).await
            }
            Conn::Lite(c) => {
                diesel::RunQueryDsl::execute(Prepared(event.bound::<Sqlite>(LITE)), *c)
            }
        }
        .context("record an event")?;
        Ok(())
    }

    /// Records several events, as [`Conn::insert_event`] each: on
    /// PostgreSQL in one statement (a janitor's pass writes an event per
    /// lapsed hold, and one round trip each was most of its time); each
    /// reported reservation's client is read by its primary key, in a
    /// subquery per row, so no plan can join the reservations wholesale.
    /// SQLite runs in the process, where a statement per event costs no
    /// round trip.
    pub(crate) async fn insert_events(&mut self, events: &[NewEvent]) -> StoreResult<()> {
        const PG: &str = "\
INSERT INTO events (id, asset_id, sequence, type, data, created_at, client, actor, via)
SELECT e.id, e.asset_id, e.sequence, e.type, e.data, e.created_at,
       coalesce(e.client, (SELECT client FROM reservations WHERE id = e.reservation_id)),
       e.actor, e.via
  FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::timestamptz[],
              $7::text[], $8::text[], $9::text[], $10::text[])
       AS e(id, asset_id, sequence, type, data, created_at, reservation_id, actor, via, client)";
        let c = match self {
            Conn::Pg(c) if events.len() > 1 => c,
            _ => {
                for event in events {
                    self.insert_event(event).await?;
                }
                return Ok(());
            }
        };
        fn column<T>(events: &[NewEvent], f: impl Fn(&NewEvent) -> T) -> Vec<T> {
            events.iter().map(f).collect()
        }
        let query = sql_query(PG)
            .bind::<Array<Text>, _>(column(events, |e| e.id.clone()))
            .bind::<Array<Text>, _>(column(events, |e| e.asset_id.clone()))
            .bind::<Array<BigInt>, _>(column(events, |e| e.sequence))
            .bind::<Array<Text>, _>(column(events, |e| e.event_type.as_str()))
            .bind::<Array<Text>, _>(column(events, |e| e.data.clone()))
            .bind::<Array<Instant>, _>(column(events, |e| e.created_at))
            .bind::<Array<Nullable<Text>>, _>(column(events, |e| e.reservation_id.clone()))
            .bind::<Array<Nullable<Text>>, _>(column(events, |e| e.actor.clone()))
            .bind::<Array<Nullable<Text>>, _>(column(events, |e| e.via.map(Via::as_str)))
            .bind::<Array<Nullable<Text>>, _>(column(events, |e| e.client.clone()));
        diesel_async::RunQueryDsl::execute(Prepared(query), *c)
            .await
            .context("record events")?;
        Ok(())
    }
}

/// A value bound to a parameter of raw SQL.
#[derive(Debug, Clone)]
pub(crate) enum Bind {
    Text(String),
    OptText(Option<String>),
    BigInt(i64),
    OptBigInt(Option<i64>),
    At(Timestamp),
    OptAt(Option<Timestamp>),
}

/// Raw SQL built piece by piece, for statements whose shape depends on the
/// request (a list's filters). Its parameters are numbered `$1`, `$2`… in
/// the order they are added, which is the order they first appear: both
/// dialects read that numbering alike (PostgreSQL by position, SQLite by
/// name in order of first appearance).
#[derive(Debug, Clone, Default)]
pub(crate) struct Sql {
    text: String,
    binds: Vec<Bind>,
}

impl Sql {
    pub(crate) fn new(text: &str) -> Self {
        Self {
            text: text.to_owned(),
            binds: Vec::new(),
        }
    }

    /// Appends text.
    pub(crate) fn push(&mut self, text: &str) -> &mut Self {
        self.text.push_str(text);
        self
    }

    /// Binds the next parameter, which the text already names.
    pub(crate) fn with(mut self, value: Bind) -> Self {
        self.binds.push(value);
        self
    }

    /// Appends the next parameter, bound to `value`.
    pub(crate) fn bind(&mut self, value: Bind) -> &mut Self {
        self.binds.push(value);
        self.text.push('$');
        self.text.push_str(&self.binds.len().to_string());
        self
    }

    /// Appends ` LIMIT` and the number of rows a page reads, for a page
    /// whose best plan does not depend on the values bound (no price
    /// bound, say). The sizes of the default pages ([`PAGE_DEFAULT`] and
    /// [`EVENTS_PAGE_DEFAULT`], each with the one row that tells whether a
    /// next page exists) are written into the text; any other is bound.
    /// PostgreSQL keeps a prepared statement's generic plan only when it
    /// costs less than a plan made for each request, and prices a bound
    /// limit as a tenth of the rows: on a large catalogue the attribute page
    /// was then planned anew for every request, its planning costing more
    /// than its reads (bench/RESULTS.md, section `catalogue`). Other sizes
    /// share one statement, so a client cycling through limits cannot grow
    /// the statement cache.
    pub(crate) fn limit(&mut self, rows: i64) -> &mut Self {
        self.push(" LIMIT ");
        if rows == PAGE_DEFAULT + 1 || rows == EVENTS_PAGE_DEFAULT + 1 {
            self.push(&rows.to_string())
        } else {
            self.bind(Bind::BigInt(rows))
        }
    }

    fn boxed<DB>(&self) -> BoxedSqlQuery<'static, DB, SqlQuery>
    where
        DB: Backend + HasSqlType<Text> + HasSqlType<BigInt> + HasSqlType<Instant> + 'static,
        String: ToSql<Text, DB>,
        i64: ToSql<BigInt, DB>,
        Timestamp: ToSql<Instant, DB>,
    {
        let mut query = sql_query(self.text.clone()).into_boxed::<DB>();
        for bind in &self.binds {
            query = match bind.clone() {
                Bind::Text(v) => query.bind::<Text, _>(v),
                Bind::OptText(v) => query.bind::<Nullable<Text>, _>(v),
                Bind::BigInt(v) => query.bind::<BigInt, _>(v),
                Bind::OptBigInt(v) => query.bind::<Nullable<BigInt>, _>(v),
                Bind::At(v) => query.bind::<Instant, _>(v),
                Bind::OptAt(v) => query.bind::<Nullable<Instant>, _>(v),
            };
        }
        query
    }
}

impl Conn<'_> {
    /// Every row `sql` answers.
    pub(crate) async fn load_sql<U>(&mut self, sql: &Sql) -> QueryResult<Vec<U>>
    where
        U: QueryableByName<Pg> + QueryableByName<Sqlite> + Send + 'static,
    {
        match self {
            Conn::Pg(c) => diesel_async::RunQueryDsl::load(Prepared(sql.boxed::<Pg>()), *c).await,
            Conn::Lite(c) => diesel::RunQueryDsl::load(Prepared(sql.boxed::<Sqlite>()), *c),
        }
    }

    /// How many rows `sql` changed.
    pub(crate) async fn execute_sql(&mut self, sql: &Sql) -> QueryResult<usize> {
        match self {
            Conn::Pg(c) => {
                diesel_async::RunQueryDsl::execute(Prepared(sql.boxed::<Pg>()), *c).await
            }
            Conn::Lite(c) => diesel::RunQueryDsl::execute(Prepared(sql.boxed::<Sqlite>()), *c),
        }
    }
}

/// Runs SQLite work written as async code over a [`Conn::Lite`] on the
/// calling (blocking) thread: its statements never wait, so it completes
/// in one poll. Work that would wait (a bug) fails instead of blocking.
pub(crate) fn on_sqlite<T, E>(work: impl Future<Output = Result<T, E>>) -> Result<T, E>
where
    E: From<StoreError>,
{
    futures_util::FutureExt::now_or_never(work).unwrap_or_else(|| {
        Err(
            StoreError::Corrupt("SQLite work waited on something other than its connection".into())
                .into(),
        )
    })
}
