//! Test harness: the real application on a free port, over real HTTP, against
//! a database of its own (a fresh PostgreSQL database cloned from a migrated
//! template, or a fresh SQLite file), dropped afterwards.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use holdfast::{Application, Config, Store};
use reqwest::{Client, Method, Response};
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// Runs each listed test body once per backend: the first list's bodies
/// take the app of the test settings (`TestApp::try_spawn`); those after
/// `backend:` take the backend and spawn what they need themselves (keys,
/// their own configuration, several apps). A body whose database is not
/// reachable is skipped as `TestApp::try_spawn` says.
#[macro_export]
macro_rules! backend_tests {
    ($($name:ident),* $(,)? $(; backend: $($own:ident),* $(,)?)?) => {
        $crate::backend_tests!(@mod postgres Postgres; $($name),*; $($($own),*)?);
        $crate::backend_tests!(@mod sqlite Sqlite; $($name),*; $($($own),*)?);
    };
    (@mod $module:ident $backend:ident; $($name:ident),*; $($own:ident),*) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let backend = $crate::helpers::Backend::$backend;
                    if let Some(app) = $crate::helpers::TestApp::try_spawn(backend).await {
                        super::$name(app).await;
                    }
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $own() {
                    super::$own($crate::helpers::Backend::$backend).await;
                }
            )*
        }
    };
}

pub struct TestApp {
    pub backend: Backend,
    pub address: String,
    pub client: Client,
    pub store: Store,
    server: Server,
    /// Behind a pooler (`HOLDFAST_TEST_POOLER_URL`): a second instance on the
    /// same database, its address and its server; requests alternate between
    /// the two.
    twin: Option<(String, Server)>,
    turn: std::sync::atomic::AtomicUsize,
    db: TestDb,
}

/// What serves a [`TestApp`]: the application in this process, or the
/// `holdfast` binary as a process of its own.
enum Server {
    Task(tokio::task::JoinHandle<std::io::Result<()>>),
    Process(ServeProcess),
}

impl TestApp {
    /// The app with test settings: hold lengths from 1 s, no background janitor.
    pub async fn try_spawn(backend: Backend) -> Option<Self> {
        Self::try_spawn_with(backend, |_| {}).await
    }

    pub async fn try_spawn_with(
        backend: Backend,
        adjust: impl FnOnce(&mut Config),
    ) -> Option<Self> {
        Self::try_spawn_instances(backend, adjust, false).await
    }

    /// Like [`TestApp::try_spawn_with`], with a second instance on the same
    /// database on PostgreSQL (an embedded SQLite file has one instance):
    /// [`TestApp::instances`] names them.
    pub async fn try_spawn_twins(
        backend: Backend,
        adjust: impl FnOnce(&mut Config),
    ) -> Option<Self> {
        Self::try_spawn_instances(backend, adjust, backend == Backend::Postgres).await
    }

    /// The address of each instance serving the app.
    pub fn instances(&self) -> Vec<&str> {
        std::iter::once(self.address.as_str())
            .chain(self.twin.as_ref().map(|(twin, _)| twin.as_str()))
            .collect()
    }

    async fn try_spawn_instances(
        backend: Backend,
        adjust: impl FnOnce(&mut Config),
        twins: bool,
    ) -> Option<Self> {
        let db = TestDb::create(backend).await?;
        let mut config = Config::with_database(db.url.clone());
        config.bind = "127.0.0.1:0".parse().expect("a socket address");
        config.hold_seconds_min = 1;
        config.janitor_interval_seconds = 0;
        config.workers = 2;
        let pooled = db.through_pooler();
        if let Some(url) = &pooled {
            config.database_url = url.clone();
            config.db_prepared_statements = false;
        }
        adjust(&mut config);
        let twin = match pooled {
            // The twin migrates through the database itself, the first
            // instance through the pooler.
            Some(_) => {
                let mut twin = config.clone();
                twin.migration_database_url = Some(db.url.clone());
                let (address, _, server) = Self::serve(twin).await;
                Some((address, server))
            }
            None if twins => {
                let (address, _, server) = Self::serve(config.clone()).await;
                Some((address, server))
            }
            None => None,
        };
        let mut app = Self::start(backend, config, db).await;
        app.twin = twin;
        Some(app)
    }

    async fn serve(config: Config) -> (String, Store, Server) {
        let app = Application::build(config, true)
            .await
            .expect("the application starts");
        let address = format!("http://127.0.0.1:{}", app.port());
        let store = app.store().clone();
        let server = Server::Task(tokio::spawn(app.run_until_stopped()));
        (address, store, server)
    }

    async fn start(backend: Backend, config: Config, db: TestDb) -> Self {
        let (address, store, server) = Self::serve(config).await;
        let client = Client::builder()
            .timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(200)
            .build()
            .expect("an HTTP client");
        Self {
            backend,
            address,
            client,
            store,
            server,
            twin: None,
            turn: Default::default(),
            db,
        }
    }

    /// The `holdfast` binary serving on a port of its own, against a database
    /// of the test's own, with the test settings (hold lengths from 1 s, no
    /// janitor): a process whose `/metrics` no other test touches. `adjust`
    /// may set or override environment variables; it gets the database URL.
    /// `store` opens the same database directly, not through the process.
    pub async fn try_spawn_process(
        backend: Backend,
        adjust: impl FnOnce(&mut std::process::Command, &str),
    ) -> Option<Self> {
        let db = TestDb::create(backend).await?;
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_holdfast"));
        command.arg("serve");
        // Only the settings given here: none from the environment of the run.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("HOLDFAST_") {
                command.env_remove(name);
            }
        }
        command
            .env("HOLDFAST_DATABASE_URL", &db.url)
            .env("HOLDFAST_BIND", "127.0.0.1:0")
            .env("HOLDFAST_HOLD_SECONDS_MIN", "1")
            .env("HOLDFAST_JANITOR_INTERVAL_SECONDS", "0")
            .env("HOLDFAST_WORKERS", "2")
            .env("HOLDFAST_LOG_FORMAT", "json")
            .env("RUST_LOG", "info");
        adjust(&mut command, &db.url);
        let process = ServeProcess::start(command).await;
        let address = format!("http://127.0.0.1:{}", process.port);
        let store = Config::with_database(db.url.clone())
            .open_store()
            .await
            .expect("open the test database");
        let client = Client::builder()
            .timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(200)
            .build()
            .expect("an HTTP client");
        Some(Self {
            backend,
            address,
            client,
            store,
            server: Server::Process(process),
            twin: None,
            turn: Default::default(),
            db,
        })
    }

    /// The output of a [`TestApp::try_spawn_process`] app so far, once a line
    /// containing `needle` is in it (waiting up to 10 s for that line).
    pub async fn process_output(&self, needle: &str) -> String {
        let Server::Process(process) = &self.server else {
            panic!("the app runs in this process: it has no output of its own");
        };
        for _ in 0..100 {
            let output = process.output.lock().unwrap().clone();
            if output.contains(needle) {
                return output;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let output = process.output.lock().unwrap().clone();
        panic!("no line with {needle:?} in the output of holdfast:\n{output}");
    }

    /// Moves one HELD reservation `by` into the past, as if it had been taken
    /// that much earlier: its `created_at` and `expires_at` and its asset's
    /// `hold_expires_at` shift together, so both expiries stay equal (as the
    /// audit requires). What waiting `by` does to the hold, without the wait.
    pub async fn age_hold(&self, reservation: &str, by: Duration) {
        self.db.age_hold(reservation, Age::By(by)).await;
    }

    /// Ages one HELD reservation (see [`TestApp::age_hold`]) until its hold
    /// lapsed a second ago, by the clock that decides: the database's on
    /// PostgreSQL, the service's on SQLite. No sweep runs: the rows still say
    /// HELD, and only the effective status is EXPIRED.
    pub async fn lapse(&self, reservation: &str) {
        self.db.age_hold(reservation, Age::PastExpiry).await;
    }

    /// Marks the events `filter` selects (all when `None`) delivered, and
    /// moves them past any retention: their creation time and the time in
    /// their ids (which the purge reads, oldest first) go back decades.
    pub async fn age_delivered_events(&self, filter: Option<&str>) {
        let then = match self.backend {
            Backend::Postgres => "now() - interval '40 years'",
            Backend::Sqlite => "'1990-01-01T00:00:00.000000Z'",
        };
        let filter = filter.map(|f| format!(" WHERE {f}")).unwrap_or_default();
        self.sql(&format!(
            "UPDATE events SET delivered_at = {then}, created_at = {then}, \
             id = 'evt_0000000000' || substr(id, 15){filter}"
        ))
        .await;
    }

    /// The value of one series of this app's `/metrics`, 0 when absent.
    pub async fn metric(&self, name_and_labels: &str) -> f64 {
        let page = self
            .get("/metrics")
            .await
            .text()
            .await
            .expect("a metrics page");
        series(&page, name_and_labels)
    }

    pub fn database_url(&self) -> &str {
        &self.db.url
    }

    /// The app's URL for `path`; behind a pooler, each call names the other
    /// instance than the call before.
    pub fn url(&self, path: &str) -> String {
        let address = match &self.twin {
            Some((twin, _))
                if self.turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 2 == 1 =>
            {
                twin
            }
            _ => &self.address,
        };
        format!("{address}{path}")
    }

    pub async fn get(&self, path: &str) -> Response {
        self.client
            .get(self.url(path))
            .send()
            .await
            .expect("GET is sent")
    }

    pub async fn get_json(&self, path: &str) -> Value {
        let response = self.get(path).await;
        assert_eq!(response.status(), 200, "GET {path}");
        response.json().await.expect("a JSON body")
    }

    pub async fn get_json_as(&self, path: &str, token: &str) -> Value {
        let response = self
            .client
            .get(self.url(path))
            .bearer_auth(token)
            .send()
            .await
            .expect("GET is sent");
        assert_eq!(response.status(), 200, "GET {path}");
        response.json().await.expect("a JSON body")
    }

    /// POST a JSON body, with an Idempotency-Key when given.
    pub async fn post(&self, path: &str, key: Option<&str>, body: &Value) -> Response {
        let mut request = self.client.post(self.url(path)).json(body);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        request.send().await.expect("POST is sent")
    }

    /// Sends `method path` with `body` as the caller `token` (open mode
    /// without), under a fresh Idempotency-Key: its status and JSON body
    /// (null when the body is not JSON).
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self
            .client
            .request(method, self.url(path))
            .header("Idempotency-Key", new_key());
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("sent");
        let status = response.status().as_u16();
        let text = response.text().await.expect("a body");
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    pub async fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.client.request(method, self.url(path))
    }

    pub async fn create_asset(&self, id: &str) -> Value {
        let response = self
            .post(
                "/v1/assets",
                None,
                &serde_json::json!({"id": id, "name": format!("Lot {id}")}),
            )
            .await;
        assert_eq!(response.status(), 201, "create asset {id}");
        response.json().await.expect("an asset")
    }

    /// Creates asset `id` on sale from `opens` and returns it.
    pub async fn create_asset_opening(
        &self,
        id: &str,
        opens: chrono::DateTime<chrono::Utc>,
    ) -> Value {
        let opens = opens.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        let response = self
            .post(
                "/v1/assets",
                None,
                &serde_json::json!({"id": id, "name": format!("Lot {id}"), "available_from": opens}),
            )
            .await;
        assert_eq!(response.status(), 201, "create asset {id}");
        response.json().await.expect("an asset")
    }

    /// Holds `asset` for `buyer` and returns the reservation.
    pub async fn hold(&self, asset: &str, buyer: &str, hold_seconds: i64) -> Value {
        let response = self
            .post(
                &format!("/v1/assets/{asset}/reservations"),
                Some(&new_key()),
                &serde_json::json!({"buyer_id": buyer, "hold_seconds": hold_seconds}),
            )
            .await;
        assert_eq!(response.status(), 201, "hold {asset}");
        response.json().await.expect("a reservation")
    }

    pub async fn commit(&self, reservation: &str, key: &str, payment: &str) -> Response {
        self.post(
            &format!("/v1/reservations/{reservation}/commit"),
            Some(key),
            &serde_json::json!({"payment_reference": payment}),
        )
        .await
    }

    pub async fn release(&self, reservation: &str, key: &str) -> Response {
        self.post(
            &format!("/v1/reservations/{reservation}/release"),
            Some(key),
            &serde_json::json!({}),
        )
        .await
    }

    /// Runs SQL directly against this test's database (for assertions and
    /// for simulating time passing on stored rows).
    pub async fn sql(&self, sql: &str) {
        self.db.execute(sql).await;
    }

    /// Counts rows with a `SELECT count(*) …` query.
    pub async fn count(&self, sql: &str) -> i64 {
        self.db.count(sql).await
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        let twin = self.twin.as_mut().map(|(_, server)| server);
        for server in std::iter::once(&mut self.server).chain(twin) {
            match server {
                Server::Task(server) => server.abort(),
                Server::Process(process) => process.stop(),
            }
        }
    }
}

/// `holdfast serve` as a child process; its stdout and stderr are read into
/// `output` as they come, so that the pipes never fill.
struct ServeProcess {
    child: std::process::Child,
    port: u16,
    output: std::sync::Arc<std::sync::Mutex<String>>,
}

impl ServeProcess {
    /// Starts `command` and waits for the port it announces.
    async fn start(mut command: std::process::Command) -> Self {
        use std::io::BufRead;
        use std::process::Stdio;
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("holdfast serve starts");
        let output = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (port_tx, port_rx) = std::sync::mpsc::channel::<u16>();
        let streams: [Box<dyn std::io::Read + Send>; 2] = [
            Box::new(child.stdout.take().expect("stdout")),
            Box::new(child.stderr.take().expect("stderr")),
        ];
        for stream in streams {
            let (output, port_tx) = (output.clone(), port_tx.clone());
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    if let Some(port) = announced_port(&line) {
                        let _ = port_tx.send(port);
                    }
                    let mut output = output.lock().unwrap();
                    output.push_str(&line);
                    output.push('\n');
                }
            });
        }
        drop(port_tx);
        let port =
            tokio::task::spawn_blocking(move || port_rx.recv_timeout(Duration::from_secs(60)))
                .await
                .expect("the wait for the port");
        match port {
            Ok(port) => Self {
                child,
                port,
                output,
            },
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                let output = output.lock().unwrap().clone();
                panic!("holdfast announced no port ({e}):\n{output}");
            }
        }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The port in `holdfast … listening on http://127.0.0.1:PORT`.
fn announced_port(line: &str) -> Option<u16> {
    let (_, rest) = line.split_once("listening on http://")?;
    let (_, rest) = rest.split_once(':')?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// `tests/api/fault_library.c` built as a shared library, to preload into a
/// [`TestApp::try_spawn_process`] app (`LD_PRELOAD`): a slow disk and a wall
/// clock set wrong, on request (see the file). Built once per test process
/// with the system's C compiler, which building SQLite needs anyway.
pub fn fault_library() -> PathBuf {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY
        .get_or_init(|| {
            let source =
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/api/fault_library.c");
            let library = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("holdfast-faults-{}.so", std::process::id()));
            let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
            let status = std::process::Command::new(&compiler)
                .args(["-shared", "-fPIC", "-O2", "-o"])
                .arg(&library)
                .arg(&source)
                .arg("-ldl")
                .status()
                .unwrap_or_else(|e| panic!("{compiler} builds {}: {e}", source.display()));
            assert!(status.success(), "{compiler} builds {}", source.display());
            library
        })
        .clone()
}

/// Holds back one side of a race by `by`, so that it reaches the service
/// while the other side's request is running. Not a wait for a state:
/// nothing depends on what has happened by then.
pub async fn stagger(by: Duration) {
    if !by.is_zero() {
        tokio::time::sleep(by).await;
    }
}

/// The tokens of the API keys a [`spawn_with_keys`] app knows: an admin
/// (`ops`), two storefronts (`shop-a`, `shop-b`) and a payments client
/// (`psp`).
pub struct Keys {
    pub admin: String,
    pub shop: String,
    pub other_shop: String,
    pub payments: String,
}

/// An app with API keys of every role (and `adjust`'s other settings).
pub async fn spawn_with_keys(
    backend: Backend,
    adjust: impl FnOnce(&mut holdfast::Config),
) -> Option<(TestApp, Keys)> {
    use holdfast::keys::{new_key, Role};
    let (admin, a) = new_key("ops", Role::Admin).unwrap();
    let (shop, s) = new_key("shop-a", Role::Storefront).unwrap();
    let (other_shop, o) = new_key("shop-b", Role::Storefront).unwrap();
    let (payments, p) = new_key("psp", Role::Payments).unwrap();
    let app = TestApp::try_spawn_with(backend, |c| {
        c.api_keys = Some(holdfast::config::Secret::new(format!("{a},{s},{o},{p}")));
        adjust(c);
    })
    .await?;
    let keys = Keys {
        admin,
        shop,
        other_shop,
        payments,
    };
    Some((app, keys))
}

/// Polls `condition` every 20 ms until it holds; fails naming `what` when
/// it does not within 10 s. Every wait of the tests is one of these (or ages
/// rows in the database): none sleeps for a fixed time hoping it is enough.
pub async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !condition().await {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn new_key() -> String {
    ulid::Ulid::new().to_string()
}

pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", ulid::Ulid::new())
}

/// `host:port` of the PostgreSQL server tests use when it is given by
/// `HOLDFAST_TEST_DATABASE_URL`, else the local default.
pub fn postgres_address() -> String {
    std::env::var("HOLDFAST_TEST_DATABASE_URL")
        .ok()
        .and_then(|url| {
            let rest = url.split_once("://")?.1;
            let authority = rest.rsplit_once('@').map_or(rest, |(_, a)| a);
            Some(authority.split('/').next()?.to_owned())
        })
        .unwrap_or_else(|| "127.0.0.1:5432".to_owned())
}

/// A database of one test's own.
struct TestDb {
    url: String,
    kind: DbKind,
}

enum DbKind {
    Postgres { admin_url: String, name: String },
    Sqlite { dir: PathBuf },
}

impl TestDb {
    async fn create(backend: Backend) -> Option<Self> {
        match backend {
            Backend::Sqlite => {
                let dir = std::env::temp_dir().join(format!("holdfast-test-{}", ulid::Ulid::new()));
                std::fs::create_dir_all(&dir).expect("a temporary directory");
                let url = format!("sqlite://{}", dir.join("holdfast.db").display());
                Some(Self {
                    url,
                    kind: DbKind::Sqlite { dir },
                })
            }
            Backend::Postgres => {
                let server = postgres_server().await?;
                let template = migrated_template(server).await;
                let name = format!(
                    "holdfast_t_{}",
                    ulid::Ulid::new().to_string().to_lowercase()
                );
                let mut admin = AsyncPgConnection::establish(&server.admin_url)
                    .await
                    .expect("connect to PostgreSQL as admin");
                admin
                    .batch_execute(&format!("CREATE DATABASE {name} TEMPLATE {template}"))
                    .await
                    .expect("create a test database");
                Some(Self {
                    url: server.database_url(&name),
                    kind: DbKind::Postgres {
                        admin_url: server.admin_url.clone(),
                        name,
                    },
                })
            }
        }
    }

    /// This PostgreSQL database's URL through the pooler named by
    /// `HOLDFAST_TEST_POOLER_URL` (a server URL without a database), if any.
    fn through_pooler(&self) -> Option<String> {
        let DbKind::Postgres { name, .. } = &self.kind else {
            return None;
        };
        let pooler = std::env::var("HOLDFAST_TEST_POOLER_URL").ok()?;
        Some(format!("{}/{name}", pooler.trim_end_matches('/')))
    }

    async fn execute(&self, sql: &str) {
        match &self.kind {
            DbKind::Postgres { .. } => {
                let mut conn = AsyncPgConnection::establish(&self.url)
                    .await
                    .expect("connect");
                conn.batch_execute(sql).await.expect("SQL runs");
            }
            DbKind::Sqlite { dir } => {
                use diesel::connection::SimpleConnection;
                use diesel::Connection;
                let mut conn = diesel::SqliteConnection::establish(
                    &dir.join("holdfast.db").display().to_string(),
                )
                .expect("open SQLite");
                conn.batch_execute("PRAGMA busy_timeout = 5000;")
                    .expect("busy timeout");
                conn.batch_execute(sql).expect("SQL runs");
            }
        }
    }

    async fn count(&self, sql: &str) -> i64 {
        #[derive(diesel::QueryableByName)]
        struct Count {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        let sql = format!("SELECT ({sql}) AS n");
        match &self.kind {
            DbKind::Postgres { .. } => {
                use diesel_async::RunQueryDsl;
                let mut conn = AsyncPgConnection::establish(&self.url)
                    .await
                    .expect("connect");
                diesel::sql_query(sql)
                    .get_result::<Count>(&mut conn)
                    .await
                    .expect("count")
                    .n
            }
            DbKind::Sqlite { dir } => {
                use diesel::{Connection, RunQueryDsl};
                let mut conn = diesel::SqliteConnection::establish(
                    &dir.join("holdfast.db").display().to_string(),
                )
                .expect("open SQLite");
                diesel::sql_query(sql)
                    .get_result::<Count>(&mut conn)
                    .expect("count")
                    .n
            }
        }
    }
}

/// How far [`TestDb::age_hold`] moves a hold into the past.
#[derive(Clone, Copy)]
enum Age {
    By(Duration),
    /// Until its expiry is a second past.
    PastExpiry,
}

impl TestDb {
    /// Shifts a HELD reservation's `created_at` and `expires_at` and its
    /// asset's `hold_expires_at` back by one amount, in one transaction.
    /// Panics unless the reservation is HELD and its asset held by it.
    async fn age_hold(&self, reservation: &str, age: Age) {
        let (reservations, assets) = match &self.kind {
            DbKind::Postgres { .. } => {
                use diesel::sql_types::Text;
                use diesel_async::RunQueryDsl;
                #[derive(diesel::QueryableByName)]
                struct Aged {
                    #[diesel(sql_type = diesel::sql_types::BigInt)]
                    reservations: i64,
                    #[diesel(sql_type = diesel::sql_types::BigInt)]
                    assets: i64,
                }
                // PostgreSQL keeps instants as timestamptz: interval arithmetic
                // is exact, and now() is the clock the service decides by.
                let shift = match age {
                    Age::By(by) => format!("interval '{} microseconds'", by.as_micros()),
                    Age::PastExpiry => {
                        "greatest(expires_at - now() + interval '1 second', interval '0')"
                            .to_owned()
                    }
                };
                let mut conn = AsyncPgConnection::establish(&self.url)
                    .await
                    .expect("connect");
                let aged = diesel::sql_query(format!(
                    "WITH shift AS ( \
                       SELECT {shift} AS d FROM reservations WHERE id = $1 AND status = 'HELD' FOR UPDATE), \
                     r AS ( \
                       UPDATE reservations SET created_at = created_at - shift.d, expires_at = expires_at - shift.d \
                       FROM shift WHERE id = $1 RETURNING 1), \
                     a AS ( \
                       UPDATE assets SET hold_expires_at = hold_expires_at - shift.d \
                       FROM shift WHERE status = 'HELD' AND current_reservation_id = $1 RETURNING 1) \
                     SELECT (SELECT count(*) FROM r) AS reservations, (SELECT count(*) FROM a) AS assets"
                ))
                .bind::<Text, _>(reservation)
                .get_result::<Aged>(&mut conn)
                .await
                .expect("age the hold");
                (aged.reservations, aged.assets)
            }
            DbKind::Sqlite { dir } => {
                use diesel::connection::SimpleConnection;
                use diesel::sql_types::Text;
                use diesel::{Connection, OptionalExtension, RunQueryDsl};
                #[derive(diesel::QueryableByName)]
                struct Held {
                    #[diesel(sql_type = Text)]
                    created_at: String,
                    #[diesel(sql_type = Text)]
                    expires_at: String,
                }
                #[derive(diesel::QueryableByName)]
                struct Asset {
                    #[diesel(sql_type = Text)]
                    hold_expires_at: String,
                }
                let mut conn = diesel::SqliteConnection::establish(
                    &dir.join("holdfast.db").display().to_string(),
                )
                .expect("open SQLite");
                conn.batch_execute("PRAGMA busy_timeout = 5000;")
                    .expect("busy timeout");
                conn.immediate_transaction(|conn| {
                    let held = diesel::sql_query(
                        "SELECT created_at, expires_at FROM reservations WHERE id = ? AND status = 'HELD'",
                    )
                    .bind::<Text, _>(reservation)
                    .get_result::<Held>(conn)
                    .optional()?;
                    let asset = diesel::sql_query(
                        "SELECT hold_expires_at FROM assets WHERE status = 'HELD' AND current_reservation_id = ?",
                    )
                    .bind::<Text, _>(reservation)
                    .get_result::<Asset>(conn)
                    .optional()?;
                    let Some(held) = held else {
                        return Ok((0, i64::from(asset.is_some())));
                    };
                    // SQLite keeps instants as fixed-width RFC 3339 UTC text and
                    // compares them as text; the service's clock is this
                    // process's, so the shift is computed here and written in
                    // the service's own format.
                    let shift = match age {
                        Age::By(by) => chrono::Duration::from_std(by).expect("a shift"),
                        Age::PastExpiry => (instant(&held.expires_at) - chrono::Utc::now()
                            + chrono::Duration::seconds(1))
                        .max(chrono::Duration::zero()),
                    };
                    let earlier = |text: &str| stored_instant(instant(text) - shift);
                    let reservations = diesel::sql_query(
                        "UPDATE reservations SET created_at = ?, expires_at = ? WHERE id = ?",
                    )
                    .bind::<Text, _>(earlier(&held.created_at))
                    .bind::<Text, _>(earlier(&held.expires_at))
                    .bind::<Text, _>(reservation)
                    .execute(conn)?;
                    let assets = match asset {
                        Some(asset) => diesel::sql_query(
                            "UPDATE assets SET hold_expires_at = ? \
                             WHERE status = 'HELD' AND current_reservation_id = ?",
                        )
                        .bind::<Text, _>(earlier(&asset.hold_expires_at))
                        .bind::<Text, _>(reservation)
                        .execute(conn)?,
                        None => 0,
                    };
                    diesel::QueryResult::Ok((reservations as i64, assets as i64))
                })
                .expect("age the hold")
            }
        };
        assert_eq!(
            (reservations, assets),
            (1, 1),
            "only a HELD reservation, whose asset it holds, is aged: {reservation}"
        );
    }
}

/// An instant as SQLite keeps it.
fn instant(text: &str) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::parse_from_rfc3339(text)
        .unwrap_or_else(|e| panic!("stored instant {text:?}: {e}"))
        .with_timezone(&chrono::Utc)
}

/// An instant written as the service writes it on SQLite (`format_timestamp`):
/// RFC 3339 in UTC with exactly six fraction digits, so that it compares as
/// text.
fn stored_instant(t: chrono::DateTime<chrono::Utc>) -> String {
    holdfast::domain::format_timestamp(&t)
}

impl Drop for TestDb {
    fn drop(&mut self) {
        match &self.kind {
            DbKind::Sqlite { dir } => {
                let _ = std::fs::remove_dir_all(dir);
            }
            DbKind::Postgres { admin_url, name } => {
                let (admin_url, name) = (admin_url.clone(), name.clone());
                // Drop runs inside the test's runtime: use a thread of our own.
                let _ = std::thread::spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build();
                    if let Ok(runtime) = runtime {
                        runtime.block_on(async {
                            if let Ok(mut admin) = AsyncPgConnection::establish(&admin_url).await {
                                let _ = admin
                                    .batch_execute(&format!(
                                        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                                    ))
                                    .await;
                            }
                        });
                    }
                })
                .join();
            }
        }
    }
}

/// A PostgreSQL server the tests may create databases on.
struct PgServer {
    /// `postgres://user@host:port`
    base: String,
    admin_url: String,
}

impl PgServer {
    fn new(base: String) -> Self {
        let admin_url = format!("{base}/postgres");
        Self { base, admin_url }
    }

    fn database_url(&self, name: &str) -> String {
        format!("{}/{name}", self.base)
    }
}

/// Finds PostgreSQL: `HOLDFAST_TEST_DATABASE_URL` (a server URL without a
/// database), else the local server on 127.0.0.1:5432, else a private
/// cluster started with the local initdb/pg_ctl. Without one the test is
/// skipped loudly, except under `CI=true`, where it fails.
async fn postgres_server() -> Option<&'static PgServer> {
    static SERVER: tokio::sync::OnceCell<Option<PgServer>> = tokio::sync::OnceCell::const_new();
    SERVER
        .get_or_init(|| async {
            let mut candidates = Vec::new();
            if let Ok(url) = std::env::var("HOLDFAST_TEST_DATABASE_URL") {
                candidates.push(url.trim_end_matches('/').to_owned());
            }
            candidates.push("postgres://postgres@127.0.0.1:5432".to_owned());
            for base in candidates {
                let server = PgServer::new(base);
                if AsyncPgConnection::establish(&server.admin_url).await.is_ok() {
                    return Some(server);
                }
            }
            if let Some(base) = private_cluster() {
                let server = PgServer::new(base);
                for _ in 0..50 {
                    if AsyncPgConnection::establish(&server.admin_url).await.is_ok() {
                        return Some(server);
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            None
        })
        .await
        .as_ref()
        .or_else(|| {
            let message = "no PostgreSQL server found (set HOLDFAST_TEST_DATABASE_URL, run one on 127.0.0.1:5432, or install initdb/pg_ctl)";
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{message}; PostgreSQL tests cannot be skipped under CI=true");
            }
            skipped(message);
            None
        })
}

/// How many PostgreSQL tests this run skipped so far.
static SKIPPED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Counts one skipped PostgreSQL test and says so with the count so far, and
/// once more, with the total, when the test binary exits. Written to the
/// terminal itself: the harness keeps a passing test's `eprintln!` to itself.
fn skipped(why: &str) {
    use std::io::Write;
    let n = SKIPPED.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {n} PostgreSQL test{} so far: {why}",
        if n == 1 { "" } else { "s" }
    );
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    AT_EXIT.call_once(|| {
        extern "C" {
            fn atexit(callback: extern "C" fn()) -> std::os::raw::c_int;
        }
        extern "C" fn total() {
            let n = SKIPPED.load(std::sync::atomic::Ordering::SeqCst);
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {n} PostgreSQL test{} in all: no PostgreSQL server was found; \
                 only SQLite was tested",
                if n == 1 { "" } else { "s" }
            );
        }
        // SAFETY: registers a function without arguments that only writes to
        // stderr, as the C library's atexit expects.
        unsafe {
            atexit(total);
        }
    });
}

/// Starts (once per machine) a throwaway cluster on port 55432 owned by the
/// `postgres` user, using the local initdb and pg_ctl.
fn private_cluster() -> Option<String> {
    let bin = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path().join("bin"))
        .find(|p| p.join("initdb").exists())?;
    let dir = std::env::temp_dir().join("holdfast-test-pg");
    let data = dir.join("data");
    let as_postgres = |args: &[&str]| {
        let status = std::process::Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .args(args)
            .status();
        status.is_ok_and(|s| s.success())
    };
    if !data.join("PG_VERSION").exists() {
        std::fs::create_dir_all(&dir).ok()?;
        std::process::Command::new("chown")
            .args(["postgres"])
            .arg(&dir)
            .status()
            .ok()?;
        let ok = as_postgres(&[
            bin.join("initdb").to_str()?,
            "-D",
            data.to_str()?,
            "-A",
            "trust",
            "-U",
            "postgres",
        ]);
        if !ok {
            return None;
        }
    }
    let log = dir.join("log");
    as_postgres(&[
        bin.join("pg_ctl").to_str()?,
        "-D",
        data.to_str()?,
        "-o",
        "-p 55432 -k /tmp -c listen_addresses=127.0.0.1",
        "-l",
        log.to_str()?,
        "-w",
        "start",
    ]);
    Some("postgres://postgres@127.0.0.1:55432".to_owned())
}

/// A database migrated once per migration set, cloned for every test.
async fn migrated_template(server: &PgServer) -> String {
    static TEMPLATE: OnceLock<String> = OnceLock::new();
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    if let Some(name) = TEMPLATE.get() {
        return name.clone();
    }
    let _guard = LOCK.lock().await;
    if let Some(name) = TEMPLATE.get() {
        return name.clone();
    }
    let name = format!("holdfast_tpl_{}", migrations_digest());
    let mut admin = AsyncPgConnection::establish(&server.admin_url)
        .await
        .expect("connect to PostgreSQL as admin");
    // Several test processes may race to build the template.
    admin
        .batch_execute("SELECT pg_advisory_lock(4242)")
        .await
        .expect("template lock");
    #[derive(diesel::QueryableByName)]
    struct Exists {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        exists: bool,
    }
    let exists = {
        use diesel_async::RunQueryDsl;
        diesel::sql_query(format!(
            "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = '{name}') AS exists"
        ))
        .get_result::<Exists>(&mut admin)
        .await
        .expect("look for the template")
        .exists
    };
    if !exists {
        let building = format!("{name}_building");
        for sql in [
            format!("DROP DATABASE IF EXISTS {building} WITH (FORCE)"),
            format!("CREATE DATABASE {building}"),
        ] {
            admin
                .batch_execute(&sql)
                .await
                .expect("create the template");
        }
        {
            let store = Config::with_database(server.database_url(&building))
                .open_store()
                .await
                .expect("open the template");
            store.migrate().await.expect("migrate the template");
        }
        // The migration's pool may linger for a moment; end its sessions.
        for sql in [
            format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{building}'"),
            format!("ALTER DATABASE {building} RENAME TO {name}"),
        ] {
            admin.batch_execute(&sql).await.expect("publish the template");
        }
    }
    admin
        .batch_execute("SELECT pg_advisory_unlock(4242)")
        .await
        .expect("template unlock");
    let _ = TEMPLATE.set(name.clone());
    name
}

/// A short digest of the PostgreSQL migrations, naming the template.
fn migrations_digest() -> String {
    use sha2::{Digest, Sha256};
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("migrations/postgres");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("migrations/postgres")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    dirs.sort();
    let mut hash = Sha256::new();
    for dir in dirs {
        hash.update(
            dir.file_name()
                .map(|n| n.as_encoded_bytes().to_vec())
                .unwrap_or_default(),
        );
        hash.update(std::fs::read(dir.join("up.sql")).unwrap_or_default());
    }
    hash.finalize()
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A transaction left open outside the service, holding its locks.
#[allow(clippy::large_enum_variant)]
pub enum Blocker {
    Postgres(AsyncPgConnection),
    Sqlite(diesel::SqliteConnection),
}

impl Blocker {
    /// Commits what the transaction did, as the other writer would.
    pub async fn commit(self) {
        match self {
            Blocker::Postgres(mut conn) => conn.batch_execute("COMMIT").await.expect("commit"),
            Blocker::Sqlite(mut conn) => {
                use diesel::connection::SimpleConnection;
                conn.batch_execute("COMMIT").expect("commit");
            }
        }
    }

    pub async fn release(self) {
        match self {
            Blocker::Postgres(mut conn) => conn.batch_execute("ROLLBACK").await.expect("rollback"),
            Blocker::Sqlite(mut conn) => {
                use diesel::connection::SimpleConnection;
                conn.batch_execute("ROLLBACK").expect("rollback");
            }
        }
    }
}

impl TestApp {
    /// Waits until `n` statements of this database wait for a lock
    /// (PostgreSQL): requests queued behind a transaction a test holds open.
    pub async fn lock_waiters(&self, n: i64) {
        let waiting = "SELECT count(*) FROM pg_stat_activity \
                       WHERE datname = current_database() AND wait_event_type = 'Lock'";
        eventually(&format!("{n} statements waiting for a lock"), || async {
            self.count(waiting).await >= n
        })
        .await;
    }

    /// Another writer's lock on `asset`, kept until released: its row on
    /// PostgreSQL, the database's write lock (taken on its row) on SQLite.
    pub async fn lock_asset(&self, asset: &str) -> Blocker {
        let lock = match self.backend {
            Backend::Postgres => {
                format!("BEGIN; SELECT * FROM assets WHERE id = '{asset}' FOR UPDATE")
            }
            Backend::Sqlite => {
                format!("BEGIN IMMEDIATE; UPDATE assets SET name = name WHERE id = '{asset}'")
            }
        };
        self.hold_lock_open(&lock).await
    }

    /// Opens a transaction with `sql` and keeps it open until released.
    pub async fn hold_lock_open(&self, sql: &str) -> Blocker {
        match &self.db.kind {
            DbKind::Postgres { .. } => {
                let mut conn = AsyncPgConnection::establish(&self.db.url)
                    .await
                    .expect("connect");
                conn.batch_execute(sql).await.expect("lock");
                Blocker::Postgres(conn)
            }
            DbKind::Sqlite { dir } => {
                use diesel::connection::SimpleConnection;
                use diesel::Connection;
                let mut conn = diesel::SqliteConnection::establish(
                    &dir.join("holdfast.db").display().to_string(),
                )
                .expect("open SQLite");
                conn.batch_execute(sql).expect("lock");
                Blocker::Sqlite(conn)
            }
        }
    }
}

/// Timeouts long enough for requests to wait behind a lock a test holds,
/// even on a slow machine.
pub fn patient(config: &mut Config) {
    config.db_lock_timeout_ms = 10_000;
    config.db_statement_timeout_ms = 15_000;
    config.db_timeout_ms = 20_000;
}

/// An empty PostgreSQL database of the test's own, dropped afterwards.
pub struct EmptyPgDatabase {
    pub url: String,
    _db: TestDb,
}

impl EmptyPgDatabase {
    pub async fn create() -> Option<Self> {
        let server = postgres_server().await?;
        let name = format!(
            "holdfast_e_{}",
            ulid::Ulid::new().to_string().to_lowercase()
        );
        let mut admin = AsyncPgConnection::establish(&server.admin_url)
            .await
            .expect("connect as admin");
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create an empty database");
        let url = server.database_url(&name);
        Some(Self {
            url: url.clone(),
            _db: TestDb {
                url,
                kind: DbKind::Postgres {
                    admin_url: server.admin_url.clone(),
                    name,
                },
            },
        })
    }
}

/// An answer read off the wire: status, headers (lower-case names) and body.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

impl TestApp {
    /// Sends one request exactly as written (no client normalises the path:
    /// `..`, `%61` and `//` reach the server as they are) and reads the answer.
    pub async fn raw(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> RawResponse {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let authority = self.address.trim_start_matches("http://");
        let mut stream = tokio::net::TcpStream::connect(authority)
            .await
            .expect("connect");
        let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {authority}\r\n");
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ));
        stream
            .write_all(request.as_bytes())
            .await
            .expect("request written");
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.expect("answer read");
        let text = String::from_utf8_lossy(&answer);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let mut lines = head.lines();
        let status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {text:?}"));
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        RawResponse {
            status,
            headers,
            body: body.to_owned(),
        }
    }
}

/// The value of one series in a Prometheus text page, 0 when absent.
pub fn series(page: &str, name_and_labels: &str) -> f64 {
    page.lines()
        .find_map(|line| {
            line.strip_prefix(name_and_labels)?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .unwrap_or(0.0)
}
