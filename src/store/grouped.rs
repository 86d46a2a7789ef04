//! SQLite's group commit. Every write transaction goes to one thread, which
//! owns the writer connection. It takes whatever writes are queued when it
//! is free (at most [`GROUP_MAX`]), runs them one after the other in one
//! `BEGIN IMMEDIATE` transaction, each in a savepoint of its own, and commits
//! them together: one commit, one fsync, however many writes. No write waits
//! for company: a write that finds the thread idle runs alone at once, and
//! the writes that queue meanwhile form the next group.
//!
//! What each write is promised stays what a transaction of its own gives:
//!
//! - it runs alone on the database (the writes of a group run in turn, and
//!   each sees those before it, as if they had committed just before);
//! - it is answered only after the group's commit, so that an answer never
//!   tells of a write a crash could still lose (`synchronous` unchanged);
//! - its failure is its own: a write that fails or asks to be read again is
//!   rolled back to its savepoint, and the others of its group commit;
//! - a write whose caller gave up rolls back instead of committing (the
//!   call's [`Gate`], marked before its savepoint is released);
//! - when the database itself fails (a full disk, an I/O error) in a way
//!   that ends the transaction, the group ends there: the writes before it
//!   fail together, the ones after it run in the next group.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use diesel::connection::{AnsiTransactionManager, Connection, TransactionManager};
use diesel::r2d2::{ConnectionManager, Pool};
use diesel::result::Error as DieselError;
use diesel::sqlite::SqliteConnection;
use tokio::sync::oneshot;

use super::error::{Abort, StoreError, StoreResult};
use super::outcome::{Gate, WriteOutcome};

/// The most writes one commit carries: enough for every connection of a
/// busy server at once, few enough that the first of them is not kept long.
pub(crate) const GROUP_MAX: usize = 64;

/// The queue of writes, and the thread that commits them.
#[derive(Clone)]
pub(crate) struct Committer {
    queue: mpsc::Sender<Box<dyn Queued>>,
    /// How long a write may wait in the queue before it is refused.
    wait: Duration,
}

impl Committer {
    /// Starts the thread that writes on `pool`'s connection. It ends when the
    /// last `Committer` is dropped.
    pub(crate) fn start(
        pool: Pool<ConnectionManager<SqliteConnection>>,
        wait: Duration,
    ) -> StoreResult<Self> {
        let (queue, writes) = mpsc::channel::<Box<dyn Queued>>();
        std::thread::Builder::new()
            .name("holdfast-sqlite-writer".into())
            .spawn(move || commit_groups(&pool, &writes))
            .map_err(|e| StoreError::Config(format!("cannot start the SQLite writer: {e}")))?;
        Ok(Self { queue, wait })
    }

    /// Runs `work` as one write transaction of a group: its value, or how it
    /// was rolled back, once the group's commit has ended.
    pub(crate) async fn write<T, F>(
        &self,
        context: &'static str,
        gate: Option<Arc<Gate>>,
        work: F,
    ) -> StoreResult<Result<T, Abort>>
    where
        T: Send + 'static,
        F: FnOnce(&mut SqliteConnection) -> Result<T, Abort> + Send + 'static,
    {
        let (reply, mut answer) = oneshot::channel();
        let state = Arc::new(AtomicU8::new(QUEUED));
        let write = Write {
            context,
            work: Some(work),
            gate,
            state: state.clone(),
            result: None,
            opened: false,
            reply,
        };
        let stopped = || StoreError::unavailable(context, "the SQLite writer has stopped");
        self.queue.send(Box::new(write)).map_err(|_| stopped())?;
        // Queued for at most `wait`; once taken, it runs to its end.
        if let Ok(answer) = tokio::time::timeout(self.wait, &mut answer).await {
            return answer.map_err(|_| stopped())?;
        }
        if state
            .compare_exchange(QUEUED, GAVE_UP, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            let waited = format!("no connection came free within {:?}", self.wait);
            return Err(StoreError::unavailable(context, waited));
        }
        answer.await.map_err(|_| stopped())?
    }
}

/// A write waits in the queue,
const QUEUED: u8 = 0;
/// or was taken into a group,
const TAKEN: u8 = 1;
/// or its caller stopped waiting for it to be taken: it will never run.
const GAVE_UP: u8 = 2;

/// A queued write, whatever its value's type.
trait Queued: Send {
    /// Takes it into a group: false when nobody waits for it any more.
    fn take(&mut self) -> bool;
    /// Runs it in a savepoint of the open transaction.
    fn run(&mut self, conn: &mut SqliteConnection);
    /// Answers it with the fate of the group's commit.
    fn answer(self: Box<Self>, committed: &Result<(), String>);
}

struct Write<T, F> {
    context: &'static str,
    work: Option<F>,
    gate: Option<Arc<Gate>>,
    state: Arc<AtomicU8>,
    result: Option<Result<T, Abort>>,
    /// Its gate was marked before its savepoint was released.
    opened: bool,
    reply: oneshot::Sender<StoreResult<Result<T, Abort>>>,
}

impl<T, F> Queued for Write<T, F>
where
    T: Send + 'static,
    F: FnOnce(&mut SqliteConnection) -> Result<T, Abort> + Send + 'static,
{
    fn take(&mut self) -> bool {
        let taken = self
            .state
            .compare_exchange(QUEUED, TAKEN, Ordering::AcqRel, Ordering::Acquire);
        !self.reply.is_closed() && matches!(taken, Ok(_) | Err(TAKEN))
    }

    fn run(&mut self, conn: &mut SqliteConnection) {
        let Some(work) = self.work.take() else {
            return;
        };
        let (context, gate) = (self.context, self.gate.as_deref());
        let mut opened = false;
        let result = conn.transaction(|c| {
            let value = catch_unwind(AssertUnwindSafe(|| work(c))).unwrap_or_else(|_| {
                Err(Abort::Failed(StoreError::unavailable(
                    context,
                    "the write failed unexpectedly (a panic)",
                )))
            })?;
            if let Some(gate) = gate {
                if !gate.open_commit() {
                    return Err(Abort::Abandoned);
                }
                opened = true;
            }
            Ok(value)
        });
        self.opened = opened;
        self.result = Some(result);
    }

    fn answer(self: Box<Self>, committed: &Result<(), String>) {
        let Self {
            context,
            gate,
            result,
            opened,
            reply,
            ..
        } = *self;
        let Some(result) = result else {
            let reason = match committed {
                Err(e) => format!("no transaction could begin: {e}"),
                Ok(()) => "the write was not run".into(),
            };
            let _ = reply.send(Err(StoreError::unavailable(context, reason)));
            return;
        };
        let answer = match (committed, result) {
            (Ok(()), result) => {
                if let (true, Some(gate), Ok(_)) = (opened, &gate, &result) {
                    gate.close_commit(Ok(()), WriteOutcome::NotApplied);
                }
                result
            }
            // Rolled back to its savepoint before: it wrote nothing either way.
            (Err(_), Err(abort)) => Err(abort),
            // Its commit failed: whether it was written is not known (the
            // gate stays marked as committing).
            (Err(e), Ok(_)) => Err(Abort::Failed(StoreError::unavailable(
                context,
                format!("the commit failed: {e}"),
            ))),
        };
        let _ = reply.send(Ok(answer));
    }
}

/// The group's transaction is still open, each write's savepoint closed. A
/// savepoint that could not be rolled back leaves it broken (SQLite ends the
/// whole transaction on some errors: a full disk, an I/O error).
fn still_open(conn: &mut SqliteConnection) -> bool {
    matches!(
        AnsiTransactionManager::transaction_manager_status_mut(conn).transaction_depth(),
        Ok(Some(depth)) if depth.get() == 1
    )
}

/// The writer thread: group after group, until every sender is gone.
fn commit_groups(
    pool: &Pool<ConnectionManager<SqliteConnection>>,
    writes: &mpsc::Receiver<Box<dyn Queued>>,
) {
    let commits = metrics::counter!("holdfast_sqlite_commits_total");
    let grouped = metrics::counter!("holdfast_sqlite_grouped_writes_total");
    let mut carried: VecDeque<Box<dyn Queued>> = VecDeque::new();
    loop {
        if carried.is_empty() {
            match writes.recv() {
                Ok(first) => carried.push_back(first),
                Err(mpsc::RecvError) => return,
            }
        }
        while carried.len() < GROUP_MAX {
            match writes.try_recv() {
                Ok(next) => carried.push_back(next),
                Err(_) => break,
            }
        }
        let mut group: Vec<Box<dyn Queued>> = Vec::with_capacity(carried.len());
        while let Some(mut write) = carried.pop_front() {
            if write.take() {
                group.push(write);
            }
        }
        if group.is_empty() {
            continue;
        }
        let mut conn = match pool.get() {
            Ok(conn) => conn,
            Err(e) => {
                let failed = Err(format!("no connection: {e}"));
                group.into_iter().for_each(|w| w.answer(&failed));
                continue;
            }
        };
        // Runs the group until a write breaks the transaction; the writes
        // after it wait for the next group.
        let mut ran = 0;
        let committed = conn
            .immediate_transaction(|c| {
                for write in &mut group {
                    write.run(c);
                    ran += 1;
                    if !still_open(c) {
                        break;
                    }
                }
                Ok::<_, DieselError>(())
            })
            .map_err(|e| e.to_string());
        drop(conn);
        if ran == 0 {
            // The transaction did not begin (the database is locked by
            // another process, or failing): every write is refused.
            group.into_iter().for_each(|w| w.answer(&committed));
            continue;
        }
        commits.increment(1);
        grouped.increment(ran as u64);
        let rest = group.split_off(ran);
        group.into_iter().for_each(|w| w.answer(&committed));
        carried.extend(rest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::error::is_unique_violation;
    use diesel::connection::SimpleConnection;
    use diesel::prelude::*;
    use diesel::sql_query;
    use diesel::sql_types::BigInt;

    #[derive(QueryableByName)]
    struct N {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }

    fn count(url: &str) -> i64 {
        let mut c = SqliteConnection::establish(url).expect("a reader");
        sql_query("SELECT count(*) AS n FROM t")
            .get_result::<N>(&mut c)
            .expect("a count")
            .n
    }

    fn insert(c: &mut SqliteConnection, id: i64) -> Result<(), Abort> {
        sql_query("INSERT INTO t (id) VALUES (?)")
            .bind::<BigInt, _>(id)
            .execute(c)?;
        Ok(())
    }

    /// Forty writes queued behind a slow one commit together: each sees
    /// none of the others committed (only the slow one's row), and one
    /// write's failure, retry or panic takes nothing from the others.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_queued_together_commit_together_and_fail_alone() {
        let dir = std::env::temp_dir().join(format!("holdfast-grouped-{}", ulid::Ulid::new()));
        std::fs::create_dir_all(&dir).unwrap();
        let url = dir.join("t.db").display().to_string();
        {
            let mut c = SqliteConnection::establish(&url).unwrap();
            c.batch_execute("PRAGMA journal_mode = WAL; CREATE TABLE t (id INTEGER PRIMARY KEY);")
                .unwrap();
        }
        let pool = Pool::builder()
            .max_size(1)
            .build(ConnectionManager::<SqliteConnection>::new(url.clone()))
            .unwrap();
        let committer = Committer::start(pool, Duration::from_secs(10)).unwrap();

        let slow = {
            let committer = committer.clone();
            tokio::spawn(async move {
                committer
                    .write("test", None, |c| {
                        insert(c, 0)?;
                        std::thread::sleep(Duration::from_millis(300));
                        Ok(0)
                    })
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let writes: Vec<_> = (1..=40i64)
            .map(|i| {
                let (committer, url) = (committer.clone(), url.clone());
                tokio::spawn(async move {
                    committer
                        .write("test", None, move |c| {
                            insert(c, i)?;
                            let committed = count(&url);
                            match i % 4 {
                                0 => Ok(committed),
                                1 => Err(Abort::Retry),
                                2 => insert(c, 0).map(|()| committed),
                                _ => panic!("write {i} fails unexpectedly"),
                            }
                        })
                        .await
                })
            })
            .collect();
        assert_eq!(slow.await.unwrap().unwrap().unwrap(), 0);
        for (i, write) in (1..=40i64).zip(writes) {
            let result = write.await.unwrap().expect("every write answered");
            match (i % 4, result) {
                (0, Ok(committed)) => assert_eq!(committed, 1, "write {i} saw another commit"),
                (1, Err(Abort::Retry)) => {}
                (2, Err(Abort::Failed(e))) => assert!(is_unique_violation(&e), "{e}"),
                (3, Err(Abort::Failed(e))) => assert!(e.to_string().contains("panic"), "{e}"),
                (_, other) => panic!("write {i}: {other:?}"),
            }
        }
        let mut c = SqliteConnection::establish(&url).unwrap();
        let kept: Vec<i64> = sql_query("SELECT id AS n FROM t ORDER BY id")
            .load::<N>(&mut c)
            .unwrap()
            .into_iter()
            .map(|r| r.n)
            .collect();
        let expected: Vec<i64> = (0..=40).filter(|i| i % 4 == 0).collect();
        assert_eq!(kept, expected);
        drop(c);
        std::fs::remove_dir_all(&dir).ok();
    }
}
