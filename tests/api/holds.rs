use serde_json::{json, Value};

use crate::backend_tests;
use crate::helpers::{new_key, TestApp};

async fn hold_creates_a_reservation_and_the_asset_reads_held(app: TestApp) {
    app.create_asset("H-1").await;
    let response = app
        .post(
            "/v1/assets/H-1/reservations",
            Some("k-1"),
            &json!({"buyer_id": "buyer-1", "hold_seconds": 120}),
        )
        .await;
    assert_eq!(response.status(), 201);
    let location = response.headers()["location"].to_str().unwrap().to_owned();
    assert!(response.headers().get("idempotent-replayed").is_none());
    let r: Value = response.json().await.unwrap();
    let id = r["reservation_id"].as_str().unwrap();
    assert!(id.starts_with("res_") && id.len() == 30, "{id}");
    assert_eq!(location, format!("/v1/reservations/{id}"));
    assert_eq!(r["asset_id"], "H-1");
    assert_eq!(r["buyer_id"], "buyer-1");
    assert_eq!(r["status"], "HELD");
    assert_eq!(r["refunds"], json!([]));
    let created = chrono::DateTime::parse_from_rfc3339(r["created_at"].as_str().unwrap()).unwrap();
    let expires = chrono::DateTime::parse_from_rfc3339(r["expires_at"].as_str().unwrap()).unwrap();
    assert_eq!((expires - created).num_seconds(), 120);

    let asset = app.get_json("/v1/assets/H-1").await;
    assert_eq!(asset["status"], "HELD");
    assert_eq!(asset["hold_expires_at"], r["expires_at"]);
    assert_eq!(asset["current_reservation_id"], id);
    assert_eq!(asset["version"], 2);
    assert_eq!(app.get_json(&location).await, r);

    let events = app.get_json("/v1/assets/H-1/events").await;
    assert_eq!(events["items"].as_array().unwrap().len(), 1);
    assert_eq!(events["items"][0]["type"], "reservation.held");
    assert_eq!(events["items"][0]["sequence"], 1);
    assert_eq!(events["items"][0]["data"], r);
}

async fn hold_defaults_to_600_seconds(app: TestApp) {
    app.create_asset("H-2").await;
    let response = app
        .post(
            "/v1/assets/H-2/reservations",
            Some(&new_key()),
            &json!({"buyer_id": "b"}),
        )
        .await;
    assert_eq!(response.status(), 201);
    let r: Value = response.json().await.unwrap();
    let created = chrono::DateTime::parse_from_rfc3339(r["created_at"].as_str().unwrap()).unwrap();
    let expires = chrono::DateTime::parse_from_rfc3339(r["expires_at"].as_str().unwrap()).unwrap();
    assert_eq!((expires - created).num_seconds(), 600);
}

async fn taken_asset_is_409_telling_held_from_sold(app: TestApp) {
    app.create_asset("H-3").await;
    let first = app.hold("H-3", "a", 300).await;
    let response = app
        .post(
            "/v1/assets/H-3/reservations",
            Some(&new_key()),
            &json!({"buyer_id": "b"}),
        )
        .await;
    assert_eq!(response.status(), 409);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error_code"], "ASSET_UNAVAILABLE");
    assert_eq!(body["asset_status"], "HELD");
    assert_eq!(body["hold_expires_at"], first["expires_at"]);
    assert_eq!(body["status"], 409);
    assert_eq!(body["type"], "about:blank");

    let r = app
        .commit(first["reservation_id"].as_str().unwrap(), "c", "pay-h3")
        .await;
    assert_eq!(r.status(), 200);
    let response = app
        .post(
            "/v1/assets/H-3/reservations",
            Some(&new_key()),
            &json!({"buyer_id": "b"}),
        )
        .await;
    assert_eq!(response.status(), 409);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["asset_status"], "SOLD");
    assert!(body.get("hold_expires_at").is_none());
    // Losers write nothing.
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 1);
    assert_eq!(app.count("SELECT count(*) FROM idempotency_keys").await, 2);
}

async fn hold_on_unknown_asset_is_404(app: TestApp) {
    for path in [
        "/v1/assets/NOPE/reservations",
        "/v1/assets/-bad/reservations",
    ] {
        let response = app
            .post(path, Some(&new_key()), &json!({"buyer_id": "b"}))
            .await;
        assert_eq!(response.status(), 404, "{path}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error_code"], "ASSET_NOT_FOUND");
    }
}

async fn hold_fields_are_validated(app: TestApp) {
    app.create_asset("H-4").await;
    let long_buyer = "b".repeat(65);
    for body in [
        json!({"buyer_id": "b", "hold_seconds": 0}),
        json!({"buyer_id": "b", "hold_seconds": 3601}),
        json!({"buyer_id": "b", "hold_seconds": 1.5}),
        json!({"buyer_id": "b", "hold_seconds": "60"}),
        json!({"buyer_id": ""}),
        json!({"buyer_id": long_buyer}),
        json!({"hold_seconds": 60}),
        json!({"buyer_id": "b", "hold": 60}),
    ] {
        let response = app
            .post("/v1/assets/H-4/reservations", Some(&new_key()), &body)
            .await;
        assert_eq!(response.status(), 422, "{body}");
        let problem: Value = response.json().await.unwrap();
        assert_eq!(problem["error_code"], "VALIDATION_FAILED", "{body}");
        assert!(problem["errors"][0]["field"].is_string(), "{body}");
    }
    assert_eq!(app.get_json("/v1/assets/H-4").await["status"], "AVAILABLE");
}

async fn lapsed_hold_reads_over_and_is_reclaimed_by_the_next_hold(app: TestApp) {
    app.create_asset("H-5").await;
    let first = app.hold("H-5", "slow", 60).await;
    let first_id = first["reservation_id"].as_str().unwrap();
    app.lapse(first_id).await;

    // Effective status before any sweep.
    let asset = app.get_json("/v1/assets/H-5").await;
    assert_eq!(asset["status"], "AVAILABLE");
    assert_eq!(asset["hold_expires_at"], Value::Null);
    assert_eq!(asset["current_reservation_id"], Value::Null);
    let r = app.get_json(&format!("/v1/reservations/{first_id}")).await;
    assert_eq!(r["status"], "EXPIRED");

    // The next hold claims it; the displaced reservation is EXPIRED in the same transaction.
    let second = app.hold("H-5", "quick", 300).await;
    assert_eq!(
        app.get_json("/v1/assets/H-5").await["current_reservation_id"],
        second["reservation_id"]
    );
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM reservations WHERE id = '{first_id}' AND status = 'EXPIRED'"
        ))
        .await,
        1
    );
    let events = app.get_json("/v1/assets/H-5/events").await;
    let kinds: Vec<(&str, i64)> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["type"].as_str().unwrap(), e["sequence"].as_i64().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("reservation.held", 1),
            ("reservation.expired", 2),
            ("reservation.held", 3)
        ]
    );
    assert_eq!(events["items"][1]["data"]["reservation_id"], first_id);
    assert_eq!(events["items"][1]["data"]["status"], "EXPIRED");
}

backend_tests!(
    hold_creates_a_reservation_and_the_asset_reads_held,
    hold_defaults_to_600_seconds,
    taken_asset_is_409_telling_held_from_sold,
    hold_on_unknown_asset_is_404,
    hold_fields_are_validated,
    lapsed_hold_reads_over_and_is_reclaimed_by_the_next_hold,
);

/// Rows of `reservations` read so far, by scans and index lookups, as far as
/// the server has reported: (rows inserted, rows read).
async fn reservation_reads(app: &TestApp) -> (i64, i64) {
    let inserted = app
        .count("SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'reservations'")
        .await;
    let read = app
        .count(
            "SELECT coalesce(t.seq_tup_read, 0) + coalesce(sum(i.idx_tup_read), 0)::bigint \
             FROM pg_stat_user_tables t LEFT JOIN pg_stat_user_indexes i USING (relid) \
             WHERE t.relname = 'reservations' GROUP BY t.seq_tup_read",
        )
        .await;
    (inserted, read)
}

/// The reads once the server has reported `inserted` reservations (a
/// backend reports its counts when idle, within a second or so).
async fn reservation_reads_after(app: &TestApp, inserted: i64) -> i64 {
    for _ in 0..100 {
        let (seen, read) = reservation_reads(app).await;
        if seen >= inserted {
            return read;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    panic!("PostgreSQL never reported {inserted} reservations inserted");
}

/// PostgreSQL keeps a prepared statement's plan until the statistics of its
/// tables change, and with autovacuum off (or before it comes round) they do
/// not: plans made while there were few reservations (where reading the
/// whole table is cheapest) would be kept as the table grows, and every hold
/// and sale would then read every reservation. The service remakes its
/// sessions' plans each time the writes it has committed double.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_made_on_a_small_table_do_not_outlive_its_growth() {
    use futures_util::StreamExt;
    // Behind a pooler the plans live in the pooler's server connections.
    if std::env::var_os("HOLDFAST_TEST_POOLER_URL").is_some() {
        return;
    }
    let Some(app) = TestApp::try_spawn_with(crate::helpers::Backend::Postgres, |config| {
        config.db_pool_size = 1;
    })
    .await
    else {
        return;
    };
    app.sql(
        "ALTER TABLE reservations SET (autovacuum_enabled = false); \
         ALTER TABLE idempotency_keys SET (autovacuum_enabled = false); \
         ALTER TABLE payments SET (autovacuum_enabled = false); \
         INSERT INTO assets (id, name, created_at, updated_at) \
         SELECT 'lot-' || g, 'Lot', now(), now() FROM generate_series(1, 1300) g; \
         ANALYZE",
    )
    .await;
    let sale = async |n: usize| {
        let held = app
            .hold(&format!("lot-{n}"), &format!("buyer-{n}"), 600)
            .await;
        let reservation = held["reservation_id"].as_str().expect("a reservation id");
        let sold = app
            .commit(reservation, &new_key(), &format!("pay-{n}"))
            .await;
        assert_eq!(sold.status(), 200, "commit lot-{n}");
    };
    // Every statement of a hold and a sale runs more than five times while
    // the table is small: PostgreSQL then keeps a generic plan.
    for n in 1..=10 {
        sale(n).await;
    }
    // The table grows twentyfold, through the service.
    futures_util::stream::iter(11..=1250)
        .for_each_concurrent(16, async |n| {
            app.hold(&format!("lot-{n}"), &format!("buyer-{n}"), 600)
                .await;
        })
        .await;
    let before = reservation_reads_after(&app, 1250).await;
    for n in 1251..=1270 {
        sale(n).await;
    }
    let read = reservation_reads_after(&app, 1270).await - before;
    assert!(
        read <= 20 * 20,
        "20 holds and sales read {read} rows of reservations, among 1,270"
    );
}

/// The batched first read of requests about reservations keeps the
/// general plan PostgreSQL makes for it, however small the batches its
/// session starts with. PostgreSQL plans a prepared statement for its
/// values at its first five executions and keeps doing so while such plans
/// look cheaper than the general one: a plan made for an array it can see,
/// shorter than the ten rows the general plan assumes, would, and every
/// batch of commits would be planned again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_batched_read_of_reservations_keeps_its_general_plan() {
    use diesel::sql_types::BigInt;
    use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
    #[derive(diesel::QueryableByName)]
    struct Plans {
        #[diesel(sql_type = BigInt)]
        generic_plans: i64,
        #[diesel(sql_type = BigInt)]
        custom_plans: i64,
    }
    // Behind a pooler, one session's statements may reach two servers.
    if std::env::var_os("HOLDFAST_TEST_POOLER_URL").is_some() {
        return;
    }
    let Some(app) = TestApp::try_spawn(crate::helpers::Backend::Postgres).await else {
        return;
    };
    let mut conn = AsyncPgConnection::establish(app.database_url())
        .await
        .expect("connect");
    // Tables of some size, analysed, as a running service's are.
    conn.batch_execute(
        "INSERT INTO assets (id, name, created_at, updated_at) \
         SELECT 'lot-' || g, 'Lot', now(), now() FROM generate_series(1, 2000) g; \
         INSERT INTO idempotency_keys (client, key, fingerprint, status_code, body, created_at) \
         SELECT 'shop', 'lot-' || g, 'f', 200, '{}', now() FROM generate_series(1, 2000) g; \
         ANALYZE",
    )
    .await
    .expect("the tables fill");
    // Ten batches of two requests, the statement prepared as the service
    // prepares it (its five arrays typed by their use).
    let sql = holdfast::store::RESERVATION_SNAPSHOT_BATCH_SQL.as_str();
    let mut batches = format!("PREPARE batch AS {sql};");
    for _ in 0..10 {
        batches.push_str(&format!(
            "EXECUTE batch ({});",
            ["ARRAY['lot-1', 'lot-2']"; 5].join(", ")
        ));
    }
    conn.batch_execute(&batches).await.expect("the batches run");
    let plans: Plans = diesel::sql_query(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = 'batch'",
    )
    .get_result(&mut conn)
    .await
    .expect("the statement's plans");
    assert!(
        plans.generic_plans >= 5,
        "{} general plans, {} made for their values, of 10 batches of two",
        plans.generic_plans,
        plans.custom_plans
    );
}

/// On PostgreSQL a hold, its release and the next hold change the asset's
/// row in place (a HOT update: no index entry written), because no index of
/// `assets` covers a column they change; only a sale moves the asset to
/// another shelf. An index that covers the status or the expiry again fails
/// this test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_update_the_asset_in_place_on_postgres() {
    let Some(app) = TestApp::try_spawn(crate::helpers::Backend::Postgres).await else {
        return;
    };
    let updates = async || {
        app.count(
            "SELECT n_tup_upd * 1000000 + n_tup_hot_upd FROM pg_stat_user_tables \
             WHERE relname = 'assets'",
        )
        .await
    };
    let before = updates().await;
    for n in 0..10 {
        app.create_asset(&format!("lot-{n}")).await;
        let held = app
            .hold(&format!("lot-{n}"), &format!("buyer-{n}"), 600)
            .await;
        let reservation = held["reservation_id"].as_str().expect("a reservation id");
        let released = app.release(reservation, &new_key()).await;
        assert_eq!(released.status(), 200, "release lot-{n}");
        app.hold(&format!("lot-{n}"), &format!("buyer-{n}"), 600)
            .await;
    }
    // A backend reports its counts when idle, within a second or so.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let (all, hot) = loop {
        let now = updates().await - before;
        let (all, hot) = (now / 1_000_000, now % 1_000_000);
        if all >= 30 || std::time::Instant::now() > deadline {
            break (all, hot);
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert!(
        all >= 30,
        "PostgreSQL reported {all} updates of assets, expected 30"
    );
    assert_eq!(hot, all, "{hot} of {all} updates of assets were HOT");
}
