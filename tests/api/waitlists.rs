//! Waiting lists and offers: queues with no queue-jumping, whichever path
//! ends a hold, and holds made for named buyers.

use futures_util::future::join_all;
use holdfast::keys::{new_key as new_api_key, Role};
use holdfast::secret::Secret;
use reqwest::Method;
use serde_json::{json, Value};

use crate::backend_tests;
use crate::helpers::{new_key, Backend, TestApp};

async fn join(app: &TestApp, asset: &str, buyer: &str) -> (u16, Value) {
    app.send(
        Method::POST,
        &format!("/v1/assets/{asset}/waitlist"),
        None,
        Some(json!({"buyer_id": buyer})),
    )
    .await
}

async fn hold(app: &TestApp, asset: &str, buyer: &str) -> (u16, Value) {
    app.send(
        Method::POST,
        &format!("/v1/assets/{asset}/reservations"),
        None,
        Some(json!({"buyer_id": buyer, "hold_seconds": 300})),
    )
    .await
}

/// The audit passes: every invariant, the waiting lists' included.
fn audited(app: &TestApp) {
    let (ok, doc) = crate::audit::audit(app);
    assert!(ok, "{doc:#}");
}

/// The asset's current holder's buyer, read through its reservation.
async fn holder(app: &TestApp, asset: &str) -> Option<String> {
    let asset = app.get_json(&format!("/v1/assets/{asset}")).await;
    let id = asset["current_reservation_id"].as_str()?;
    let reservation = app.get_json(&format!("/v1/reservations/{id}")).await;
    reservation["buyer_id"].as_str().map(str::to_owned)
}

async fn queue(app: &TestApp, asset: &str) -> Vec<(String, i64)> {
    let list = app.get_json(&format!("/v1/assets/{asset}/waitlist")).await;
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["buyer_id"].as_str().unwrap().to_owned(),
                e["position"].as_i64().unwrap(),
            )
        })
        .collect()
}

async fn events_of(app: &TestApp, asset: &str) -> Vec<Value> {
    let page = app
        .get_json(&format!("/v1/assets/{asset}/events?limit=500"))
        .await;
    page["items"].as_array().unwrap().clone()
}

/// The types of an asset's events, in order.
async fn types_of(app: &TestApp, asset: &str) -> Vec<String> {
    events_of(app, asset)
        .await
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect()
}

async fn fifty_parallel_joins_get_positions_one_to_fifty(app: TestApp) {
    app.create_asset("Q-1").await;
    app.hold("Q-1", "holder", 300).await;
    let joined = join_all((0..50).map(|i| {
        let app = &app;
        async move { join(app, "Q-1", &format!("w-{i}")).await }
    }))
    .await;
    let mut positions: Vec<i64> = joined
        .iter()
        .map(|(status, entry)| {
            assert_eq!(*status, 201, "{entry}");
            entry["position"].as_i64().unwrap()
        })
        .collect();
    positions.sort();
    assert_eq!(positions, (1..=50).collect::<Vec<_>>());
    let listed = queue(&app, "Q-1").await;
    assert_eq!(
        listed.iter().map(|(_, p)| *p).collect::<Vec<_>>(),
        (1..=50).collect::<Vec<_>>()
    );
    let asset = app.get_json("/v1/assets/Q-1").await;
    assert_eq!(asset["waitlist_length"], 50);
    // The same buyer again: 200 with its entry; the holder: not open.
    let first = &listed[0].0;
    let (status, again) = join(&app, "Q-1", first).await;
    assert_eq!(status, 200);
    assert_eq!(again["position"], 1);
    let (status, problem) = join(&app, "Q-1", "holder").await;
    assert_eq!(status, 409);
    assert_eq!(problem["error_code"], "WAITLIST_NOT_OPEN");
    audited(&app);
}

async fn a_release_racing_newcomers_goes_to_the_head(app: TestApp) {
    for round in 0..3 {
        let asset = format!("RQ-{round}");
        app.create_asset(&asset).await;
        let held = app.hold(&asset, "holder", 300).await;
        let id = held["reservation_id"].as_str().unwrap().to_owned();
        assert_eq!(join(&app, &asset, "head").await.0, 201);
        assert_eq!(join(&app, &asset, "second").await.0, 201);
        let release = async { app.release(&id, &new_key()).await.status().as_u16() };
        let newcomers = join_all((0..50).map(|i| {
            let (app, asset) = (&app, &asset);
            async move { hold(app, asset, &format!("new-{i}")).await }
        }));
        let (released, tries) = tokio::join!(release, newcomers);
        assert_eq!(released, 200);
        for (status, body) in &tries {
            assert_eq!(*status, 409, "a newcomer jumped the queue: {body}");
            assert_eq!(body["error_code"], "ASSET_UNAVAILABLE");
        }
        assert_eq!(holder(&app, &asset).await.as_deref(), Some("head"));
        assert_eq!(queue(&app, &asset).await, [("second".to_owned(), 1)]);
        let handed = events_of(&app, &asset).await;
        let last = handed.last().unwrap();
        assert_eq!(last["type"], "reservation.held");
        assert_eq!(last["via"], "waitlist");
        assert_eq!(last["data"]["buyer_id"], "head");
        assert_eq!(last["data"]["via"], "waitlist");
    }
    audited(&app);
}

async fn a_lapse_found_by_the_janitor_goes_to_the_head_and_then_the_second(app: TestApp) {
    app.create_asset("LQ-1").await;
    let held = app.hold("LQ-1", "holder", 300).await;
    join(&app, "LQ-1", "head").await;
    join(&app, "LQ-1", "second").await;
    app.lapse(held["reservation_id"].as_str().unwrap()).await;
    // Before any sweep the asset is not AVAILABLE: it is the head's next.
    let asset = app.get_json("/v1/assets/LQ-1").await;
    assert_eq!(asset["status"], "HELD", "{asset}");
    let available = app.get_json("/v1/assets?status=AVAILABLE").await;
    assert!(available["items"].as_array().unwrap().is_empty());
    let counts = app.get_json("/v1/asset-counts").await;
    assert_eq!(counts["counts"]["HELD"], 1);
    holdfast::janitor::run_once(&app.store).await.unwrap();
    assert_eq!(holder(&app, "LQ-1").await.as_deref(), Some("head"));
    // The head's hold lapses in turn: the second gets it.
    let asset = app.get_json("/v1/assets/LQ-1").await;
    let head_hold = asset["current_reservation_id"].as_str().unwrap().to_owned();
    let reservation = app.get_json(&format!("/v1/reservations/{head_hold}")).await;
    assert_eq!(reservation["via"], "waitlist");
    app.lapse(&head_hold).await;
    holdfast::janitor::run_once(&app.store).await.unwrap();
    assert_eq!(holder(&app, "LQ-1").await.as_deref(), Some("second"));
    assert!(queue(&app, "LQ-1").await.is_empty());
    // And when the queue is empty, the asset is AVAILABLE after the lapse.
    let asset = app.get_json("/v1/assets/LQ-1").await;
    let last_hold = asset["current_reservation_id"].as_str().unwrap().to_owned();
    app.lapse(&last_hold).await;
    holdfast::janitor::run_once(&app.store).await.unwrap();
    assert_eq!(app.get_json("/v1/assets/LQ-1").await["status"], "AVAILABLE");
    audited(&app);
}

async fn a_lapse_found_by_a_newcomer_goes_to_the_head(app: TestApp) {
    app.create_asset("NQ-1").await;
    let held = app.hold("NQ-1", "holder", 300).await;
    join(&app, "NQ-1", "head").await;
    app.lapse(held["reservation_id"].as_str().unwrap()).await;
    let (status, refused) = hold(&app, "NQ-1", "newcomer").await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error_code"], "ASSET_UNAVAILABLE");
    assert_eq!(holder(&app, "NQ-1").await.as_deref(), Some("head"));
    // The head holding it itself gets its own hold back.
    let (status, own) = hold(&app, "NQ-1", "head").await;
    assert_eq!(status, 200, "{own}");
    assert_eq!(own["buyer_id"], "head");
    assert_eq!(
        types_of(&app, "NQ-1").await,
        [
            "reservation.held",
            "reservation.expired",
            "reservation.held"
        ]
    );
}

async fn leaving_moves_the_others_up(app: TestApp) {
    app.create_asset("LV-1").await;
    app.hold("LV-1", "holder", 300).await;
    for buyer in ["a", "b", "c"] {
        join(&app, "LV-1", buyer).await;
    }
    let (status, _) = app
        .send(Method::DELETE, "/v1/assets/LV-1/waitlist/b", None, None)
        .await;
    assert_eq!(status, 204);
    assert_eq!(
        queue(&app, "LV-1").await,
        [("a".to_owned(), 1), ("c".to_owned(), 2)]
    );
    let (status, problem) = app
        .send(Method::DELETE, "/v1/assets/LV-1/waitlist/b", None, None)
        .await;
    assert_eq!(status, 404);
    assert_eq!(problem["error_code"], "WAITLIST_ENTRY_NOT_FOUND");
    assert_eq!(app.get_json("/v1/assets/LV-1").await["waitlist_length"], 2);
}

async fn a_queue_is_open_only_for_a_held_asset_and_only_so_long(app: TestApp) {
    app.create_asset("NO-1").await;
    let (status, problem) = join(&app, "NO-1", "w").await;
    assert_eq!(status, 409);
    assert_eq!(problem["error_code"], "WAITLIST_NOT_OPEN");
    assert_eq!(problem["asset_status"], "AVAILABLE");
    let (status, _) = join(&app, "NOPE", "w").await;
    assert_eq!(status, 404);
}

async fn a_sale_clears_the_queue_in_one_event(app: TestApp) {
    app.create_asset("SQ-1").await;
    let held = app.hold("SQ-1", "holder", 300).await;
    for buyer in ["a", "b"] {
        join(&app, "SQ-1", buyer).await;
    }
    let id = held["reservation_id"].as_str().unwrap();
    assert_eq!(app.commit(id, &new_key(), "pay-sq").await.status(), 200);
    assert!(queue(&app, "SQ-1").await.is_empty());
    let events = events_of(&app, "SQ-1").await;
    let cleared: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "waitlist.cleared")
        .collect();
    assert_eq!(cleared.len(), 1);
    let named: Vec<&str> = cleared[0]["data"]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["buyer_id"].as_str().unwrap())
        .collect();
    assert_eq!(named, ["a", "b"]);
    assert_eq!(cleared[0]["data"]["reason"], "sold");
    assert_eq!(app.get_json("/v1/assets/SQ-1").await["waitlist_length"], 0);
    audited(&app);
}

async fn a_head_at_its_limit_is_passed_over(app: TestApp) {
    // The default limit is 5 live holds per buyer.
    for i in 0..5 {
        let asset = format!("LIM-{i}");
        app.create_asset(&asset).await;
        app.hold(&asset, "busy", 300).await;
    }
    app.create_asset("SK-1").await;
    let held = app.hold("SK-1", "holder", 300).await;
    join(&app, "SK-1", "busy").await;
    join(&app, "SK-1", "free").await;
    let id = held["reservation_id"].as_str().unwrap();
    assert_eq!(app.release(id, &new_key()).await.status(), 200);
    assert_eq!(holder(&app, "SK-1").await.as_deref(), Some("free"));
    let events = events_of(&app, "SK-1").await;
    assert!(events
        .iter()
        .any(|e| e["type"] == "waitlist.skipped" && e["data"]["buyer_id"] == "busy"));
    audited(&app);
}

async fn an_offer_is_a_hold_for_a_named_buyer(app: TestApp) {
    app.create_asset("OF-1").await;
    let days = |n: i64| {
        (chrono::Utc::now() + chrono::Duration::days(n))
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    };
    let offer = |expires: String| {
        json!({"buyer_id": "runner-up", "client": "-", "expires_at": expires,
               "metadata": {"lot": "17"}})
    };
    // Beyond 14 days, or in the past: 422 naming expires_at.
    for expires in [days(15), days(-1)] {
        let (status, problem) = app
            .send(
                Method::POST,
                "/v1/assets/OF-1/offers",
                None,
                Some(offer(expires)),
            )
            .await;
        assert_eq!(status, 422, "{problem}");
        assert_eq!(problem["errors"][0]["field"], "expires_at");
    }
    let (status, problem) = app
        .send(
            Method::POST,
            "/v1/assets/OF-1/offers",
            None,
            Some(json!({"buyer_id": "b", "client": "nobody", "expires_at": days(2)})),
        )
        .await;
    assert_eq!(status, 422);
    assert_eq!(problem["errors"][0]["field"], "client");
    let (status, offered) = app
        .send(
            Method::POST,
            "/v1/assets/OF-1/offers",
            None,
            Some(offer(days(14))),
        )
        .await;
    assert_eq!(status, 201, "{offered}");
    assert_eq!(offered["status"], "HELD");
    assert_eq!(offered["via"], "offer");
    let events = events_of(&app, "OF-1").await;
    assert_eq!(events[0]["via"], "offer");
    // Not counted toward the buyer's limit: five more holds still work.
    for i in 0..5 {
        let asset = format!("OFL-{i}");
        app.create_asset(&asset).await;
        let (status, _) = hold(&app, &asset, "runner-up").await;
        assert_eq!(status, 201, "hold {i}");
    }
    // Taken: another offer answers 409.
    let (status, problem) = app
        .send(
            Method::POST,
            "/v1/assets/OF-1/offers",
            None,
            Some(offer(days(3))),
        )
        .await;
    assert_eq!(status, 409);
    assert_eq!(problem["error_code"], "ASSET_UNAVAILABLE");
    // Extended to a date, then committed like a hold.
    let id = offered["reservation_id"].as_str().unwrap().to_owned();
    let (status, extended) = app
        .send(
            Method::POST,
            &format!("/v1/reservations/{id}/extend"),
            None,
            Some(json!({"expires_at": days(10)})),
        )
        .await;
    assert_eq!(status, 200, "{extended}");
    assert_eq!(app.commit(&id, &new_key(), "pay-offer").await.status(), 200);
    // A second offer lapses, and a late payment is refunded.
    app.create_asset("OF-2").await;
    let (_, second) = app
        .send(
            Method::POST,
            "/v1/assets/OF-2/offers",
            None,
            Some(offer(days(2))),
        )
        .await;
    let id = second["reservation_id"].as_str().unwrap().to_owned();
    app.lapse(&id).await;
    let late = app.commit(&id, &new_key(), "pay-late").await;
    assert_eq!(late.status(), 409);
    let late: Value = late.json().await.unwrap();
    assert_eq!(late["error_code"], "HOLD_EXPIRED");
    assert_eq!(late["refund"]["reason"], "HOLD_EXPIRED");
    audited(&app);
}

/// A late payment an accept-if-free instance receives for an asset with
/// waiters: the head gets the asset, and the payment its refund, decided
/// together; the timeline reads held, expired, held by the head, refund.
async fn a_late_payment_does_not_jump_the_queue(backend: Backend) {
    let Some(app) = TestApp::try_spawn_with(backend, |c| {
        c.late_commit = holdfast::config::LateCommit::AcceptIfFree;
    })
    .await
    else {
        return;
    };
    app.create_asset("LP-1").await;
    let held = app.hold("LP-1", "late", 300).await;
    let id = held["reservation_id"].as_str().unwrap().to_owned();
    join(&app, "LP-1", "head").await;
    app.lapse(&id).await;
    let late = app.commit(&id, &new_key(), "pay-lp-1").await;
    assert_eq!(late.status(), 409);
    let late: Value = late.json().await.unwrap();
    assert_eq!(late["error_code"], "HOLD_EXPIRED", "{late}");
    assert_eq!(late["refund"]["payment_reference"], "pay-lp-1");
    assert_eq!(holder(&app, "LP-1").await.as_deref(), Some("head"));
    assert_eq!(
        types_of(&app, "LP-1").await,
        [
            "reservation.held",
            "reservation.expired",
            "reservation.held",
            "refund.requested"
        ]
    );
    audited(&app);
}

backend_tests!(
    fifty_parallel_joins_get_positions_one_to_fifty,
    a_release_racing_newcomers_goes_to_the_head,
    a_lapse_found_by_the_janitor_goes_to_the_head_and_then_the_second,
    a_lapse_found_by_a_newcomer_goes_to_the_head,
    leaving_moves_the_others_up,
    a_queue_is_open_only_for_a_held_asset_and_only_so_long,
    a_sale_clears_the_queue_in_one_event,
    a_head_at_its_limit_is_passed_over,
    an_offer_is_a_hold_for_a_named_buyer;
    backend:
        a_full_queue_answers_waitlist_full,
        storefronts_see_only_their_own_entries_and_offers,
        a_late_payment_does_not_jump_the_queue,
);

/// A full queue, with a limit of three.
async fn a_full_queue_answers_waitlist_full(backend: Backend) {
    let Some(app) = TestApp::try_spawn_with(backend, |c| c.waitlist_max = 3).await else {
        return;
    };
    app.create_asset("FQ-1").await;
    app.hold("FQ-1", "holder", 300).await;
    for buyer in ["a", "b", "c"] {
        assert_eq!(join(&app, "FQ-1", buyer).await.0, 201);
    }
    let (status, problem) = join(&app, "FQ-1", "d").await;
    assert_eq!(status, 409);
    assert_eq!(problem["error_code"], "WAITLIST_FULL");
}

/// Another storefront never sees an entry or an offer it does not own.
async fn storefronts_see_only_their_own_entries_and_offers(backend: Backend) {
    let (admin, a) = new_api_key("ops", Role::Admin).unwrap();
    let (shop, s) = new_api_key("shop-a", Role::Storefront).unwrap();
    let (other, o) = new_api_key("shop-b", Role::Storefront).unwrap();
    let Some(app) = TestApp::try_spawn_with(backend, |c| {
        c.api_keys = Some(Secret::new(format!("{a},{s},{o}")));
    })
    .await
    else {
        return;
    };
    for id in ["VS-1", "VS-2"] {
        let body = json!({"id": id, "name": id});
        let (status, _) = app
            .send(Method::POST, "/v1/assets", Some(&admin), Some(body))
            .await;
        assert_eq!(status, 201);
    }
    let held = json!({"buyer_id": "h"});
    app.send(
        Method::POST,
        "/v1/assets/VS-1/reservations",
        Some(&shop),
        Some(held),
    )
    .await;
    for (token, buyer) in [(&shop, "a-1"), (&other, "b-1"), (&shop, "a-2")] {
        let body = json!({"buyer_id": buyer});
        let (status, _) = app
            .send(
                Method::POST,
                "/v1/assets/VS-1/waitlist",
                Some(token),
                Some(body),
            )
            .await;
        assert_eq!(status, 201);
    }
    let (_, theirs) = app
        .send(Method::GET, "/v1/assets/VS-1/waitlist", Some(&other), None)
        .await;
    assert_eq!(
        theirs["items"],
        json!([{"asset_id": "VS-1", "buyer_id": "b-1", "position": 2,
                "joined_at": theirs["items"][0]["joined_at"]}])
    );
    let (_, all) = app
        .send(Method::GET, "/v1/assets/VS-1/waitlist", Some(&admin), None)
        .await;
    assert_eq!(all["items"].as_array().unwrap().len(), 3);
    // shop-b cannot take shop-a's buyer off the queue.
    let (status, _) = app
        .send(
            Method::DELETE,
            "/v1/assets/VS-1/waitlist/a-1",
            Some(&other),
            None,
        )
        .await;
    assert_eq!(status, 404);
    // An admin names the client, or is told to.
    let (status, problem) = app
        .send(
            Method::DELETE,
            "/v1/assets/VS-1/waitlist/a-1",
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(status, 422);
    assert_eq!(problem["errors"][0]["field"], "client");
    let (status, _) = app
        .send(
            Method::DELETE,
            "/v1/assets/VS-1/waitlist/a-1?client=shop-a",
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(status, 204);
    // An offer owned by shop-a: shop-b does not see it.
    let expires = (chrono::Utc::now() + chrono::Duration::days(2))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let body = json!({"buyer_id": "runner-up", "client": "shop-a", "expires_at": expires});
    let (status, offered) = app
        .send(
            Method::POST,
            "/v1/assets/VS-2/offers",
            Some(&admin),
            Some(body),
        )
        .await;
    assert_eq!(status, 201, "{offered}");
    let id = offered["reservation_id"].as_str().unwrap();
    let path = format!("/v1/reservations/{id}");
    assert_eq!(app.send(Method::GET, &path, Some(&shop), None).await.0, 200);
    assert_eq!(
        app.send(Method::GET, &path, Some(&other), None).await.0,
        404
    );
    let (_, asset) = app
        .send(Method::GET, "/v1/assets/VS-2", Some(&other), None)
        .await;
    assert_eq!(asset["current_reservation_id"], Value::Null);
    // A storefront may not make offers.
    let body = json!({"buyer_id": "x", "client": "shop-a", "expires_at": expires});
    let (status, _) = app
        .send(
            Method::POST,
            "/v1/assets/VS-2/offers",
            Some(&shop),
            Some(body),
        )
        .await;
    assert_eq!(status, 403);
}
