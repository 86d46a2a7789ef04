//! Races fought with real parallel requests.

use futures_util::future::join_all;
use serde_json::{json, Value};

use crate::backend_tests;
use crate::helpers::{patient, series, Backend, TestApp};

/// `n` buyers (`{name}-{i}`, each under its key `{name}-key-{i}`) holding
/// `asset` at once: each one's status and body.
async fn buyers_at_once(app: &TestApp, asset: &str, n: usize, name: &str) -> Vec<(u16, Value)> {
    join_all((0..n).map(|i| async move {
        let response = app
            .post(
                &format!("/v1/assets/{asset}/reservations"),
                Some(&format!("{name}-key-{i}")),
                &json!({"buyer_id": format!("{name}-{i}")}),
            )
            .await;
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap();
        (status, body)
    }))
    .await
}

/// `n` assets `{prefix}-{i}`, each held for `seconds` by a buyer of its
/// own: the reservation ids.
async fn holds_of_their_own(app: &TestApp, prefix: &str, n: usize, seconds: i64) -> Vec<String> {
    let mut holds = Vec::new();
    for i in 0..n {
        let asset = format!("{prefix}-{i}");
        app.create_asset(&asset).await;
        let held = app.hold(&asset, &format!("buyer-{i}"), seconds).await;
        holds.push(held["reservation_id"].as_str().unwrap().to_owned());
    }
    holds
}

/// The bodies of the 201s.
fn created(responses: &[(u16, Value)]) -> Vec<&Value> {
    responses
        .iter()
        .filter(|(s, _)| *s == 201)
        .map(|(_, b)| b)
        .collect()
}

async fn a_hundred_buyers_on_one_asset_make_one_winner(app: TestApp) {
    app.create_asset("HOT-1").await;
    let responses = buyers_at_once(&app, "HOT-1", 100, "buyer").await;
    let winners = created(&responses);
    let losers = responses
        .iter()
        .filter(|(s, b)| *s == 409 && b["error_code"] == "ASSET_UNAVAILABLE")
        .count();
    assert_eq!(winners.len(), 1, "{responses:?}");
    assert_eq!(losers, 99, "{responses:?}");
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 1);
    assert_eq!(app.count("SELECT count(*) FROM idempotency_keys").await, 1);
    assert_eq!(app.count("SELECT count(*) FROM events").await, 1);
    let asset = app.get_json("/v1/assets/HOT-1").await;
    assert_eq!(
        asset["current_reservation_id"],
        winners[0]["reservation_id"]
    );
    assert_eq!(asset["version"], 2);
}

/// A lapsed hold displaced by fifty buyers at once: the asset row's guard
/// alone (no constraint of the database) leaves one HELD reservation, the
/// winner's, and the lapsed one EXPIRED.
async fn fifty_buyers_on_a_lapsed_hold_make_one_winner(app: TestApp) {
    app.create_asset("LAPSED-1").await;
    let first = app.hold("LAPSED-1", "early", 300).await;
    let first = first["reservation_id"].as_str().unwrap().to_owned();
    app.lapse(&first).await;
    let responses = buyers_at_once(&app, "LAPSED-1", 50, "late").await;
    let winners = created(&responses);
    assert_eq!(winners.len(), 1, "{responses:?}");
    assert!(
        responses
            .iter()
            .all(|(s, b)| *s == 201 || (*s == 409 && b["error_code"] == "ASSET_UNAVAILABLE")),
        "{responses:?}"
    );
    assert_eq!(
        app.count(
            "SELECT count(*) FROM reservations WHERE asset_id = 'LAPSED-1' AND status = 'HELD'"
        )
        .await,
        1
    );
    let asset = app.get_json("/v1/assets/LAPSED-1").await;
    assert_eq!(
        asset["current_reservation_id"],
        winners[0]["reservation_id"]
    );
    let lapsed = app.get_json(&format!("/v1/reservations/{first}")).await;
    assert_eq!(lapsed["status"], "EXPIRED", "{lapsed}");
}

async fn thirty_duplicates_of_one_request_hold_once(app: TestApp) {
    app.create_asset("DUP-1").await;
    let responses = join_all((0..30).map(|_| {
        let app = &app;
        async move {
            let response = app
                .post(
                    "/v1/assets/DUP-1/reservations",
                    Some("same-key"),
                    &json!({"buyer_id": "b"}),
                )
                .await;
            let status = response.status().as_u16();
            let replayed = response.headers().get("idempotent-replayed").is_some();
            let body: Value = response.json().await.unwrap();
            (status, replayed, body)
        }
    }))
    .await;
    let created: Vec<_> = responses.iter().filter(|(s, _, _)| *s == 201).collect();
    assert_eq!(created.len(), 1, "{responses:?}");
    let id = &created[0].2["reservation_id"];
    for (status, replayed, body) in &responses {
        match status {
            201 => {}
            200 => {
                assert!(replayed);
                assert_eq!(&body["reservation_id"], id);
            }
            409 => assert_eq!(body["error_code"], "IDEMPOTENCY_KEY_IN_USE"),
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 1);
}

async fn commit_racing_release_ends_consistent(app: TestApp) {
    let rounds = 12;
    let mut reservations = Vec::new();
    for i in 0..rounds {
        let asset = format!("CR-{i}");
        app.create_asset(&asset).await;
        reservations.push(app.hold(&asset, &format!("buyer-{asset}"), 300).await);
    }
    let outcomes = join_all(reservations.iter().enumerate().map(|(i, r)| {
        let app = &app;
        let id = r["reservation_id"].as_str().unwrap().to_owned();
        async move {
            let (commit_key, payment, release_key) = (
                format!("commit-{i}"),
                format!("pay-{i}"),
                format!("release-{i}"),
            );
            let (commit, release) = tokio::join!(
                app.commit(&id, &commit_key, &payment),
                app.release(&id, &release_key)
            );
            let commit = (
                commit.status().as_u16(),
                commit.json::<Value>().await.unwrap(),
            );
            let release = (
                release.status().as_u16(),
                release.json::<Value>().await.unwrap(),
            );
            (format!("CR-{i}"), commit, release)
        }
    }))
    .await;
    let mut lost_commits = 0;
    for (asset, (commit_status, commit), (release_status, release)) in outcomes {
        let status = app.get_json(&format!("/v1/assets/{asset}")).await["status"].clone();
        match (commit_status, release_status) {
            (200, 409) => {
                assert_eq!(release["error_code"], "RESERVATION_NOT_ACTIVE");
                assert_eq!(status, "SOLD");
            }
            (409, 200) => {
                assert_eq!(commit["error_code"], "RESERVATION_NOT_ACTIVE");
                assert_eq!(commit["refund"]["reason"], "RESERVATION_RELEASED");
                assert_eq!(status, "AVAILABLE");
                lost_commits += 1;
            }
            other => panic!("both or neither won on {asset}: {other:?} {commit} {release}"),
        }
    }
    assert_eq!(
        app.count("SELECT count(*) FROM refunds").await,
        lost_commits
    );
}

/// Reads of concurrent requests may be answered together; each request must
/// still get the answer to its own key, body and asset.
async fn concurrent_requests_each_get_their_own_answer(app: TestApp) {
    app.create_asset("MIX-1").await;
    app.create_asset_opening("MIX-2", chrono::Utc::now() + chrono::Duration::days(1))
        .await;
    let held = app
        .post(
            "/v1/assets/MIX-1/reservations",
            Some("mix-key"),
            &json!({"buyer_id": "first"}),
        )
        .await;
    assert_eq!(held.status(), 201);
    let held: Value = held.json().await.unwrap();
    let responses = join_all((0..200).map(|i| {
        let app = &app;
        async move {
            let (asset, key, buyer) = match i % 5 {
                0 => ("MIX-1", "mix-key".to_owned(), "first".to_owned()),
                1 => ("MIX-1", "mix-key".to_owned(), format!("other-{i}")),
                2 => ("MIX-1", format!("fresh-{i}"), format!("b-{i}")),
                3 => ("MIX-2", format!("fresh-{i}"), format!("b-{i}")),
                _ => ("NO-SUCH", format!("fresh-{i}"), format!("b-{i}")),
            };
            let response = app
                .post(
                    &format!("/v1/assets/{asset}/reservations"),
                    Some(&key),
                    &json!({ "buyer_id": buyer }),
                )
                .await;
            let status = response.status().as_u16();
            (i, status, response.json::<Value>().await.unwrap())
        }
    }))
    .await;
    for (i, status, body) in &responses {
        match i % 5 {
            0 => {
                assert_eq!(*status, 200, "replay {i}: {body}");
                assert_eq!(body["reservation_id"], held["reservation_id"]);
            }
            1 => assert_eq!(body["error_code"], "IDEMPOTENCY_KEY_REUSED", "{i}: {body}"),
            2 => {
                assert_eq!(*status, 409, "{i}: {body}");
                assert_eq!(body["error_code"], "ASSET_UNAVAILABLE");
            }
            3 => assert_eq!(body["error_code"], "SALE_NOT_OPEN", "{i}: {body}"),
            _ => assert_eq!(body["error_code"], "ASSET_NOT_FOUND", "{i}: {body}"),
        }
    }
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 1);
}

/// The first reads of concurrent requests about reservations may be read
/// together; each commit must still be decided on its own reservation, its
/// own key's stored answer and its own payment's fate. In one burst of 192:
/// replays of a sale's key, that key under another body, sales of 32 live
/// holds (one each), the sale's payment sent again under new keys, a
/// refunded payment sent again, unknown reservations, the sale's payment
/// sent to the released reservation, and releases of it (no payment).
async fn concurrent_commits_each_read_their_own_reservation(app: TestApp) {
    let mut holds = holds_of_their_own(&app, "PAY", 34, 600).await;
    let (sold, refunded) = (holds.remove(0), holds.remove(0));
    let first = app.commit(&sold, "sold-key", "pay-sold").await;
    assert_eq!(first.status(), 200);
    let first: Value = first.json().await.unwrap();
    assert_eq!(app.release(&refunded, "release-key").await.status(), 200);
    let refused = app.commit(&refunded, "late-key", "pay-late").await;
    assert_eq!(refused.status(), 409);
    let refused: Value = refused.json().await.unwrap();
    let refund = refused["refund"]["refund_id"].clone();
    assert!(refund.is_string(), "{refused}");
    let answers = join_all((0..192).map(|i| {
        let (app, holds) = (&app, &holds);
        let (sold, refunded) = (sold.as_str(), refunded.as_str());
        async move {
            let fresh = format!("fresh-{i}");
            let response = match i % 6 {
                0 => app.commit(sold, "sold-key", "pay-sold").await,
                1 => app.commit(sold, "sold-key", &format!("pay-{i}")).await,
                2 => app.commit(&holds[i / 6], &fresh, &format!("pay-{i}")).await,
                3 => app.commit(sold, &fresh, "pay-sold").await,
                4 => app.commit(refunded, &fresh, "pay-late").await,
                _ if i % 18 == 5 => {
                    app.commit("res_01HZX49R8T39QK6G7Y1W2V3N4P", &fresh, "p")
                        .await
                }
                _ if i % 18 == 11 => app.commit(refunded, &fresh, "pay-sold").await,
                _ => app.release(refunded, &fresh).await,
            };
            let status = response.status().as_u16();
            (i, status, response.json::<Value>().await.unwrap())
        }
    }))
    .await;
    for (i, status, body) in &answers {
        match i % 6 {
            0 | 3 => {
                assert_eq!(*status, 200, "{i}: {body}");
                assert_eq!(body, &first, "{i}");
            }
            1 => assert_eq!(body["error_code"], "IDEMPOTENCY_KEY_REUSED", "{i}: {body}"),
            2 => {
                assert_eq!(*status, 200, "{i}: {body}");
                assert_eq!(body["reservation_id"], holds[i / 6].as_str(), "{i}");
                assert_eq!(body["status"], "COMMITTED", "{i}");
                assert_eq!(body["payment_reference"], format!("pay-{i}"), "{i}");
            }
            4 => {
                assert_eq!(*status, 409, "{i}: {body}");
                assert_eq!(body["refund"]["refund_id"], refund, "{i}: {body}");
                assert_eq!(body["reservation"]["reservation_id"], refunded.as_str());
            }
            _ if i % 18 == 5 => assert_eq!(body["error_code"], "RESERVATION_NOT_FOUND", "{i}"),
            _ if i % 18 == 11 => {
                assert_eq!(body["error_code"], "PAYMENT_REFERENCE_USED", "{i}: {body}");
                assert_eq!(body["reservation"]["reservation_id"], refunded.as_str());
                let bought = &body["payment"]["reservation"]["reservation_id"];
                assert_eq!(bought, sold.as_str(), "{i}: {body}");
            }
            _ => {
                assert_eq!(*status, 200, "{i}: {body}");
                assert_eq!(body["reservation_id"], refunded.as_str(), "{i}");
                assert_eq!(body["status"], "RELEASED", "{i}");
            }
        }
    }
    let sales = "SELECT count(*) FROM reservations WHERE status = 'COMMITTED'";
    assert_eq!(app.count(sales).await, 33);
    assert_eq!(app.count("SELECT count(*) FROM refunds").await, 1);
}

/// At the opening instant of a sale, holds race like any other: waves of
/// parallel buyers from just before the opening until one wins; exactly one
/// does, the others are told the sale is not open or the asset is taken.
async fn the_opening_instant_makes_one_winner(app: TestApp) {
    let opens = chrono::Utc::now() + chrono::Duration::milliseconds(300);
    app.create_asset_opening("OPENING-1", opens).await;
    // Waves of buyers, one after the other from before the opening (by the
    // database's clock) until one wins.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut answers = Vec::new();
    for wave in 0.. {
        assert!(
            std::time::Instant::now() < deadline,
            "nobody won: {answers:?}"
        );
        let responses = join_all((0..20).map(|i| {
            let app = &app;
            async move {
                let response = app
                    .post(
                        "/v1/assets/OPENING-1/reservations",
                        Some(&format!("opening-{wave}-{i}")),
                        &json!({"buyer_id": format!("buyer-{wave}-{i}")}),
                    )
                    .await;
                let status = response.status().as_u16();
                let body: Value = response.json().await.unwrap();
                (status, body["error_code"].as_str().unwrap_or("").to_owned())
            }
        }))
        .await;
        let won = responses.iter().any(|(s, _)| *s == 201);
        answers.extend(responses);
        if won {
            break;
        }
    }
    let winners = answers.iter().filter(|(s, _)| *s == 201).count();
    assert_eq!(winners, 1, "{answers:?}");
    assert!(
        answers
            .iter()
            .all(|(s, c)| *s == 201
                || (*s == 409 && (c == "SALE_NOT_OPEN" || c == "ASSET_UNAVAILABLE"))),
        "{answers:?}"
    );
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 1);
}

/// A forced withdrawal racing the payment of the hold it ends, on ten
/// assets at once: on each, exactly one of them wins, and the loser is told
/// (409 ASSET_SOLD, or 409 with a refund).
async fn a_forced_withdrawal_races_the_payment(app: TestApp) {
    let mut holds = Vec::new();
    for i in 0..10 {
        let asset = format!("WR-{i}");
        app.create_asset(&asset).await;
        let held = app.hold(&asset, &format!("b-{i}"), 300).await;
        holds.push((asset, held["reservation_id"].as_str().unwrap().to_owned()));
    }
    let results = join_all(holds.iter().map(|(asset, id)| {
        let app = &app;
        async move {
            let (path, force) = (
                format!("/v1/assets/{asset}/withdraw"),
                json!({"force": true}),
            );
            let (key, payment) = (format!("c-{id}"), format!("pay-{id}"));
            let withdraw = app.post(&path, None, &force);
            let commit = app.commit(id, &key, &payment);
            let (withdrawn, committed) = tokio::join!(withdraw, commit);
            let w: (u16, Value) = (withdrawn.status().as_u16(), withdrawn.json().await.unwrap());
            let c: (u16, Value) = (committed.status().as_u16(), committed.json().await.unwrap());
            (asset.clone(), w, c)
        }
    }))
    .await;
    for (asset, (ws, wb), (cs, cb)) in &results {
        let state = app.get_json(&format!("/v1/assets/{asset}")).await;
        match (ws, cs) {
            (200, 409) => {
                assert_eq!(state["status"], "WITHDRAWN", "{asset}");
                assert_eq!(cb["error_code"], "RESERVATION_NOT_ACTIVE", "{cb}");
                assert_eq!(cb["refund"]["reason"], "RESERVATION_RELEASED", "{cb}");
            }
            (409, 200) => {
                assert_eq!(state["status"], "SOLD", "{asset}");
                assert_eq!(wb["error_code"], "ASSET_SOLD", "{wb}");
            }
            other => panic!("{asset}: {other:?} {wb} {cb}"),
        }
    }
    assert!(crate::audit::audit(&app).0);
}

/// Thirty copies of one void, sent at once: one sale voided, one refund,
/// thirty identical answers.
async fn thirty_duplicates_of_one_void_act_once(app: TestApp) {
    app.create_asset("VD-1").await;
    let held = app.hold("VD-1", "b", 300).await;
    let id = held["reservation_id"].as_str().unwrap().to_owned();
    assert_eq!(app.commit(&id, "c-vd", "pay-vd").await.status(), 200);
    let answers = join_all((0..30).map(|_| {
        let (app, id) = (&app, &id);
        async move {
            let response = app
                .post(
                    &format!("/v1/reservations/{id}/void"),
                    Some("vd-key"),
                    &json!({}),
                )
                .await;
            (
                response.status().as_u16(),
                response.json::<Value>().await.unwrap(),
            )
        }
    }))
    .await;
    for (status, body) in &answers {
        assert_eq!(*status, 200, "{body}");
        assert_eq!(body, &answers[0].1);
    }
    assert_eq!(answers[0].1["status"], "VOIDED");
    assert_eq!(app.count("SELECT count(*) FROM refunds").await, 1);
    assert_eq!(
        app.count("SELECT count(*) FROM events WHERE type = 'reservation.voided'")
            .await,
        1
    );
}

/// An extension racing the release of the same hold: the hold ends
/// released either way, and an extension answered 200 came first.
async fn an_extension_races_a_release(app: TestApp) {
    let holds = holds_of_their_own(&app, "ER", 10, 60).await;
    let results = join_all(holds.iter().map(|id| {
        let app = &app;
        async move {
            let (path, key) = (format!("/v1/reservations/{id}/extend"), format!("e-{id}"));
            let (body, release_key) = (json!({"hold_seconds": 600}), format!("r-{id}"));
            let extend = app.post(&path, Some(&key), &body);
            let release = app.release(id, &release_key);
            let (extended, released) = tokio::join!(extend, release);
            let e: (u16, Value) = (extended.status().as_u16(), extended.json().await.unwrap());
            (id.clone(), e, released.status().as_u16())
        }
    }))
    .await;
    for (id, (es, eb), rs) in &results {
        assert_eq!(*rs, 200, "{id}: the release wins or comes second");
        let current = app.get_json(&format!("/v1/reservations/{id}")).await;
        assert_eq!(current["status"], "RELEASED");
        match es {
            200 => assert_eq!(current["expires_at"], eb["expires_at"], "{id}"),
            409 => assert_eq!(eb["error_code"], "RESERVATION_NOT_ACTIVE", "{eb}"),
            other => panic!("{id}: extend answered {other}: {eb}"),
        }
    }
    assert!(crate::audit::audit(&app).0);
}

/// The per-buyer limit counts live holds after taking the buyer's lock: two
/// holds of a buyer one below the limit, both waiting for that lock, make
/// one hold and one refusal, whichever gets the lock first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_the_buyer_limit_counts_after_the_buyers_lock() {
    let Some(app) = TestApp::try_spawn_with(Backend::Postgres, patient).await else {
        return;
    };
    for i in 0..6 {
        app.create_asset(&format!("LIM-{i}")).await;
    }
    for i in 0..4 {
        app.hold(&format!("LIM-{i}"), "racer", 300).await;
    }
    // Another writer holds the buyer's lock.
    let blocker = app
        .hold_lock_open(
            "BEGIN; SELECT lock_buyer(client, buyer_id) FROM reservations \
             WHERE buyer_id = 'racer' LIMIT 1",
        )
        .await;
    let hold = |asset: &'static str| {
        let app = &app;
        async move {
            let response = app
                .post(
                    &format!("/v1/assets/{asset}/reservations"),
                    Some(&crate::helpers::new_key()),
                    &json!({"buyer_id": "racer", "hold_seconds": 300}),
                )
                .await;
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    let released = async {
        // Both holds wait for the lock before the other writer commits.
        app.lock_waiters(2).await;
        blocker.commit().await;
    };
    let (a, b, ()) = tokio::join!(hold("LIM-4"), hold("LIM-5"), released);
    let mut statuses = [a.0, b.0];
    statuses.sort_unstable();
    assert_eq!(statuses, [201, 409], "{a:?} {b:?}");
    let refused = if a.0 == 409 { &a.1 } else { &b.1 };
    assert_eq!(refused["error_code"], "HOLD_LIMIT_REACHED", "{refused}");
    assert_eq!(
        app.count("SELECT count(*) FROM reservations WHERE buyer_id = 'racer' AND status = 'HELD'")
            .await,
        5
    );
}

backend_tests!(
    a_forced_withdrawal_races_the_payment,
    thirty_duplicates_of_one_void_act_once,
    an_extension_races_a_release,
    the_opening_instant_makes_one_winner,
    concurrent_requests_each_get_their_own_answer,
    concurrent_commits_each_read_their_own_reservation,
    a_hundred_buyers_on_one_asset_make_one_winner,
    fifty_buyers_on_a_lapsed_hold_make_one_winner,
    thirty_duplicates_of_one_request_hold_once,
    commit_racing_release_ends_consistent,
);

/// SQLite's group commit: a burst of writes shares commits (fewer commits
/// than writes, by the service's own metrics), and what each write meets
/// stays its own. Within one burst, on assets of their own: 60 holds that
/// all succeed; 20 assets fought over by two buyers each (one wins, one is
/// refused); 20 keys each sent with two different bodies (one holds, one is
/// refused as a reused key). Every success is in the database, nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_burst_of_writes_shares_commits_and_each_fails_alone() {
    let Some(app) = TestApp::try_spawn_process(Backend::Sqlite, |_, _| {}).await else {
        return;
    };
    for i in 0..100 {
        app.create_asset(&format!("G-{i}")).await;
    }
    let before = app.get("/metrics").await.text().await.unwrap();
    let hold = |asset: String, key: String, buyer: String| {
        let app = &app;
        async move {
            let path = format!("/v1/assets/{asset}/reservations");
            let response = app
                .post(&path, Some(&key), &json!({"buyer_id": buyer}))
                .await;
            let status = response.status().as_u16();
            let body: Value = response.json().await.unwrap();
            (asset, buyer, status, body)
        }
    };
    let mut burst = Vec::new();
    for i in 0..60 {
        burst.push(hold(format!("G-{i}"), format!("g-{i}"), format!("b-{i}")));
    }
    for i in 60..80 {
        for side in ["x", "y"] {
            burst.push(hold(
                format!("G-{i}"),
                format!("g-{i}-{side}"),
                format!("b-{i}-{side}"),
            ));
        }
    }
    for i in 80..100 {
        for side in ["x", "y"] {
            burst.push(hold(
                format!("G-{i}"),
                format!("g-{i}"),
                format!("b-{i}-{side}"),
            ));
        }
    }
    let answers = join_all(burst).await;
    let after = app.get("/metrics").await.text().await.unwrap();

    let mut held = std::collections::BTreeMap::new();
    for (asset, buyer, status, body) in &answers {
        match status {
            201 => {
                assert_eq!(body["status"], "HELD", "{body}");
                assert_eq!(body["buyer_id"], buyer.as_str(), "{body}");
                assert!(
                    held.insert(asset.clone(), buyer.clone()).is_none(),
                    "{asset} twice"
                );
            }
            409 => assert_eq!(body["error_code"], "ASSET_UNAVAILABLE", "{body}"),
            422 => assert_eq!(body["error_code"], "IDEMPOTENCY_KEY_REUSED", "{body}"),
            other => panic!("{asset}: {other} {body}"),
        }
    }
    assert_eq!(held.len(), 100, "every asset held once: {answers:?}");
    for (asset, buyer) in &held {
        let sql = format!(
            "SELECT count(*) FROM reservations r JOIN assets a ON a.current_reservation_id = r.id \
             WHERE a.id = '{asset}' AND a.status = 'HELD' AND r.buyer_id = '{buyer}'"
        );
        assert_eq!(app.count(&sql).await, 1, "{asset} held by {buyer}");
    }
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 100);
    let grew = |s: &str| series(&after, s) - series(&before, s);
    let (commits, writes) = (
        grew("holdfast_sqlite_commits_total"),
        grew("holdfast_sqlite_grouped_writes_total"),
    );
    assert!(writes >= 100.0, "{writes} writes");
    assert!(
        commits < writes,
        "{commits} commits for {writes} writes: none shared"
    );
}
