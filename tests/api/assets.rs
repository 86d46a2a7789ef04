use serde_json::{json, Value};

use crate::backend_tests;
use crate::helpers::{unique, Backend, TestApp};

async fn create_asset_answers_201_with_location(app: TestApp) {
    let id = unique("EQ");
    let response = app
        .post("/v1/assets", None, &json!({"id": id, "name": "Excavator"}))
        .await;
    assert_eq!(response.status(), 201);
    assert_eq!(
        response.headers()["location"],
        format!("/v1/assets/{id}").as_str()
    );
    let asset: serde_json::Value = response.json().await.unwrap();
    assert_eq!(asset["id"], id.as_str());
    assert_eq!(asset["name"], "Excavator");
    assert_eq!(asset["status"], "AVAILABLE");
    assert_eq!(asset["hold_expires_at"], serde_json::Value::Null);
    assert_eq!(asset["current_reservation_id"], serde_json::Value::Null);
    assert_eq!(asset["version"], 1);
    assert_eq!(asset["created_at"], asset["updated_at"]);
    assert_eq!(app.get_json(&format!("/v1/assets/{id}")).await, asset);
}

async fn duplicate_asset_is_409_asset_exists(app: TestApp) {
    app.create_asset("EQ-7").await;
    let response = app
        .post("/v1/assets", None, &json!({"id": "EQ-7", "name": "Other"}))
        .await;
    assert_eq!(response.status(), 409);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error_code"], "ASSET_EXISTS");
    assert_eq!(app.get_json("/v1/assets/EQ-7").await["name"], "Lot EQ-7");
}

async fn invalid_asset_fields_are_422_listing_each(app: TestApp) {
    let response = app
        .post("/v1/assets", None, &json!({"id": "-bad id", "name": ""}))
        .await;
    assert_eq!(response.status(), 422);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error_code"], "VALIDATION_FAILED");
    let fields: Vec<&str> = body["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["id", "name"]);

    let response = app
        .post(
            "/v1/assets",
            None,
            &json!({"id": "A1", "name": "x", "colour": "red"}),
        )
        .await;
    assert_eq!(response.status(), 422);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["errors"][0]["field"], "colour");

    let response = app.post("/v1/assets", None, &json!({"id": "A1"})).await;
    assert_eq!(response.status(), 422);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["errors"][0]["field"], "name");

    let response = app
        .post("/v1/assets", None, &json!({"id": 12, "name": "x"}))
        .await;
    assert_eq!(response.status(), 422);
    assert_eq!(app.count("SELECT count(*) FROM assets").await, 0);
}

async fn unknown_asset_is_404(app: TestApp) {
    for path in [
        "/v1/assets/NOPE-1",
        "/v1/assets/-not-an-id",
        "/v1/assets/NOPE-1/events",
    ] {
        let response = app.get(path).await;
        assert_eq!(response.status(), 404, "{path}");
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["error_code"], "ASSET_NOT_FOUND");
    }
}

async fn list_pages_by_cursor_and_filters_by_effective_status(app: TestApp) {
    for i in 0..7 {
        app.create_asset(&format!("L-{i}")).await;
    }
    let held = app.hold("L-1", "b", 600).await;
    let lapsing = app.hold("L-2", "b", 60).await;
    let sold = app.hold("L-3", "b", 600).await;
    let r = app
        .commit(sold["reservation_id"].as_str().unwrap(), "c-1", "pay-1")
        .await;
    assert_eq!(r.status(), 200);
    app.lapse(lapsing["reservation_id"].as_str().unwrap()).await;

    // All, three at a time.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/assets?limit=3&cursor={c}"),
            None => "/v1/assets?limit=3".to_owned(),
        };
        let page = app.get_json(&path).await;
        for item in page["items"].as_array().unwrap() {
            seen.push(item["id"].as_str().unwrap().to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen, ["L-0", "L-1", "L-2", "L-3", "L-4", "L-5", "L-6"]);

    let ids = |page: serde_json::Value| -> Vec<String> {
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(ids(app.get_json("/v1/assets?status=HELD").await), ["L-1"]);
    assert_eq!(ids(app.get_json("/v1/assets?status=SOLD").await), ["L-3"]);
    // The lapsed hold reads AVAILABLE before any sweep.
    assert_eq!(
        ids(app.get_json("/v1/assets?status=AVAILABLE").await),
        ["L-0", "L-2", "L-4", "L-5", "L-6"]
    );
    let page = app.get_json("/v1/assets?status=HELD").await;
    assert_eq!(
        page["items"][0]["current_reservation_id"],
        held["reservation_id"]
    );
    assert_eq!(page["next_cursor"], serde_json::Value::Null);
}

async fn list_rejects_bad_parameters_with_422(app: TestApp) {
    for query in [
        "limit=0",
        "limit=501",
        "limit=ten",
        "status=GONE",
        "cursor=%21%21",
    ] {
        let response = app.get(&format!("/v1/assets?{query}")).await;
        assert_eq!(response.status(), 422, "{query}");
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["error_code"], "VALIDATION_FAILED", "{query}");
    }
}

/// Sale openings at the extremes of what both databases keep: accepted
/// within 0001..9999 in UTC, refused with the field named beyond, and no
/// later read answers 500.
async fn opening_times_stay_within_four_digit_years(app: TestApp) {
    for (i, (when, ok)) in [
        ("0001-01-01T00:00:00Z", true),
        ("9999-12-31T23:59:59.999999Z", true),
        ("9999-12-31T23:59:59+14:00", true),
        ("0001-01-01T00:00:00-12:00", true),
        ("0000-12-31T23:59:59Z", false),
        ("9999-12-31T23:59:59-01:00", false),
        ("0001-01-01T00:30:00+01:00", false),
        ("10000-01-01T00:00:00Z", false),
        ("2026-02-30T00:00:00Z", false),
    ]
    .into_iter()
    .enumerate()
    {
        let id = format!("DT-{i}");
        let created = app
            .post(
                "/v1/assets",
                None,
                &json!({"id": id, "name": "d", "available_from": when}),
            )
            .await;
        let patched = app
            .request(reqwest::Method::PATCH, "/v1/assets/DT-0")
            .await
            .json(&json!({"available_from": when}))
            .send()
            .await
            .unwrap();
        for response in [created, patched] {
            let status = response.status().as_u16();
            let body: Value = response.json().await.unwrap();
            if ok {
                assert!(status == 200 || status == 201, "{when}: {body}");
            } else {
                assert_eq!(status, 422, "{when}: {body}");
                assert_eq!(body["errors"][0]["field"], "available_from", "{when}");
            }
        }
        // Whatever was stored reads back.
        for path in [
            format!("/v1/assets/{id}"),
            "/v1/assets/DT-0".to_owned(),
            "/v1/assets?limit=500".to_owned(),
            "/v1/assets/DT-0/events".to_owned(),
            "/v1/asset-counts".to_owned(),
            "/v1/events".to_owned(),
        ] {
            let response = app.get(&path).await;
            assert!(response.status().as_u16() < 500, "{when} then {path}");
        }
        let hold = app
            .post(
                "/v1/assets/DT-1/reservations",
                Some(&crate::helpers::new_key()),
                &json!({"buyer_id": "b"}),
            )
            .await;
        assert!(hold.status().as_u16() < 500, "{when}: hold");
    }
}

/// The timeline pages like every other list.
async fn the_timeline_pages_by_cursor(app: TestApp) {
    app.create_asset("TL-1").await;
    for i in 0..5 {
        let held = app.hold("TL-1", &format!("b{i}"), 300).await;
        let id = held["reservation_id"].as_str().unwrap();
        assert_eq!(
            app.release(id, &crate::helpers::new_key()).await.status(),
            200
        );
    }
    let all = app.get_json("/v1/assets/TL-1/events").await;
    assert_eq!(all["items"].as_array().unwrap().len(), 10);
    assert_eq!(all["next_cursor"], Value::Null);
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/assets/TL-1/events?limit=3&cursor={c}"),
            None => "/v1/assets/TL-1/events?limit=3".to_owned(),
        };
        let page = app.get_json(&path).await;
        for e in page["items"].as_array().unwrap() {
            seen.push(e["sequence"].as_i64().unwrap());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen, (1..=10).collect::<Vec<_>>());
    for bad in ["limit=0", "limit=501", "cursor=!!", "cursor=LTE"] {
        let response = app.get(&format!("/v1/assets/TL-1/events?{bad}")).await;
        assert_eq!(response.status(), 422, "{bad}");
    }
}

/// Without `limit`, a timeline page holds 500 events. The 600 events are
/// written straight into the database (withdrawn, reinstated, …).
async fn the_timeline_page_is_500_by_default(app: TestApp) {
    app.create_asset("TL-5").await;
    let created_at = match app.backend {
        Backend::Postgres => "now()",
        Backend::Sqlite => "'2026-11-29T12:00:00.000000Z'",
    };
    app.sql(&format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 600) \
         INSERT INTO events (id, asset_id, sequence, type, data, created_at) \
         SELECT 'evt_tl5_' || i, 'TL-5', i, \
                CASE WHEN i % 2 = 1 THEN 'asset.withdrawn' ELSE 'asset.reinstated' END, \
                '{{}}', {created_at} FROM n; \
         UPDATE assets SET last_event_sequence = 600 WHERE id = 'TL-5';"
    ))
    .await;
    let first = app.get_json("/v1/assets/TL-5/events").await;
    let items = first["items"].as_array().unwrap();
    assert_eq!(items.len(), 500);
    assert_eq!(items[499]["sequence"], 500);
    let cursor = first["next_cursor"].as_str().expect("a next page");
    let rest = app
        .get_json(&format!("/v1/assets/TL-5/events?cursor={cursor}"))
        .await;
    assert_eq!(rest["items"].as_array().unwrap().len(), 100);
    assert_eq!(rest["items"][0]["sequence"], 501);
    assert_eq!(rest["next_cursor"], Value::Null);
}

backend_tests!(
    the_timeline_page_is_500_by_default,
    opening_times_stay_within_four_digit_years,
    the_timeline_pages_by_cursor,
    create_asset_answers_201_with_location,
    duplicate_asset_is_409_asset_exists,
    invalid_asset_fields_are_422_listing_each,
    unknown_asset_is_404,
    list_pages_by_cursor_and_filters_by_effective_status,
    list_rejects_bad_parameters_with_422,
);

/// A page of one status on PostgreSQL walks that status's shelf, never every
/// id in order: with 20,000 WITHDRAWN assets before the first AVAILABLE one
/// and fresh statistics (which make both walks look alike to the planner),
/// the first page of AVAILABLE and of WITHDRAWN each read about a page of
/// assets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_page_reads_its_shelf_not_every_asset_on_postgres() {
    let Some(app) = TestApp::try_spawn(Backend::Postgres).await else {
        return;
    };
    app.sql(
        "INSERT INTO assets (id, name, status, created_at, updated_at) \
         SELECT 'A-' || lpad(g::text, 6, '0'), 'Lot', 'WITHDRAWN', now(), now() \
           FROM generate_series(1, 20000) g; \
         INSERT INTO assets (id, name, created_at, updated_at) \
         SELECT 'B-' || lpad(g::text, 6, '0'), 'Lot', now(), now() \
           FROM generate_series(1, 30000) g; \
         ANALYZE assets",
    )
    .await;
    let read = async || {
        app.count(
            "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) \
             FROM pg_stat_user_tables WHERE relname = 'assets'",
        )
        .await
    };
    for (status, first) in [("AVAILABLE", "B-000001"), ("WITHDRAWN", "A-000001")] {
        let before = read().await;
        let page = app
            .get_json(&format!("/v1/assets?status={status}&limit=50"))
            .await;
        assert_eq!(page["items"][0]["id"], first, "{status}");
        assert_eq!(page["items"].as_array().map(Vec::len), Some(50));
        // A backend reports its counts when idle, all at once, within a
        // second or so.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut rows = 0;
        while rows == 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            rows = read().await - before;
        }
        assert!(rows > 0, "PostgreSQL never reported the page's reads");
        assert!(rows <= 500, "the first page of {status} read {rows} assets");
    }
}
