//! Every statement each operation sends to PostgreSQL, recorded on the wire
//! (a proxy between the service and the database), against the catalogue of
//! `docs/scale-out.md`: each statement, the operations that send it and the
//! key it filters on. A statement added, changed or no longer sent fails the
//! test until the catalogue says so; `HOLDFAST_UPDATE_CATALOGUE=1` rewrites
//! the catalogue (keys already classified are kept, new ones are `?`, which
//! still fails).

use std::collections::{BTreeMap, BTreeSet};

use holdfast::config::Secret;
use holdfast::keys::{new_key, Role};
use reqwest::Method;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::helpers::{new_key as idempotency_key, postgres_address, Backend, TestApp};
use crate::proxy::Recorder;

const CATALOGUE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/scale-out.md");
const BEGIN: &str = "<!-- statements:begin -->";
const END: &str = "<!-- statements:end -->";

/// What a key letter of the catalogue names, and a word the statement's
/// text must contain for it.
const KEYS: &[(&str, &str)] = &[
    ("A", "asset"),
    ("R", "reservation"),
    ("F", "refund"),
    ("E", "events"),
    ("K", "key"),
    ("B", "buyer"),
    ("P", "reference"),
    ("*", ""),
    ("-", ""),
];

/// The service with three keys, its database reached through a recorder.
struct Tour {
    app: TestApp,
    recorder: Recorder,
    admin: String,
    shop: String,
    payments: String,
    /// Statement text → the operations that sent it.
    sent: BTreeMap<String, BTreeSet<String>>,
    toured: BTreeSet<String>,
}

impl Tour {
    /// Sends one request as `token`, and files the statements it sent under
    /// `operation`.
    async fn call(
        &mut self,
        operation: &str,
        token: &str,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Value {
        self.recorder.take();
        let mut request = self
            .app
            .client
            .request(method.clone(), self.app.url(path))
            .bearer_auth(token);
        if method == Method::POST || method == Method::PATCH {
            request = request
                .header("Idempotency-Key", idempotency_key())
                .json(&body.unwrap_or_else(|| json!({})));
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        assert!(
            status.as_u16() < 500,
            "{operation}: {method} {path} answered {status}: {text}"
        );
        for statement in self.recorder.take() {
            let statement = normalise(&statement);
            if !bookkeeping(&statement) {
                self.sent
                    .entry(statement)
                    .or_default()
                    .insert(operation.to_owned());
            }
        }
        self.toured.insert(operation.to_owned());
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }
}

/// Whitespace runs as one space.
fn normalise(sql: &str) -> String {
    sql.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Transaction control and settings: sent around every unit of work, on
/// whichever node the instance talks to.
fn bookkeeping(sql: &str) -> bool {
    let first = sql.split([' ', ';']).next().unwrap_or_default();
    ["BEGIN", "COMMIT", "ROLLBACK", "SET", "SAVEPOINT", "RELEASE"]
        .iter()
        .any(|word| first.eq_ignore_ascii_case(word))
}

/// A statement's name in the catalogue: the start of the SHA-256 of its text.
fn fingerprint(sql: &str) -> String {
    Sha256::digest(sql.as_bytes())
        .iter()
        .take(4)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One catalogue row: fingerprint → (operations, key).
fn parse_catalogue(doc: &str) -> BTreeMap<String, (String, String)> {
    let Some((_, rest)) = doc.split_once(BEGIN) else {
        panic!("docs/scale-out.md has no {BEGIN} marker");
    };
    let (table, _) = rest.split_once(END).expect("the catalogue's end marker");
    table
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
            let id = cells.first()?.trim().trim_matches('`');
            (id.len() == 8 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| {
                (
                    id.to_owned(),
                    (cells[1].trim().to_owned(), cells[2].trim().to_owned()),
                )
            })
        })
        .collect()
}

/// A statement as a reader scans it: long select and returning lists
/// shortened to `…`, so that its tables and filters show.
fn abridge(sql: &str) -> String {
    let mut text = sql.to_owned();
    if let (Some(rest), Some(from)) = (text.strip_prefix("SELECT "), text.find(" FROM ")) {
        if from > 60 {
            text = format!("SELECT … {}", &text[from + 1..]);
        } else {
            text = format!("SELECT {rest}");
        }
    }
    if let Some(at) = text.find(" RETURNING ") {
        if text.len() - at > 60 {
            text = format!("{} RETURNING …", &text[..at]);
        }
    }
    text
}

fn render(rows: &[(String, String, String, String)]) -> String {
    let mut table =
        String::from("| statement | sent by | key | text (abridged) |\n|---|---|---|---|\n");
    for (id, operations, key, sql) in rows {
        let sql = abridge(sql);
        let excerpt: String = sql.chars().take(200).collect();
        let excerpt = excerpt.replace('|', "\\|").replace('`', "'");
        let more = if sql.chars().count() > 200 {
            " …"
        } else {
            ""
        };
        table.push_str(&format!(
            "| `{id}` | {operations} | {key} | `{excerpt}`{more} |\n"
        ));
    }
    table
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_statement_is_in_the_scale_out_catalogue() {
    let recorder = Recorder::start(&postgres_address()).await;
    let (admin, a) = new_key("ops", Role::Admin).unwrap();
    let (shop, s) = new_key("shop-a", Role::Storefront).unwrap();
    let (payments, p) = new_key("psp", Role::Payments).unwrap();
    let through = format!("127.0.0.1:{}", recorder.port);
    let Some(app) = TestApp::try_spawn_with(Backend::Postgres, |c| {
        c.api_keys = Some(Secret::new(format!("{a},{s},{p}")));
        c.database_url = c.database_url.replace(&postgres_address(), &through);
        // Every statement parsed each time it is sent, and one at a time.
        c.db_prepared_statements = false;
        c.db_pool_size = 1;
    })
    .await
    else {
        return;
    };
    let mut t = Tour {
        app,
        recorder,
        admin,
        shop,
        payments,
        sent: BTreeMap::new(),
        toured: BTreeSet::new(),
    };
    let (admin, shop, payments) = (t.admin.clone(), t.shop.clone(), t.payments.clone());
    let post = Method::POST;
    let get = Method::GET;

    // Public operations.
    for (operation, path) in [
        ("get_health", "/healthz"),
        ("get_readiness", "/readyz"),
        ("get_metrics", "/metrics"),
        ("get_openapi", "/openapi.json"),
        ("get_docs", "/docs/"),
        ("get_console", "/console"),
        ("get_console_css", "/console/console.css"),
        ("get_console_js", "/console/console.js"),
    ] {
        t.call(operation, &admin, get.clone(), path, None).await;
    }

    // Assets.
    for id in ["S-1", "S-2", "S-3", "S-4", "S-5"] {
        let body = json!({"id": id, "name": id});
        t.call(
            "create_asset",
            &admin,
            post.clone(),
            "/v1/assets",
            Some(body),
        )
        .await;
    }
    // A batch: one new asset, one the same as S-5, with price and attributes.
    let batch = json!({"items": [
        {"id": "S-6", "name": "S-6", "price": {"amount": 100, "currency": "EUR"},
         "attributes": {"region": "B", "digits": 4}},
        {"id": "S-5", "name": "S-5"},
    ]});
    t.call(
        "create_assets",
        &admin,
        post.clone(),
        "/v1/assets/batch",
        Some(batch),
    )
    .await;
    let priced =
        json!({"price": {"amount": 90, "currency": "EUR"}, "attributes": {"vanity": true}});
    t.call(
        "update_asset",
        &admin,
        Method::PATCH,
        "/v1/assets/S-6",
        Some(priced),
    )
    .await;
    let opening = json!({"available_from": "2020-01-01T00:00:00Z"});
    t.call(
        "update_asset",
        &admin,
        Method::PATCH,
        "/v1/assets/S-2",
        Some(opening),
    )
    .await;
    t.call(
        "withdraw_asset",
        &admin,
        post.clone(),
        "/v1/assets/S-4/withdraw",
        None,
    )
    .await;
    t.call(
        "reinstate_asset",
        &admin,
        post.clone(),
        "/v1/assets/S-4/reinstate",
        None,
    )
    .await;

    // A hold, its replay, a loser; the reads of a storefront and an admin.
    let hold = json!({"buyer_id": "b-1", "hold_seconds": 60});
    let key = idempotency_key();
    let held = t
        .app
        .client
        .post(t.app.url("/v1/assets/S-1/reservations"))
        .bearer_auth(&shop)
        .header("Idempotency-Key", &key)
        .json(&hold);
    t.recorder.take();
    let first: Value = held.send().await.unwrap().json().await.unwrap();
    for statement in t.recorder.take() {
        let statement = normalise(&statement);
        if !bookkeeping(&statement) {
            t.sent
                .entry(statement)
                .or_default()
                .insert("hold_asset".into());
        }
    }
    let res1 = first["reservation_id"].as_str().unwrap().to_owned();
    let other = json!({"buyer_id": "b-2", "hold_seconds": 60});
    t.call(
        "hold_asset",
        &shop,
        post.clone(),
        "/v1/assets/S-1/reservations",
        Some(other),
    )
    .await;
    // Holds that arrive together are read together, by the batch
    // statement: bursts until one was.
    for _ in 0..20 {
        t.recorder.take();
        let burst = (0..32).map(|i| {
            t.app
                .client
                .post(t.app.url("/v1/assets/S-1/reservations"))
                .bearer_auth(&shop)
                .header("Idempotency-Key", idempotency_key())
                .json(&json!({"buyer_id": format!("crowd-{i}")}))
                .send()
        });
        for answer in futures_util::future::join_all(burst).await {
            assert_eq!(answer.unwrap().status(), 409);
        }
        let mut batched = false;
        for statement in t.recorder.take() {
            let statement = normalise(&statement);
            batched |= statement.contains("unnest(");
            if !bookkeeping(&statement) {
                t.sent
                    .entry(statement)
                    .or_default()
                    .insert("hold_asset".into());
            }
        }
        if batched {
            break;
        }
    }
    // A buyer queues for the held asset, reads the queue, leaves it; an
    // admin offers an available asset to a named buyer.
    let queue = json!({"buyer_id": "b-3"});
    t.call(
        "join_waitlist",
        &shop,
        post.clone(),
        "/v1/assets/S-1/waitlist",
        Some(queue),
    )
    .await;
    for token in [&shop, &admin] {
        t.call(
            "list_waitlist",
            token,
            get.clone(),
            "/v1/assets/S-1/waitlist",
            None,
        )
        .await;
    }
    t.call(
        "leave_waitlist",
        &shop,
        Method::DELETE,
        "/v1/assets/S-1/waitlist/b-3",
        None,
    )
    .await;
    let tomorrow = chrono::Utc::now() + chrono::Duration::days(1);
    let offer = json!({"buyer_id": "b-4", "client": "shop-a",
        "expires_at": tomorrow.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)});
    t.call(
        "make_offer",
        &admin,
        post.clone(),
        "/v1/assets/S-6/offers",
        Some(offer),
    )
    .await;
    for (token, path) in [
        (&shop, "/v1/assets/S-1".to_owned()),
        (&admin, "/v1/assets/S-1".to_owned()),
    ] {
        t.call("get_asset", token, get.clone(), &path, None).await;
    }
    for token in [&shop, &admin] {
        t.call(
            "list_assets",
            token,
            get.clone(),
            "/v1/assets?limit=2",
            None,
        )
        .await;
        t.call(
            "list_assets",
            token,
            get.clone(),
            "/v1/assets?status=HELD",
            None,
        )
        .await;
        for filtered in [
            "/v1/assets?id_prefix=S-&price_max=95&currency=EUR",
            "/v1/assets?attribute=region:B&attribute=digits:4&status=AVAILABLE",
        ] {
            t.call("list_assets", token, get.clone(), filtered, None)
                .await;
        }
        let path = format!("/v1/reservations/{res1}");
        t.call("get_reservation", token, get.clone(), &path, None)
            .await;
        t.call(
            "list_reservations",
            token,
            get.clone(),
            "/v1/reservations",
            None,
        )
        .await;
        let filtered = "/v1/reservations?buyer_id=b-1&asset_id=S-1&status=HELD";
        t.call("list_reservations", token, get.clone(), filtered, None)
            .await;
        t.call(
            "list_asset_events",
            token,
            get.clone(),
            "/v1/assets/S-1/events",
            None,
        )
        .await;
        t.call("list_events", token, get.clone(), "/v1/events", None)
            .await;
    }
    t.call(
        "count_assets",
        &admin,
        get.clone(),
        "/v1/asset-counts",
        None,
    )
    .await;
    let extend = json!({"hold_seconds": 120});
    let path = format!("/v1/reservations/{res1}/extend");
    t.call(
        "extend_reservation",
        &shop,
        post.clone(),
        &path,
        Some(extend),
    )
    .await;

    // The sale, its payment's fate, and its void with a refund.
    let path = format!("/v1/reservations/{res1}/commit");
    let pay = json!({"payment_reference": "pay-1"});
    t.call(
        "commit_reservation",
        &payments,
        post.clone(),
        &path,
        Some(pay),
    )
    .await;
    t.call(
        "get_payment",
        &payments,
        get.clone(),
        "/v1/payments/pay-1",
        None,
    )
    .await;
    let path = format!("/v1/reservations/{res1}/void");
    t.call("void_reservation", &admin, post.clone(), &path, None)
        .await;

    // A release, a payment after it (a refund), the refund completed.
    let hold = json!({"buyer_id": "b-3", "hold_seconds": 60});
    let second = t
        .call(
            "hold_asset",
            &shop,
            post.clone(),
            "/v1/assets/S-3/reservations",
            Some(hold),
        )
        .await;
    let res2 = second["reservation_id"].as_str().unwrap().to_owned();
    let path = format!("/v1/reservations/{res2}/release");
    t.call("release_reservation", &shop, post.clone(), &path, None)
        .await;
    let path = format!("/v1/reservations/{res2}/commit");
    let pay = json!({"payment_reference": "pay-2"});
    t.call(
        "commit_reservation",
        &payments,
        post.clone(),
        &path,
        Some(pay),
    )
    .await;
    let refunds = t
        .call(
            "list_refunds",
            &payments,
            get.clone(),
            "/v1/refunds?status=REQUESTED",
            None,
        )
        .await;
    let refund = refunds["items"][0]["refund_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("/v1/refunds/{refund}/complete");
    t.call("complete_refund", &payments, post.clone(), &path, None)
        .await;
    // The same reference sent to another reservation: its fate is taken.
    let pay = json!({"payment_reference": "pay-1"});
    let path = format!("/v1/reservations/{res2}/commit");
    t.call(
        "commit_reservation",
        &payments,
        post.clone(),
        &path,
        Some(pay),
    )
    .await;

    // A hold that lapsed: reclaimed by the next hold, its payment refunded.
    let hold = json!({"buyer_id": "b-4", "hold_seconds": 60});
    let third = t
        .call(
            "hold_asset",
            &shop,
            post.clone(),
            "/v1/assets/S-5/reservations",
            Some(hold),
        )
        .await;
    let res3 = third["reservation_id"].as_str().unwrap().to_owned();
    t.app.lapse(&res3).await;
    let hold = json!({"buyer_id": "b-5", "hold_seconds": 60});
    t.call(
        "hold_asset",
        &shop,
        post.clone(),
        "/v1/assets/S-5/reservations",
        Some(hold),
    )
    .await;
    let path = format!("/v1/reservations/{res3}/commit");
    let pay = json!({"payment_reference": "pay-3"});
    t.call(
        "commit_reservation",
        &payments,
        post.clone(),
        &path,
        Some(pay),
    )
    .await;
    // And a lapsed hold that its payment finds before any hold reclaims it.
    let hold = json!({"buyer_id": "b-6", "hold_seconds": 60});
    let fourth = t
        .call(
            "hold_asset",
            &shop,
            post.clone(),
            "/v1/assets/S-2/reservations",
            Some(hold),
        )
        .await;
    let res4 = fourth["reservation_id"].as_str().unwrap().to_owned();
    t.app.lapse(&res4).await;
    let path = format!("/v1/reservations/{res4}/commit");
    let pay = json!({"payment_reference": "pay-4"});
    t.call(
        "commit_reservation",
        &payments,
        post.clone(),
        &path,
        Some(pay),
    )
    .await;

    // An event parked as dead, listed and sent again.
    t.app
        .sql("UPDATE events SET dead_at = now() WHERE sequence = 1 AND asset_id = 'S-3'")
        .await;
    let dead = t
        .call(
            "list_dead_events",
            &admin,
            get.clone(),
            "/v1/events/dead",
            None,
        )
        .await;
    let event = dead["items"][0]["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/events/{event}/redeliver");
    t.call("redeliver_event", &admin, post.clone(), &path, None)
        .await;

    // Every operation of the document was toured.
    let doc = t.app.get_json("/openapi.json").await;
    let mut operations = BTreeSet::new();
    for item in doc["paths"].as_object().unwrap().values() {
        for op in item.as_object().unwrap().values() {
            operations.insert(op["operationId"].as_str().unwrap().to_owned());
        }
    }
    let untoured: Vec<_> = operations.difference(&t.toured).collect();
    assert!(untoured.is_empty(), "operations not toured: {untoured:?}");

    // The catalogue, against what was sent.
    let doc = std::fs::read_to_string(CATALOGUE).unwrap();
    let catalogue = parse_catalogue(&doc);
    let mut rows = Vec::new();
    let mut problems = Vec::new();
    for (sql, senders) in &t.sent {
        let id = fingerprint(sql);
        let senders = senders.iter().cloned().collect::<Vec<_>>().join(", ");
        let key = match catalogue.get(&id) {
            Some((listed, key)) => {
                if *listed != senders {
                    problems.push(format!("{id} is sent by {senders}, listed for {listed}"));
                }
                key.clone()
            }
            None => {
                problems.push(format!("{id} is not in the catalogue: {sql}"));
                "?".to_owned()
            }
        };
        for letter in key.split('+') {
            match KEYS.iter().find(|(code, _)| *code == letter) {
                Some((_, word)) if sql.to_lowercase().contains(word) => {}
                Some(_) => problems.push(format!("{id} is keyed {letter}, but: {sql}")),
                None => problems.push(format!("{id} has no known key ({key}): {sql}")),
            }
        }
        rows.push((id, senders, key, sql.clone()));
    }
    for id in catalogue.keys() {
        if !rows.iter().any(|(sent, ..)| sent == id) {
            problems.push(format!("{id} is in the catalogue but no operation sent it"));
        }
    }
    let table = render(&rows);
    if std::env::var("HOLDFAST_UPDATE_CATALOGUE").is_ok() {
        let (head, rest) = doc.split_once(BEGIN).unwrap();
        let (_, tail) = rest.split_once(END).unwrap();
        std::fs::write(CATALOGUE, format!("{head}{BEGIN}\n{table}{END}{tail}")).unwrap();
    }
    assert!(
        problems.is_empty(),
        "docs/scale-out.md's statement catalogue does not match what the operations sent \
         (HOLDFAST_UPDATE_CATALOGUE=1 rewrites it; classify every `?`):\n{}\n\n{table}",
        problems.join("\n")
    );
}
