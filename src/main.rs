use std::process::ExitCode;

use clap::{Parser, Subcommand};
use holdfast::{janitor, telemetry, Application, Config, Store};

/// jemalloc: a request allocates on one thread and is often freed on
/// another (the HTTP worker, the store's runtime); its thread caches keep that
/// cheap, about a tenth of a flash-sale loser's instructions, for a few MiB.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Hold-and-commit reservations for one-of-a-kind assets.
#[derive(Parser)]
#[command(name = "holdfast", version, about)]
struct Cli {
    #[command(flatten)]
    config: Config,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the API (the default).
    Serve {
        /// Do not migrate the database on start.
        #[arg(
            long,
            env = "HOLDFAST_NO_MIGRATE",
            action = clap::ArgAction::SetTrue,
            value_parser = clap::builder::BoolishValueParser::new()
        )]
        no_migrate: bool,
    },
    /// Migrate the database and exit.
    Migrate,
    /// Print the OpenAPI document.
    Openapi,
    /// Write a consistent copy of the live SQLite database to PATH.
    Backup {
        /// Where to write the copy; must not exist yet.
        path: std::path::PathBuf,
    },
    /// Put an SQLite backup in place of the (stopped) embedded database.
    Restore {
        /// A copy written by `holdfast backup`.
        path: std::path::PathBuf,
    },
    /// Check every invariant in the database; exit 1 when one is violated.
    ///
    /// Each check is one statement, a pass over the tables it reads; the
    /// audit is not a request, so its statements may take up to its own
    /// budget instead of HOLDFAST_DB_STATEMENT_TIMEOUT_MS. Each check's
    /// verdict and time go to stderr as it ends.
    Audit {
        /// One JSON document instead of text.
        #[arg(long)]
        json: bool,
        /// Longest time one check may take, in seconds.
        #[arg(long, default_value_t = 900)]
        budget_seconds: u64,
    },
    /// Load a catalogue from a CSV or JSON Lines file into the database.
    ///
    /// CSV: a header `id,name,price_amount,price_currency` and any `attr.KEY`
    /// columns (the price columns and the attributes are optional; an empty
    /// cell is absent). An attribute cell `true` or `false` is a boolean, a
    /// whole number (`42`, `-7`; not `007`) an integer, anything else a
    /// string. JSON Lines: one object per line, each the body of
    /// `POST /v1/assets`, with typed attributes.
    ///
    /// Every row is checked as the API checks it. An id that exists is left
    /// as it is, so running the same file again changes nothing. A bad row
    /// stops the import with its line number; the batches before it stay.
    Import {
        /// The file (`-` for standard input).
        path: std::path::PathBuf,
        /// csv or jsonl; by default from the file's extension (.csv,
        /// .jsonl, .ndjson).
        #[arg(long, value_enum)]
        format: Option<holdfast::import::Format>,
        /// Rows per transaction.
        #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        batch_size: u32,
        /// Batches written at once on PostgreSQL, each on a connection of
        /// its own (SQLite has one writer).
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=16))]
        writers: u8,
    },
    /// Manage API keys.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Deliver due events to HOLDFAST_WEBHOOK_URL.
    Dispatch {
        /// One pass (every due event once), then exit.
        #[arg(long)]
        once: bool,
    },
    /// Run the janitor: expire lapsed holds, purge old idempotency records.
    Sweep {
        /// One pass, then exit.
        #[arg(long)]
        once: bool,
    },
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Print a fresh random token (once) and the entry to configure for it.
    New {
        /// The key's name: what idempotency and ownership are scoped by; keep
        /// it when rotating the token.
        #[arg(long)]
        name: String,
        /// admin, storefront or payments.
        #[arg(long)]
        role: String,
    },
}

/// Blocking threads beyond the database pool's: migrations, backups, restores.
const SPARE_BLOCKING_THREADS: usize = 8;

fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init(cli.config.log_format);
    // SQLite's calls run on blocking threads, at most the pool's connections
    // and the writer at once: more threads than that would only add memory
    // (each keeps heaps of its own).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(cli.config.db_pool_size + SPARE_BLOCKING_THREADS)
        .build();
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("holdfast: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("holdfast: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), String> {
    let config = cli.config;
    match cli.command.unwrap_or(Command::Serve { no_migrate: false }) {
        Command::Serve { no_migrate } => {
            let app = Application::build(config.clone(), !no_migrate)
                .await
                .map_err(|e| holdfast::http::error::error_chain(&e))?;
            let base = format!("http://{}:{}", config.bind.ip(), app.port());
            tracing::info!("holdfast {} listening on {base}", env!("CARGO_PKG_VERSION"));
            tracing::info!("database: {}", app.store().describe());
            tracing::info!("API docs: {base}/docs/ (OpenAPI document: {base}/openapi.json)");
            app.run_until_stopped()
                .await
                .map_err(|e| format!("server failed: {e}"))
        }
        Command::Migrate => {
            let store = open(&config).await?;
            store.migrate().await.map_err(|e| e.to_string())?;
            println!("migrated {}", store.describe());
            Ok(())
        }
        Command::Openapi => {
            let doc = holdfast::http::openapi()
                .to_pretty_json()
                .map_err(|e| format!("cannot render the document: {e}"))?;
            println!("{doc}");
            Ok(())
        }
        Command::Backup { path } => {
            if path.exists() {
                return Err(format!(
                    "{} already exists; choose a new file",
                    path.display()
                ));
            }
            let store = open(&config).await?;
            store.backup(&path).await.map_err(|e| e.to_string())?;
            println!("backed up {} to {}", store.describe(), path.display());
            Ok(())
        }
        Command::Restore { path } => {
            let holdfast::store::DatabaseUrl::Sqlite(target) =
                config.database().map_err(|e| e.to_string())?
            else {
                return Err(
                    "restore puts back a backup of the embedded SQLite database; for \
                            PostgreSQL restore a physical backup (pg_basebackup) or pg_restore a \
                                dump"
                        .into(),
                );
            };
            let (backup, into) = (path.clone(), target.clone());
            tokio::task::spawn_blocking(move || holdfast::store::sqlite::restore(&backup, &into))
                .await
                .map_err(|e| format!("the restore task failed: {e}"))?
                .map_err(|e| e.to_string())?;
            println!(
                "restored {} into {}; start holdfast (it migrates the copy if it is older)",
                path.display(),
                target.display()
            );
            Ok(())
        }
        Command::Audit {
            json,
            budget_seconds,
        } => {
            let mut config = config;
            let budget_ms = budget_seconds.saturating_mul(1000);
            config.db_statement_timeout_ms = budget_ms;
            config.db_timeout_ms = budget_ms;
            let store = open(&config).await?;
            // Events the janitor may purge while the audit runs are not
            // required: the retention's start as it will be at the budget's end
            // (any budget or retention too long to count keeps every event).
            let events_since = config
                .event_retention_days
                .and_then(|days| {
                    let budget = chrono::Duration::try_seconds(budget_seconds.try_into().ok()?)?;
                    let retention = chrono::Duration::try_days(days.try_into().ok()?)?;
                    chrono::Utc::now()
                        .checked_add_signed(budget)?
                        .checked_sub_signed(retention)
                })
                .unwrap_or(chrono::DateTime::UNIX_EPOCH);
            let total = holdfast::store::audit_checks();
            let done = std::sync::atomic::AtomicUsize::new(0);
            let progress = |f: &holdfast::store::Finding, took: std::time::Duration| {
                let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                let verdict = if f.violations == 0 { "ok" } else { "violated" };
                eprintln!(
                    "audit [{n}/{total}] {}: {verdict} ({:.1} s)",
                    f.name,
                    took.as_secs_f64()
                );
            };
            let findings = store
                .audit(events_since, &progress)
                .await
                .map_err(|e| holdfast::http::error::error_chain(&e))?;
            let violated = findings
                .iter()
                .filter(|f| f.violations > 0 && !f.history)
                .count();
            if json {
                let doc = serde_json::json!({"ok": violated == 0, "checks": findings});
                println!("{doc}");
            } else {
                for f in &findings {
                    let verdict = match (f.violations, f.history) {
                        (0, _) => "ok  ",
                        (_, true) => "note",
                        _ => "FAIL",
                    };
                    println!(
                        "{verdict} {} ({} violating): {}",
                        f.name, f.violations, f.description
                    );
                    for example in &f.examples {
                        println!("       {example}");
                    }
                }
            }
            if violated == 0 {
                Ok(())
            } else {
                Err(format!(
                    "{violated} of {} invariants are violated",
                    findings.len()
                ))
            }
        }
        Command::Import {
            path,
            format,
            batch_size,
            writers,
        } => {
            let store = open(&config).await?;
            store
                .migrate()
                .await
                .map_err(|e| holdfast::http::error::error_chain(&e))?;
            let options = holdfast::import::Options {
                path,
                format,
                batch_size: batch_size as usize,
                writers: usize::from(writers),
            };
            let summary = holdfast::import::run(&store, &options).await?;
            println!("imported into {}: {summary}", store.describe());
            Ok(())
        }
        Command::Keys {
            command: KeysCommand::New { name, role },
        } => {
            let role = holdfast::keys::Role::parse(&role)
                .ok_or_else(|| format!("role {role:?} is not admin, storefront or payments"))?;
            let (token, entry) = holdfast::keys::new_key(&name, role)?;
            // The entry alone must parse: names are checked here as at start.
            holdfast::keys::KeyRing::parse(&entry)?;
            println!("token (give it to the client; it is not shown again):\n  {token}\n");
            println!("entry (add it to HOLDFAST_API_KEYS or HOLDFAST_API_KEYS_FILE):\n  {entry}");
            Ok(())
        }
        Command::Dispatch { once } => {
            let settings = config.webhook_settings().ok_or(
                "HOLDFAST_WEBHOOK_URL and HOLDFAST_WEBHOOK_SECRET must be set to dispatch",
            )?;
            let store = open(&config).await?;
            let dispatcher = holdfast::outbox::Dispatcher::new(store, settings)?;
            loop {
                let report = dispatcher.run_once().await.map_err(|e| e.to_string())?;
                println!(
                    "delivered {}, retrying {}, dead {}",
                    report.delivered, report.retrying, report.dead
                );
                if once {
                    return Ok(());
                }
                tokio::time::sleep(std::time::Duration::from_millis(
                    config.dispatch_interval_ms,
                ))
                .await;
            }
        }
        Command::Sweep { once } => {
            let store = open(&config).await?;
            loop {
                let report = janitor::run_once(&store).await.map_err(|e| e.to_string())?;
                println!(
                    "expired {} holds, purged {} idempotency records and {} events",
                    report.expired, report.purged_keys, report.purged_events
                );
                if once {
                    return Ok(());
                }
                let every = config
                    .janitor_interval()
                    .unwrap_or(std::time::Duration::from_secs(30));
                tokio::time::sleep(every).await;
            }
        }
    }
}

async fn open(config: &Config) -> Result<Store, String> {
    config.validate().map_err(|e| e.to_string())?;
    config.open_store().await.map_err(|e| e.to_string())
}
