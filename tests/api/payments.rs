//! Each payment reference has exactly one fate: it bought one reservation,
//! or it is refunded once, whichever reservation it was sent to.

use futures_util::future::join_all;
use reqwest::Method;
use serde_json::{json, Value};

use crate::audit::audit;
use crate::backend_tests;
use crate::helpers::{new_key, Backend, TestApp};

async fn held(app: &TestApp, asset: &str) -> String {
    app.create_asset(asset).await;
    app.hold(asset, &format!("buyer-{asset}"), 300).await["reservation_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn released(app: &TestApp, asset: &str) -> String {
    let id = held(app, asset).await;
    assert_eq!(app.release(&id, &new_key()).await.status(), 200);
    id
}

async fn commit(app: &TestApp, reservation: &str, payment: &str) -> (u16, Value) {
    let response = app.commit(reservation, &new_key(), payment).await;
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

async fn refunds_of(app: &TestApp, payment: &str) -> i64 {
    app.count(&format!(
        "SELECT count(*) FROM refunds WHERE payment_reference = '{payment}'"
    ))
    .await
}

fn assert_used(body: &Value, addressed: &str, fate: &str, through: &str) {
    assert_eq!(body["error_code"], "PAYMENT_REFERENCE_USED", "{body}");
    assert_eq!(body["reservation"]["reservation_id"], addressed, "{body}");
    assert!(body.get("refund").is_none(), "no refund member: {body}");
    assert_eq!(body["payment"]["fate"], fate, "{body}");
    assert_eq!(
        body["payment"]["reservation"]["reservation_id"], through,
        "{body}"
    );
}

/// A payment that bought one asset is never refunded through another
/// reservation: the buyer would keep the asset and get the money back.
async fn a_kept_payment_is_not_refunded_elsewhere(app: TestApp) {
    let a = held(&app, "F-A").await;
    let b = released(&app, "F-B").await;
    assert_eq!(commit(&app, &a, "pay-kept").await.0, 200);
    for _ in 0..2 {
        let (status, body) = commit(&app, &b, "pay-kept").await;
        assert_eq!(status, 409);
        assert_used(&body, &b, "BOUGHT", &a);
        assert_eq!(body["reservation"]["refunds"], json!([]));
    }
    assert_eq!(refunds_of(&app, "pay-kept").await, 0);
    assert_eq!(app.get_json("/v1/assets/F-A").await["status"], "SOLD");
    let (ok, doc) = audit(&app);
    assert!(ok, "{doc:#}");
}

/// The same payment sent to three released reservations is refunded once.
async fn a_payment_is_refunded_once_whichever_reservation(app: TestApp) {
    let ids = [
        released(&app, "F-1").await,
        released(&app, "F-2").await,
        released(&app, "F-3").await,
    ];
    let (status, first) = commit(&app, &ids[0], "pay-thrice").await;
    assert_eq!(status, 409);
    assert_eq!(first["error_code"], "RESERVATION_NOT_ACTIVE");
    let refund = first["refund"]["refund_id"].as_str().unwrap();
    for id in &ids[1..] {
        let (status, body) = commit(&app, id, "pay-thrice").await;
        assert_eq!(status, 409);
        assert_used(&body, id, "REFUNDED", &ids[0]);
        assert_eq!(body["payment"]["refund"]["refund_id"], refund);
    }
    // The reservation it was refunded through answers as before.
    let (status, again) = commit(&app, &ids[0], "pay-thrice").await;
    assert_eq!(status, 409);
    assert_eq!(again["refund"]["refund_id"], refund);
    assert_eq!(refunds_of(&app, "pay-thrice").await, 1);
    let (ok, doc) = audit(&app);
    assert!(ok, "{doc:#}");
}

/// A refunded payment cannot buy a live hold afterwards.
async fn a_refunded_payment_does_not_buy_a_live_hold(app: TestApp) {
    let b = released(&app, "F-R").await;
    let a = held(&app, "F-H").await;
    assert_eq!(commit(&app, &b, "pay-back").await.0, 409);
    let (status, body) = commit(&app, &a, "pay-back").await;
    assert_eq!(status, 409);
    assert_used(&body, &a, "REFUNDED", &b);
    assert_eq!(body["reservation"]["status"], "HELD");
    assert_eq!(app.get_json("/v1/assets/F-H").await["status"], "HELD");
    // The live hold still sells to a payment of its own.
    assert_eq!(commit(&app, &a, "pay-fresh").await.0, 200);
    let (ok, doc) = audit(&app);
    assert!(ok, "{doc:#}");
}

/// A sale voided without a refund (a chargeback) is not refunded again when
/// the payment system retries its commit.
async fn a_voided_sale_is_never_refunded_twice(app: TestApp) {
    for (asset, refund) in [("F-V1", false), ("F-V2", true)] {
        let id = held(&app, asset).await;
        let payment = format!("pay-{asset}");
        let key = new_key();
        assert_eq!(app.commit(&id, &key, &payment).await.status(), 200);
        let void = app
            .post(
                &format!("/v1/reservations/{id}/void"),
                Some(&new_key()),
                &json!({ "refund": refund }),
            )
            .await;
        assert_eq!(void.status(), 200);
        // The same request again replays what it answered then.
        let replay = app.commit(&id, &key, &payment).await;
        assert_eq!(replay.status(), 200);
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        // A new attempt changes nothing and refunds nothing new.
        for _ in 0..2 {
            let (status, body) = commit(&app, &id, &payment).await;
            assert_eq!(status, 409, "{body}");
            assert_eq!(body["error_code"], "RESERVATION_NOT_ACTIVE");
            assert_eq!(body["reservation"]["status"], "VOIDED");
            if refund {
                assert_eq!(body["refund"]["reason"], "SALE_VOIDED", "{body}");
            } else {
                assert!(body.get("refund").is_none(), "{body}");
            }
        }
        assert_eq!(refunds_of(&app, &payment).await, i64::from(refund));
        // Another payment for the voided sale is refunded, once.
        let (status, body) = commit(&app, &id, &format!("{payment}-other")).await;
        assert_eq!(status, 409);
        assert_eq!(body["refund"]["reason"], "SALE_VOIDED");
    }
    let (ok, doc) = audit(&app);
    assert!(ok, "{doc:#}");
}

/// The payment system retries a sale's commit (new keys, the same payment)
/// while an operator voids it: each retry answers from one state, a 200
/// with the sale COMMITTED or a 409 with it VOIDED, never a 200 describing
/// the void.
async fn retried_commits_racing_a_void_answer_one_state(app: TestApp) {
    for round in 0..3 {
        let asset = format!("F-RV{round}");
        let id = held(&app, &asset).await;
        let payment = format!("pay-{asset}");
        assert_eq!(commit(&app, &id, &payment).await.0, 200);
        let void = async {
            let path = format!("/v1/reservations/{id}/void");
            let response = app
                .post(&path, Some(&new_key()), &json!({"refund": true}))
                .await;
            response.status().as_u16()
        };
        let commits = join_all((0..24).map(|_| commit(&app, &id, &payment)));
        let (voided, answers) = tokio::join!(void, commits);
        assert_eq!(voided, 200);
        for (status, body) in &answers {
            match status {
                200 => assert_eq!(body["status"], "COMMITTED", "{body}"),
                409 => {
                    assert_eq!(body["error_code"], "RESERVATION_NOT_ACTIVE", "{body}");
                    assert_eq!(body["reservation"]["status"], "VOIDED", "{body}");
                }
                _ => panic!("{status} {body}"),
            }
        }
        assert_eq!(refunds_of(&app, &payment).await, 1);
    }
    let (ok, doc) = audit(&app);
    assert!(ok, "{doc:#}");
}

/// `GET /v1/payments/{reference}` answers what a payment did.
async fn a_payment_reads_its_fate(app: TestApp) {
    let a = held(&app, "F-G1").await;
    let b = released(&app, "F-G2").await;
    commit(&app, &a, "pay-bought").await;
    let (_, refused) = commit(&app, &b, "pay-refunded").await;
    let bought = app.get_json("/v1/payments/pay-bought").await;
    assert_eq!(bought["payment_reference"], "pay-bought");
    assert_eq!(bought["fate"], "BOUGHT");
    assert_eq!(bought["reservation"]["reservation_id"], a.as_str());
    assert_eq!(bought["reservation"]["status"], "COMMITTED");
    assert_eq!(bought["refund"], Value::Null);
    let refunded = app.get_json("/v1/payments/pay-refunded").await;
    assert_eq!(refunded["fate"], "REFUNDED");
    assert_eq!(refunded["reservation"]["reservation_id"], b.as_str());
    assert_eq!(refunded["refund"], refused["refund"]);
    let missing = app.get("/v1/payments/pay-never").await;
    assert_eq!(missing.status(), 404);
    let body: Value = missing.json().await.unwrap();
    assert_eq!(body["error_code"], "PAYMENT_NOT_FOUND");
}

/// The same reference sent at once to many reservations, held and released:
/// exactly one fate, decided by the database.
async fn racing_commits_of_one_payment_give_it_one_fate(app: TestApp) {
    for round in 0..3 {
        let mut ids = Vec::new();
        for i in 0..8 {
            ids.push(held(&app, &format!("F-Q{round}-{i}")).await);
            ids.push(released(&app, &format!("F-P{round}-{i}")).await);
        }
        let payment = format!("pay-race-{round}");
        let answers = join_all(ids.iter().map(|id| commit(&app, id, &payment))).await;
        let sold = answers.iter().filter(|(s, _)| *s == 200).count();
        let refunded = answers
            .iter()
            .filter(|(s, b)| *s == 409 && b.get("refund").is_some())
            .count();
        let used = answers
            .iter()
            .filter(|(_, b)| b["error_code"] == "PAYMENT_REFERENCE_USED")
            .count();
        assert_eq!(sold + refunded, 1, "{answers:?}");
        assert_eq!(used, ids.len() - 1, "{answers:?}");
        assert_eq!(
            refunds_of(&app, &payment).await,
            i64::try_from(refunded).unwrap()
        );
        assert_eq!(
            app.count(&format!(
                "SELECT count(*) FROM reservations WHERE payment_reference = '{payment}'"
            ))
            .await,
            i64::try_from(sold).unwrap()
        );
    }
    let (ok, doc) = audit(&app);
    assert!(ok, "{doc:#}");
}

/// The `client` of a payment lookup is an API key's name: anything else (a
/// NUL byte, a control character, a space) is 422 with the parameter named,
/// never a statement the database refuses.
async fn a_client_that_is_no_key_name_is_refused(app: TestApp) {
    for client in ["x%00y", "x%C2%81", "a%20b", ""] {
        let response = app
            .get(&format!("/v1/payments/pay-1?client={client}"))
            .await;
        assert_eq!(response.status(), 422, "client={client}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error_code"], "VALIDATION_FAILED", "{body}");
        assert_eq!(body["errors"][0]["field"], "client", "{body}");
    }
    // A key name (and open mode's shared one) is looked up: no fate yet.
    for client in ["psp-1", "-"] {
        let response = app
            .get(&format!("/v1/payments/pay-1?client={client}"))
            .await;
        assert_eq!(response.status(), 404, "client={client}");
    }
}

backend_tests!(
    a_client_that_is_no_key_name_is_refused,
    retried_commits_racing_a_void_answer_one_state,
    a_kept_payment_is_not_refunded_elsewhere,
    a_payment_is_refunded_once_whichever_reservation,
    a_refunded_payment_does_not_buy_a_live_hold,
    a_voided_sale_is_never_refunded_twice,
    a_payment_reads_its_fate,
    racing_commits_of_one_payment_give_it_one_fate;
    backend:
        references_are_scoped_by_payments_client,
);

/// References are scoped by the payments client's key name: two providers
/// may use one string for two payments. A payments key reads its own.
async fn references_are_scoped_by_payments_client(backend: Backend) {
    use holdfast::config::Secret;
    use holdfast::keys::{new_key as api_key, Role};
    let (admin, a) = api_key("ops", Role::Admin).unwrap();
    let (psp1, p1) = api_key("psp-1", Role::Payments).unwrap();
    let (psp2, p2) = api_key("psp-2", Role::Payments).unwrap();
    let (shop, s) = api_key("shop", Role::Storefront).unwrap();
    let Some(app) = TestApp::try_spawn_with(backend, |c| {
        c.api_keys = Some(Secret::new(format!("{a},{p1},{p2},{s}")));
    })
    .await
    else {
        return;
    };
    let send = |method: Method, path: String, token: &str, body: Option<Value>| {
        let mut request = app
            .client
            .request(method, app.url(&path))
            .bearer_auth(token)
            .header("Idempotency-Key", new_key());
        if let Some(body) = body {
            request = request.json(&body);
        }
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (
                status,
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    let mut ids = Vec::new();
    for asset in ["S-1", "S-2"] {
        let body = json!({"id": asset, "name": asset});
        assert_eq!(
            send(Method::POST, "/v1/assets".into(), &admin, Some(body))
                .await
                .0,
            201
        );
        let path = format!("/v1/assets/{asset}/reservations");
        let (status, held) = send(Method::POST, path, &shop, Some(json!({"buyer_id": "b"}))).await;
        assert_eq!(status, 201);
        ids.push(held["reservation_id"].as_str().unwrap().to_owned());
    }
    let pay = json!({"payment_reference": "pay-shared"});
    let commit = |id: &str, token: &str| {
        send(
            Method::POST,
            format!("/v1/reservations/{id}/commit"),
            token,
            Some(pay.clone()),
        )
    };
    assert_eq!(commit(&ids[0], &psp1).await.0, 200);
    assert_eq!(
        commit(&ids[1], &psp2).await.0,
        200,
        "another client's payment"
    );
    let (status, body) = commit(&ids[1], &psp1).await;
    assert_eq!(status, 409);
    assert_eq!(body["error_code"], "PAYMENT_REFERENCE_USED");
    // Each client reads its own; an admin names the client, or sees both.
    for (token, id) in [(&psp1, &ids[0]), (&psp2, &ids[1])] {
        let (status, fate) = send(Method::GET, "/v1/payments/pay-shared".into(), token, None).await;
        assert_eq!(status, 200);
        assert_eq!(fate["reservation"]["reservation_id"], id.as_str());
    }
    let (status, fate) = send(
        Method::GET,
        "/v1/payments/pay-shared?client=psp-2".into(),
        &admin,
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(fate["reservation"]["reservation_id"], ids[1].as_str());
    let (status, both) = send(Method::GET, "/v1/payments/pay-shared".into(), &admin, None).await;
    assert_eq!(status, 422, "{both}");
    assert_eq!(
        send(
            Method::GET,
            "/v1/payments/pay-shared?client=psp-2".into(),
            &psp1,
            None
        )
        .await
        .0,
        404,
        "not another client's"
    );
    assert_eq!(
        send(Method::GET, "/v1/payments/pay-shared".into(), &shop, None)
            .await
            .0,
        403
    );
}
