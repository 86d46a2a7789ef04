//! The catalogue a shop sells from: prices, attributes and their filters,
//! batches, metadata, own holds and commits with an amount.

use futures_util::future::join_all;
use reqwest::Method;
use serde_json::{json, Value};

use crate::backend_tests;
use crate::helpers::{new_key, spawn_with_keys, Backend, TestApp};

async fn create(app: &TestApp, body: Value) -> (u16, Value) {
    app.send(Method::POST, "/v1/assets", None, Some(body)).await
}

async fn patch(app: &TestApp, path: &str, body: Value) -> (u16, Value) {
    app.send(Method::PATCH, path, None, Some(body)).await
}

/// The ids of a page of assets.
async fn ids(app: &TestApp, query: &str) -> Vec<String> {
    let page = app.get_json(&format!("/v1/assets?{query}")).await;
    page["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|a| a["id"].as_str().expect("an id").to_owned())
        .collect()
}

/// The fields a 422 names.
fn fields(body: &Value) -> Vec<String> {
    let mut fields: Vec<String> = body["errors"]
        .as_array()
        .map(|errors| {
            errors
                .iter()
                .map(|e| e["field"].as_str().unwrap_or("?").to_owned())
                .collect()
        })
        .unwrap_or_default();
    fields.sort();
    fields
}

async fn prices_and_attributes_are_kept_and_checked(app: TestApp) {
    let (status, asset) = create(
        &app,
        json!({"id": "AB12-CDE", "name": "Plate AB12 CDE",
               "price": {"amount": 250000, "currency": "EUR"},
               "attributes": {"region": "AB", "digits": 2, "vanity": true}}),
    )
    .await;
    assert_eq!(status, 201, "{asset}");
    assert_eq!(asset["price"], json!({"amount": 250000, "currency": "EUR"}));
    assert_eq!(
        asset["attributes"],
        json!({"region": "AB", "digits": 2, "vanity": true})
    );
    assert_eq!(app.get_json("/v1/assets/AB12-CDE").await, asset);
    // Without them: null and {}.
    let (_, plain) = create(&app, json!({"id": "P-1", "name": "plain"})).await;
    assert_eq!(plain["price"], Value::Null);
    assert_eq!(plain["attributes"], json!({}));
    // Every fault named by its path; nothing created.
    let long = "x".repeat(257);
    let many: serde_json::Map<String, Value> =
        (0..33).map(|i| (format!("k{i}"), json!(i))).collect();
    for (body, expected) in [
        (
            json!({"id": "P-2", "name": "p", "price": {"amount": 1_000_000_000_000_001_i64, "currency": "eur"}}),
            vec!["price.amount", "price.currency"],
        ),
        (
            json!({"id": "P-2", "name": "p", "attributes": {"Bad": 1, "f": 1.5, "s": long, "n": null}}),
            vec![
                "attributes.Bad",
                "attributes.f",
                "attributes.n",
                "attributes.s",
            ],
        ),
        (
            json!({"id": "P-2", "name": "p", "attributes": many}),
            vec!["attributes"],
        ),
        (
            json!({"id": "P-2", "name": "p", "price": {"amount": -1, "currency": "EUR"}}),
            vec!["price.amount"],
        ),
    ] {
        let (status, problem) = create(&app, body).await;
        assert_eq!(status, 422, "{problem}");
        assert_eq!(fields(&problem), expected, "{problem}");
    }
    assert_eq!(
        app.count("SELECT count(*) FROM assets WHERE id = 'P-2'")
            .await,
        0
    );
}

async fn a_patch_changes_the_catalogue_but_not_the_hold(app: TestApp) {
    create(
        &app,
        json!({"id": "PT-1", "name": "one", "price": {"amount": 100, "currency": "EUR"},
               "attributes": {"region": "B", "digits": 4}}),
    )
    .await;
    let held = app.hold("PT-1", "buyer-1", 300).await;
    assert_eq!(held["price"], json!({"amount": 100, "currency": "EUR"}));
    let before = app.get_json("/v1/assets/PT-1").await;
    let body = json!({"name": "renamed", "price": {"amount": 150, "currency": "EUR"},
                      "attributes": {"digits": null, "vanity": true}});
    let (status, after) = patch(&app, "/v1/assets/PT-1", body).await;
    assert_eq!(status, 200, "{after}");
    assert_eq!(after["name"], "renamed");
    assert_eq!(after["price"]["amount"], 150);
    assert_eq!(after["attributes"], json!({"region": "B", "vanity": true}));
    // No new version, and the hold is as it was.
    assert_eq!(after["version"], before["version"]);
    assert_eq!(after["status"], "HELD");
    assert_eq!(after["hold_expires_at"], before["hold_expires_at"]);
    let id = held["reservation_id"].as_str().unwrap();
    let reservation = app.get_json(&format!("/v1/reservations/{id}")).await;
    assert_eq!(
        reservation["price"],
        json!({"amount": 100, "currency": "EUR"})
    );
    // An asset.updated event, at the next number.
    let events = app.get_json("/v1/assets/PT-1/events").await;
    let last = events["items"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["type"], "asset.updated");
    assert_eq!(last["data"]["attributes"]["vanity"], true);
    // price: null removes the price; the filters follow the attributes.
    let (_, unpriced) = patch(&app, "/v1/assets/PT-1", json!({"price": null})).await;
    assert_eq!(unpriced["price"], Value::Null);
    assert!(ids(&app, "attribute=digits:4").await.is_empty());
    assert_eq!(ids(&app, "attribute=vanity:true").await, ["PT-1"]);
    // More than 32 attributes after the merge: 422, nothing changed.
    let many: serde_json::Map<String, Value> =
        (0..31).map(|i| (format!("k{i}"), json!(i))).collect();
    let (status, _) = patch(&app, "/v1/assets/PT-1", json!({"attributes": many})).await;
    assert_eq!(status, 422);
    assert_eq!(
        app.get_json("/v1/assets/PT-1").await["attributes"],
        json!({"region": "B", "vanity": true})
    );
}

async fn the_list_filters_by_prefix_attributes_and_price(app: TestApp) {
    for (id, region, digits, amount) in [
        ("AB12-A", "AB", json!(1), 100),
        ("AB12-B", "AB", json!("1"), 200),
        ("AB13-C", "AB", json!(2), 300),
        ("ab12-d", "AB", json!(1), 100),
        ("CD12-E", "CD", json!(1), 50),
    ] {
        let (status, _) = create(
            &app,
            json!({"id": id, "name": id, "price": {"amount": amount, "currency": "EUR"},
                   "attributes": {"region": region, "digits": digits}}),
        )
        .await;
        assert_eq!(status, 201);
    }
    assert_eq!(ids(&app, "id_prefix=AB12").await, ["AB12-A", "AB12-B"]);
    assert_eq!(ids(&app, "id_prefix=ab12").await, ["ab12-d"]);
    // An integer 1 matches, the string "1" does not; and the other way.
    assert_eq!(
        ids(&app, "attribute=digits:1").await,
        ["AB12-A", "CD12-E", "ab12-d"]
    );
    assert_eq!(ids(&app, "attribute=digits:%221%22").await, ["AB12-B"]);
    assert_eq!(
        ids(&app, "attribute=region:AB&attribute=digits:1&id_prefix=AB").await,
        ["AB12-A"]
    );
    assert_eq!(
        ids(&app, "price_max=100&currency=EUR").await,
        ["AB12-A", "CD12-E", "ab12-d"]
    );
    assert!(ids(&app, "price_max=100&currency=USD").await.is_empty());
    // With paging: every page of a filter, and nothing twice.
    let first = app.get_json("/v1/assets?attribute=region:AB&limit=2").await;
    let cursor = first["next_cursor"].as_str().expect("a next page");
    let second = app
        .get_json(&format!(
            "/v1/assets?attribute=region:AB&limit=2&cursor={cursor}"
        ))
        .await;
    let all: Vec<&str> = first["items"]
        .as_array()
        .unwrap()
        .iter()
        .chain(second["items"].as_array().unwrap())
        .map(|a| a["id"].as_str().unwrap())
        .collect();
    assert_eq!(all, ["AB12-A", "AB12-B", "AB13-C", "ab12-d"]);
    // Combined with the status.
    app.hold("AB12-A", "b", 300).await;
    assert_eq!(
        ids(&app, "id_prefix=AB12&status=AVAILABLE").await,
        ["AB12-B"]
    );
    // Faults are 422, naming the parameter.
    for (query, field) in [
        ("price_max=100", "currency"),
        ("currency=EUR", "price_max"),
        ("price_max=x&currency=EUR", "price_max"),
        ("price_max=1&currency=eur", "currency"),
        ("attribute=nocolon", "attribute"),
        ("attribute=Bad:1", "attribute"),
        ("id_prefix=%20", "id_prefix"),
    ] {
        let (status, problem) = app
            .send(Method::GET, &format!("/v1/assets?{query}"), None, None)
            .await;
        assert_eq!(status, 422, "{query}: {problem}");
        assert_eq!(fields(&problem), [field], "{query}");
    }
}

/// A price filter that most assets pass and one that few pass (read through
/// the price index, or checked on the walk of the ids) answer the same
/// pages: the assets that pass, in id order, page after page.
async fn a_price_filter_pages_alike_whether_many_or_few_pass(app: TestApp) {
    for batch in 0..2 {
        let items: Vec<Value> = (0..600)
            .map(|i| {
                let n = batch * 600 + i;
                // Every 100th asset is cheap; the others cost 5.00 EUR.
                let amount = if n % 100 == 7 { 100 } else { 500 };
                json!({"id": format!("PR-{n:04}"), "name": "lot",
                       "price": {"amount": amount, "currency": "EUR"}})
            })
            .collect();
        let response = app
            .post(
                "/v1/assets/batch",
                Some(&new_key()),
                &json!({ "items": items }),
            )
            .await;
        assert_eq!(response.status(), 200);
    }
    let cheap: Vec<String> = (0..1200)
        .filter(|n| n % 100 == 7)
        .map(|n| format!("PR-{n:04}"))
        .collect();
    assert_eq!(
        ids(&app, "price_max=100&currency=EUR&limit=50").await,
        cheap
    );
    // Most pass: page by page in id order, the cheap ones among them.
    let mut seen = Vec::new();
    let mut cursor = String::new();
    loop {
        let page = app
            .get_json(&format!(
                "/v1/assets?price_max=500&currency=EUR&limit=500{cursor}"
            ))
            .await;
        let items = page["items"].as_array().unwrap();
        seen.extend(items.iter().map(|a| a["id"].as_str().unwrap().to_owned()));
        match page["next_cursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => break,
        }
    }
    let all: Vec<String> = (0..1200).map(|n| format!("PR-{n:04}")).collect();
    assert_eq!(seen, all);
    assert!(ids(&app, "price_max=99&currency=EUR").await.is_empty());
    assert!(ids(&app, "price_max=500&currency=USD").await.is_empty());
}

async fn a_batch_is_all_or_nothing(app: TestApp) {
    create(&app, json!({"id": "B-0", "name": "zero"})).await;
    create(&app, json!({"id": "B-X", "name": "ex"})).await;
    // One bad item: 422 naming it by its index path, nothing written.
    let (status, problem) = app
        .send(
            Method::POST,
            "/v1/assets/batch",
            None,
            Some(json!({"items": [
                {"id": "B-1", "name": "one"},
                {"id": "B-2", "name": "two", "price": {"amount": 5, "currency": "eu"}},
            ]})),
        )
        .await;
    assert_eq!(status, 422, "{problem}");
    assert_eq!(fields(&problem), ["items[1].price.currency"]);
    assert_eq!(
        app.count("SELECT count(*) FROM assets WHERE id IN ('B-1', 'B-2')")
            .await,
        0
    );
    // An existing id with other data: 409 naming every such item.
    let (status, problem) = app
        .send(
            Method::POST,
            "/v1/assets/batch",
            None,
            Some(json!({"items": [
                {"id": "B-1", "name": "one"},
                {"id": "B-0", "name": "not zero"},
                {"id": "B-X", "name": "not ex"},
            ]})),
        )
        .await;
    assert_eq!(status, 409, "{problem}");
    assert_eq!(problem["error_code"], "ASSET_EXISTS");
    assert_eq!(
        problem["conflicts"],
        json!([{"index": 1, "id": "B-0"}, {"index": 2, "id": "B-X"}])
    );
    assert_eq!(
        app.count("SELECT count(*) FROM assets WHERE id = 'B-1'")
            .await,
        0
    );
    // Identical items are unchanged; the answer replays under its key.
    let body = json!({"items": [
        {"id": "B-1", "name": "one", "attributes": {"lot": 1}},
        {"id": "B-0", "name": "zero"},
        {"id": "B-2", "name": "two", "price": {"amount": 5, "currency": "EUR"}},
    ]});
    let first = app.post("/v1/assets/batch", Some("batch-1"), &body).await;
    assert_eq!(first.status(), 200);
    let first: Value = first.json().await.unwrap();
    assert_eq!(
        first,
        json!({"created": ["B-1", "B-2"], "unchanged": ["B-0"]})
    );
    let again = app.post("/v1/assets/batch", Some("batch-1"), &body).await;
    assert_eq!(again.status(), 200);
    assert_eq!(again.headers().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(again.json::<Value>().await.unwrap(), first);
    // Sent again under a new key: everything unchanged.
    let (_, second) = app
        .send(Method::POST, "/v1/assets/batch", None, Some(body))
        .await;
    assert_eq!(
        second,
        json!({"created": [], "unchanged": ["B-1", "B-0", "B-2"]})
    );
    assert_eq!(ids(&app, "attribute=lot:1").await, ["B-1"]);
    // More than 1,000 items: 422.
    let items: Vec<Value> = (0..1001)
        .map(|i| json!({"id": format!("M-{i}"), "name": "m"}))
        .collect();
    let (status, problem) = app
        .send(
            Method::POST,
            "/v1/assets/batch",
            None,
            Some(json!({"items": items})),
        )
        .await;
    assert_eq!(status, 422, "{problem}");
    assert_eq!(fields(&problem), ["items"]);
    let (ok, doc) = crate::audit::audit(&app);
    assert!(ok, "{doc:#}");
}

async fn a_batch_keeps_sale_dates_and_compares_an_id_named_twice(app: TestApp) {
    let opens = (chrono::Utc::now() + chrono::Duration::hours(1))
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    // An id named twice with the same data: created by its first item,
    // unchanged by the second; the sale date is kept.
    let (status, done) = app
        .send(
            Method::POST,
            "/v1/assets/batch",
            None,
            Some(json!({"items": [
                {"id": "D-1", "name": "later", "available_from": opens},
                {"id": "D-2", "name": "twice"},
                {"id": "D-2", "name": "twice"},
            ]})),
        )
        .await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(
        done,
        json!({"created": ["D-1", "D-2"], "unchanged": ["D-2"]})
    );
    let asset = app.get_json("/v1/assets/D-1").await;
    let stored = chrono::DateTime::parse_from_rfc3339(asset["available_from"].as_str().unwrap());
    let sent = chrono::DateTime::parse_from_rfc3339(&opens).unwrap();
    assert_eq!(stored.unwrap(), sent, "{asset}");
    let (status, body) = app
        .send(
            Method::POST,
            "/v1/assets/D-1/reservations",
            None,
            Some(json!({"buyer_id": "early"})),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error_code"], "SALE_NOT_OPEN");
    // Named twice with different data: 409 naming the later item, and
    // nothing of the batch written.
    let (status, problem) = app
        .send(
            Method::POST,
            "/v1/assets/batch",
            None,
            Some(json!({"items": [
                {"id": "D-3", "name": "one"},
                {"id": "D-3", "name": "another"},
            ]})),
        )
        .await;
    assert_eq!(status, 409, "{problem}");
    assert_eq!(problem["conflicts"], json!([{"index": 1, "id": "D-3"}]));
    assert_eq!(
        app.count("SELECT count(*) FROM assets WHERE id = 'D-3'")
            .await,
        0
    );
}

async fn overlapping_batches_in_parallel_create_each_asset_once(app: TestApp) {
    // Eight batches of 200 ids, each sharing half its ids with the next,
    // all at once: every one succeeds, and each id is created by exactly
    // one of them and unchanged in the others.
    let batches: Vec<Value> = (0..8)
        .map(|b| {
            let items: Vec<Value> = (b * 100..b * 100 + 200)
                .map(|i| json!({"id": format!("P-{i:04}"), "name": "lot"}))
                .collect();
            json!({"items": items})
        })
        .collect();
    let answers = join_all(batches.into_iter().map(|body| {
        let app = &app;
        async move {
            app.send(Method::POST, "/v1/assets/batch", None, Some(body))
                .await
        }
    }))
    .await;
    let mut created = std::collections::HashMap::new();
    for (status, answer) in &answers {
        assert_eq!(*status, 200, "{answer}");
        let names = |field: &str| answer[field].as_array().expect("a list").len();
        assert_eq!(names("created") + names("unchanged"), 200, "{answer}");
        for id in answer["created"].as_array().expect("created") {
            *created
                .entry(id.as_str().expect("an id").to_owned())
                .or_insert(0) += 1;
        }
    }
    assert_eq!(created.len(), 900, "every id created");
    assert!(created.values().all(|&n| n == 1), "{created:?}");
    assert_eq!(
        app.count("SELECT count(*) FROM assets WHERE id LIKE 'P-%'")
            .await,
        900
    );
    let (ok, doc) = crate::audit::audit(&app);
    assert!(ok, "{doc:#}");
}

async fn parallel_own_holds_of_one_buyer_make_one_reservation(app: TestApp) {
    app.create_asset("OWN-1").await;
    let answers = join_all((0..12).map(|_| {
        app.send(
            Method::POST,
            "/v1/assets/OWN-1/reservations",
            None,
            Some(json!({"buyer_id": "same-buyer", "hold_seconds": 300})),
        )
    }))
    .await;
    let created = answers.iter().filter(|(s, _)| *s == 201).count();
    assert_eq!(created, 1, "{answers:?}");
    let id = &answers.iter().find(|(s, _)| *s == 201).unwrap().1["reservation_id"];
    for (status, body) in &answers {
        assert!(matches!(status, 200 | 201), "{status} {body}");
        assert_eq!(&body["reservation_id"], id);
        assert_eq!(body["status"], "HELD");
    }
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 1);
    // The own hold is kept under its key, and its expiry was not moved.
    let before = app.get_json("/v1/assets/OWN-1").await["hold_expires_at"].clone();
    let again = app
        .post(
            "/v1/assets/OWN-1/reservations",
            Some("own-key"),
            &json!({"buyer_id": "same-buyer", "hold_seconds": 600}),
        )
        .await;
    assert_eq!(again.status(), 200);
    let replay = app
        .post(
            "/v1/assets/OWN-1/reservations",
            Some("own-key"),
            &json!({"buyer_id": "same-buyer", "hold_seconds": 600}),
        )
        .await;
    assert_eq!(replay.headers().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(
        app.get_json("/v1/assets/OWN-1").await["hold_expires_at"],
        before
    );
    // Another buyer is still refused.
    let (status, body) = app
        .send(
            Method::POST,
            "/v1/assets/OWN-1/reservations",
            None,
            Some(json!({"buyer_id": "other-buyer"})),
        )
        .await;
    assert_eq!(status, 409);
    assert_eq!(body["error_code"], "ASSET_UNAVAILABLE");
    let (ok, doc) = crate::audit::audit(&app);
    assert!(ok, "{doc:#}");
}

async fn a_short_payment_is_refunded_once_and_a_right_one_still_buys(app: TestApp) {
    create(
        &app,
        json!({"id": "PAY-1", "name": "priced", "price": {"amount": 1000, "currency": "EUR"}}),
    )
    .await;
    let held = app.hold("PAY-1", "buyer", 300).await;
    let id = held["reservation_id"].as_str().unwrap().to_owned();
    let commit = |payment: &str, amount: i64, currency: &str| json!({"payment_reference": payment, "amount": {"amount": amount, "currency": currency}});
    let path = format!("/v1/reservations/{id}/commit");
    let mut refunds = Vec::new();
    for _ in 0..3 {
        let (status, body) = app
            .send(
                Method::POST,
                &path,
                None,
                Some(commit("pay-short", 900, "EUR")),
            )
            .await;
        assert_eq!(status, 409, "{body}");
        assert_eq!(body["error_code"], "PAYMENT_AMOUNT_MISMATCH");
        assert_eq!(body["reservation"]["status"], "HELD");
        assert_eq!(body["refund"]["reason"], "AMOUNT_MISMATCH");
        refunds.push(body["refund"]["refund_id"].clone());
    }
    assert!(refunds.windows(2).all(|w| w[0] == w[1]), "{refunds:?}");
    let (status, body) = app
        .send(
            Method::POST,
            &path,
            None,
            Some(commit("pay-other-currency", 1000, "USD")),
        )
        .await;
    assert_eq!(status, 409);
    assert_eq!(body["error_code"], "PAYMENT_AMOUNT_MISMATCH");
    assert_eq!(
        app.count("SELECT count(*) FROM refunds WHERE reason = 'AMOUNT_MISMATCH'")
            .await,
        2
    );
    // A payment of the price or more buys it.
    let (status, body) = app
        .send(
            Method::POST,
            &path,
            None,
            Some(commit("pay-right", 1200, "EUR")),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "COMMITTED");
    assert_eq!(body["refunds"].as_array().unwrap().len(), 2);
    // Without an amount, commits behave as before.
    create(
        &app,
        json!({"id": "PAY-2", "name": "p", "price": {"amount": 5, "currency": "EUR"}}),
    )
    .await;
    let held = app.hold("PAY-2", "buyer", 300).await;
    let id = held["reservation_id"].as_str().unwrap();
    let response = app.commit(id, "plain-commit", "pay-plain").await;
    assert_eq!(response.status(), 200);
    let (ok, doc) = crate::audit::audit(&app);
    assert!(ok, "{doc:#}");
}

/// Metadata reaches the storefront that owns the reservation, admins and
/// payments clients, never another storefront.
async fn metadata_stays_with_its_owner(backend: Backend) {
    let Some((app, keys)) = spawn_with_keys(backend, |_| {}).await else {
        return;
    };
    let (admin, shop, other, psp) = (keys.admin, keys.shop, keys.other_shop, keys.payments);
    let (status, _) = app
        .send(
            Method::POST,
            "/v1/assets",
            Some(&admin),
            Some(json!({"id": "MD-1", "name": "m"})),
        )
        .await;
    assert_eq!(status, 201);
    let (status, held) = app
        .send(
            Method::POST,
            "/v1/assets/MD-1/reservations",
            Some(&shop),
            Some(json!({"buyer_id": "b", "metadata": {"order_id": "ord-5521"}})),
        )
        .await;
    assert_eq!(status, 201, "{held}");
    assert_eq!(held["metadata"], json!({"order_id": "ord-5521"}));
    let id = held["reservation_id"].as_str().unwrap();
    for token in [&shop, &admin, &psp] {
        let (_, r) = app
            .send(
                Method::GET,
                &format!("/v1/reservations/{id}"),
                Some(token),
                None,
            )
            .await;
        assert_eq!(r["metadata"]["order_id"], "ord-5521");
    }
    let (status, _) = app
        .send(
            Method::GET,
            &format!("/v1/reservations/{id}"),
            Some(&other),
            None,
        )
        .await;
    assert_eq!(status, 404);
    let (_, list) = app
        .send(Method::GET, "/v1/reservations", Some(&other), None)
        .await;
    assert!(list["items"].as_array().unwrap().is_empty());
    for path in ["/v1/assets/MD-1/events", "/v1/events"] {
        // The feed shows an event once every older transaction of the
        // cluster ended (other tests' included): read until it is there.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let ops = loop {
            let (_, ops) = app.send(Method::GET, path, Some(&admin), None).await;
            if !ops["items"].as_array().unwrap().is_empty() || std::time::Instant::now() > deadline
            {
                break ops;
            }
            tokio::task::yield_now().await;
        };
        // The operator's own view (and webhooks) carry it.
        assert!(ops.to_string().contains("ord-5521"), "{path}: {ops}");
        let (_, theirs) = app.send(Method::GET, path, Some(&other), None).await;
        assert_eq!(
            theirs["items"].as_array().unwrap().len(),
            1,
            "{path}: {theirs}"
        );
        let text = theirs.to_string();
        assert!(!text.contains("ord-5521"), "{path}: {text}");
    }
    // Bounds: 16 members, 2 KiB.
    let many: serde_json::Map<String, Value> =
        (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
    let (status, problem) = app
        .send(
            Method::POST,
            "/v1/assets/MD-1/reservations",
            Some(&shop),
            Some(json!({"buyer_id": "c", "metadata": many})),
        )
        .await;
    assert_eq!(status, 422, "{problem}");
    assert_eq!(fields(&problem), ["metadata"]);
}

backend_tests!(
    prices_and_attributes_are_kept_and_checked,
    a_patch_changes_the_catalogue_but_not_the_hold,
    the_list_filters_by_prefix_attributes_and_price,
    a_batch_is_all_or_nothing,
    a_batch_keeps_sale_dates_and_compares_an_id_named_twice,
    overlapping_batches_in_parallel_create_each_asset_once,
    a_price_filter_pages_alike_whether_many_or_few_pass,
    parallel_own_holds_of_one_buyer_make_one_reservation,
    a_short_payment_is_refunded_once_and_a_right_one_still_buys;
    backend:
        metadata_stays_with_its_owner,
);
