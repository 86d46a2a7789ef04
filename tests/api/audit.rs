//! `holdfast audit`: clean after real traffic, and it catches what breaks.

use serde_json::Value;

use crate::backend_tests;
use crate::helpers::TestApp;

pub fn audit(app: &TestApp) -> (bool, Value) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args(["audit", "--json"])
        .env("HOLDFAST_DATABASE_URL", app.database_url())
        .output()
        .expect("holdfast audit runs");
    let doc: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|_| {
        panic!(
            "JSON from audit: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    assert_eq!(
        doc["ok"],
        output.status.success(),
        "exit status follows the verdict"
    );
    (output.status.success(), doc)
}

/// The finding of the check `name` in an audit's document.
fn check<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name}"))
}

fn violations(doc: &Value, name: &str) -> i64 {
    check(doc, name)["violations"].as_i64().unwrap()
}

async fn traffic(app: &TestApp) {
    for id in ["AU-1", "AU-2", "AU-3", "AU-4"] {
        app.create_asset(id).await;
    }
    let sold = app.hold("AU-1", "b1", 300).await;
    app.commit(sold["reservation_id"].as_str().unwrap(), "c1", "pay-1")
        .await;
    app.commit(sold["reservation_id"].as_str().unwrap(), "c2", "pay-2")
        .await;
    let released = app.hold("AU-2", "b2", 300).await;
    app.release(released["reservation_id"].as_str().unwrap(), "r1")
        .await;
    app.commit(released["reservation_id"].as_str().unwrap(), "c3", "pay-3")
        .await;
    let lapsed = app.hold("AU-3", "b3", 60).await;
    app.hold("AU-4", "b4", 300).await;
    app.lapse(lapsed["reservation_id"].as_str().unwrap()).await;
    app.commit(lapsed["reservation_id"].as_str().unwrap(), "c4", "pay-4")
        .await;
    holdfast::janitor::run_once(&app.store).await.unwrap();
    // A voided sale and a withdrawn asset.
    app.create_asset("AU-5").await;
    let voided = app.hold("AU-5", "b5", 300).await;
    let voided = voided["reservation_id"].as_str().unwrap();
    app.commit(voided, "c5", "pay-5").await;
    app.post(
        &format!("/v1/reservations/{voided}/void"),
        Some("v5"),
        &serde_json::json!({}),
    )
    .await;
    app.create_asset("AU-6").await;
    app.post("/v1/assets/AU-6/withdraw", None, &serde_json::json!({}))
        .await;
}

async fn the_audit_passes_after_real_traffic_and_catches_breakage(app: TestApp) {
    traffic(&app).await;
    let (ok, doc) = audit(&app);
    assert!(ok, "{doc:#}");
    assert!(doc["checks"].as_array().unwrap().len() >= 10);

    // Break things the way a bug would, and see each one named.
    app.sql("UPDATE assets SET status = 'SOLD', hold_expires_at = NULL WHERE id = 'AU-4'")
        .await;
    app.sql("DELETE FROM events WHERE type = 'reservation.released'")
        .await;
    let (ok, doc) = audit(&app);
    assert!(!ok);
    assert_eq!(violations(&doc, "sold_has_one_commit"), 1, "{doc:#}");
    assert_eq!(violations(&doc, "changes_have_their_events"), 1, "{doc:#}");
    assert!(
        violations(&doc, "event_sequences_have_no_gaps") >= 1,
        "{doc:#}"
    );
    assert_eq!(violations(&doc, "payment_has_one_fate"), 0);
    assert_eq!(violations(&doc, "payments_record_their_fate"), 0);
    assert_eq!(violations(&doc, "voided_sales_are_over"), 0);
    // The status changed behind the API's back is still counted.
    assert_eq!(violations(&doc, "asset_counts_are_kept"), 0, "{doc:#}");
    app.sql("UPDATE asset_counts SET n = n + 1 WHERE status = 'SOLD'")
        .await;
    let (_, doc) = audit(&app);
    assert_eq!(violations(&doc, "asset_counts_are_kept"), 1, "{doc:#}");

    // A voided sale put back as the asset's current one is caught.
    app.sql(
        "UPDATE assets SET status = 'SOLD', current_reservation_id = \
         (SELECT id FROM reservations WHERE status = 'VOIDED') WHERE id = 'AU-5'",
    )
    .await;
    let (_, doc) = audit(&app);
    assert_eq!(violations(&doc, "voided_sales_are_over"), 1, "{doc:#}");
    let sold = check(&doc, "sold_has_one_commit");
    assert_eq!(sold["examples"][0], "AU-4");

    // Money given two fates behind the database's back, in the open mode's
    // client (`-`): pay-1 bought AU-1 and is now also refunded through AU-2's
    // reservation; pay-3, refunded through AU-2's, is refunded again
    // through AU-3's.
    for (id, reference, asset, like) in [
        ("rf_01HZX4B2Q7C3M9D8E6F5G4H3K1", "pay-1", "AU-2", "pay-3"),
        ("rf_01HZX4B2Q7C3M9D8E6F5G4H3K2", "pay-3", "AU-3", "pay-4"),
    ] {
        app.sql(&format!(
            "INSERT INTO refunds (id, reservation_id, asset_id, payment_reference, reason, \
               status, created_at, payment_client) \
             SELECT '{id}', f.reservation_id, f.asset_id, '{reference}', f.reason, \
               'REQUESTED', f.created_at, f.payment_client \
             FROM refunds f WHERE f.asset_id = '{asset}' AND f.payment_reference = '{like}'"
        ))
        .await;
    }
    assert_eq!(
        app.count("SELECT count(*) FROM refunds WHERE id LIKE 'rf_01HZX4B2Q7C3M9D8E6F5G4H3K%'")
            .await,
        2
    );
    let (ok, doc) = audit(&app);
    assert!(!ok);
    let fates = check(&doc, "payment_has_one_fate");
    assert_eq!(fates["violations"], 2, "{doc:#}");
    assert_eq!(fates["examples"], serde_json::json!(["- pay-1", "- pay-3"]));
}

backend_tests!(the_audit_passes_after_real_traffic_and_catches_breakage);

/// On PostgreSQL no foreign key ties a stored answer or a payment to its
/// reservation, nor a reservation or an event to its asset, and no
/// constraint refuses a second HELD reservation of an asset (the writing
/// transaction's guarded update of the asset decides; a check on every hold
/// and sale cost more than it caught): the audit does, and names each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_checks_what_no_foreign_key_does_on_postgres() {
    let Some(app) = TestApp::try_spawn(crate::helpers::Backend::Postgres).await else {
        return;
    };
    traffic(&app).await;
    let (ok, doc) = audit(&app);
    assert!(ok, "{doc:#}");
    app.sql("UPDATE idempotency_keys SET reservation_id = 'res_gone' WHERE key = 'c1'")
        .await;
    app.sql("UPDATE payments SET reservation_id = 'res_gone' WHERE reference = 'pay-1'")
        .await;
    app.sql("UPDATE reservations SET asset_id = 'gone-1' WHERE asset_id = 'AU-1'")
        .await;
    app.sql(
        "INSERT INTO reservations (id, asset_id, buyer_id, status, expires_at, created_at, client) \
         VALUES ('res_second', 'AU-4', 'b9', 'HELD', now() + interval '5 minutes', now(), '-')",
    )
    .await;
    app.sql("UPDATE events SET asset_id = 'gone-2' WHERE id = (SELECT max(id) FROM events)")
        .await;
    let (ok, doc) = audit(&app);
    assert!(!ok);
    assert_eq!(violations(&doc, "answers_point_at_changes"), 1, "{doc:#}");
    assert_eq!(
        violations(&doc, "reservations_and_events_name_assets"),
        2,
        "{doc:#}"
    );
    assert_eq!(
        violations(&doc, "one_held_reservation_per_asset"),
        1,
        "{doc:#}"
    );
    assert!(
        violations(&doc, "payments_record_their_fate") >= 1,
        "{doc:#}"
    );
}

/// On PostgreSQL no CHECK constraint holds the shape of an asset's or a
/// reservation's row (PostgreSQL prepares a table's checks again at every
/// write, and each write sets a status's columns together): the audit
/// finds a row that breaks it, and names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_checks_the_shapes_no_constraint_does_on_postgres() {
    let Some(app) = TestApp::try_spawn(crate::helpers::Backend::Postgres).await else {
        return;
    };
    traffic(&app).await;
    let (ok, doc) = audit(&app);
    assert!(ok, "{doc:#}");
    assert_eq!(violations(&doc, "rows_keep_their_shapes"), 0, "{doc:#}");
    app.sql("UPDATE assets SET price_amount = 100 WHERE id = 'AU-6'")
        .await;
    app.sql("UPDATE assets SET price_amount = 100, price_currency = 'eur' WHERE id = 'AU-3'")
        .await;
    app.sql("UPDATE reservations SET voided_at = NULL WHERE status = 'VOIDED'")
        .await;
    let (ok, doc) = audit(&app);
    assert!(!ok);
    assert_eq!(violations(&doc, "rows_keep_their_shapes"), 3, "{doc:#}");
    let shapes = check(&doc, "rows_keep_their_shapes");
    let examples: Vec<&str> = shapes["examples"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(examples.contains(&"asset AU-3"), "{examples:?}");
    assert!(examples.contains(&"asset AU-6"), "{examples:?}");
    assert!(
        examples.iter().any(|e| e.starts_with("reservation res_")),
        "{examples:?}"
    );
}
