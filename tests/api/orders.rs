//! Every answer agrees with one order of the requests: two writes sent at
//! once to one reservation get the answers that the one, then the other,
//! would get, in one of the two orders. Each answer's status agrees with its
//! own body, which is the state its decision read.

use std::time::Duration;

use futures_util::future::join_all;
use serde_json::{json, Value};

use crate::backend_tests;
use crate::helpers::{stagger, TestApp};

/// A reservation's state, as far as these writes can tell it apart.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Held,
    Committed(&'static str),
    Released,
    Voided(&'static str),
}

/// The writes raced against each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Write {
    Commit(&'static str),
    Release,
    Extend,
    Void,
}

/// What a write answers: its status, its `error_code` (for a 409), and the
/// reservation's status in its body.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    status: u16,
    code: Option<String>,
    shown: String,
}

impl Answer {
    fn ok(shown: &str) -> Self {
        Self {
            status: 200,
            code: None,
            shown: shown.into(),
        }
    }

    fn refused(code: &str, shown: &str) -> Self {
        Self {
            status: 409,
            code: Some(code.into()),
            shown: shown.into(),
        }
    }

    fn of(status: u16, body: &Value) -> Self {
        match status {
            200 => Self::ok(body["status"].as_str().unwrap_or("?")),
            _ => Self {
                status,
                code: body["error_code"].as_str().map(str::to_owned),
                shown: body["reservation"]["status"]
                    .as_str()
                    .unwrap_or("?")
                    .to_owned(),
            },
        }
    }
}

/// The contract: what `write` answers on a reservation in `state`, and the
/// state it leaves.
fn contract(state: &State, write: Write) -> (Answer, State) {
    const NOT_ACTIVE: &str = "RESERVATION_NOT_ACTIVE";
    match (state, write) {
        (State::Held, Write::Commit(p)) => (Answer::ok("COMMITTED"), State::Committed(p)),
        (State::Held, Write::Release) => (Answer::ok("RELEASED"), State::Released),
        (State::Held, Write::Extend) => (Answer::ok("HELD"), State::Held),
        (State::Held, Write::Void) => (Answer::refused(NOT_ACTIVE, "HELD"), State::Held),
        (State::Committed(sold), Write::Commit(p)) if *sold == p => {
            (Answer::ok("COMMITTED"), state.clone())
        }
        (State::Committed(_), Write::Commit(_)) => (
            Answer::refused("ALREADY_COMMITTED", "COMMITTED"),
            state.clone(),
        ),
        (State::Committed(_), Write::Release | Write::Extend) => {
            (Answer::refused(NOT_ACTIVE, "COMMITTED"), state.clone())
        }
        (State::Committed(sold), Write::Void) => (Answer::ok("VOIDED"), State::Voided(sold)),
        (State::Released, Write::Release) => (Answer::ok("RELEASED"), State::Released),
        (State::Released, _) => (Answer::refused(NOT_ACTIVE, "RELEASED"), State::Released),
        (State::Voided(_), Write::Void) => (Answer::ok("VOIDED"), state.clone()),
        (State::Voided(_), _) => (Answer::refused(NOT_ACTIVE, "VOIDED"), state.clone()),
    }
}

/// The answers of `first` then `second`, in that order, from `state`.
fn in_order(state: &State, first: Write, second: Write) -> (Answer, Answer) {
    let (a, after) = contract(state, first);
    let (b, _) = contract(&after, second);
    (a, b)
}

/// A reservation in `state`: held by a buyer of its own, and sold with
/// `pay-sold` (then voided) as the state says.
async fn reservation_in(app: &TestApp, asset: &str, state: &State) -> String {
    app.create_asset(asset).await;
    let held = app.hold(asset, &format!("buyer-{asset}"), 300).await;
    let id = held["reservation_id"].as_str().expect("an id").to_owned();
    match state {
        State::Held => {}
        State::Committed(payment) | State::Voided(payment) => {
            let sold = app
                .commit(&id, &format!("sell-{asset}"), &format!("{payment}-{asset}"))
                .await;
            assert_eq!(sold.status(), 200);
        }
        State::Released => {
            let released = app.release(&id, &format!("release-{asset}")).await;
            assert_eq!(released.status(), 200);
        }
    }
    if let State::Voided(_) = state {
        let voided = send(app, &id, asset, Write::Void, "setup").await;
        assert_eq!(voided.status, 200);
    }
    id
}

/// Sends `write` to the reservation under a key of its own; payments are
/// made unique per asset, so that no race spills into another.
async fn send(app: &TestApp, id: &str, asset: &str, write: Write, tag: &str) -> Answer {
    let key = format!("{tag}-{write:?}-{asset}");
    let (path, body) = match write {
        Write::Commit(payment) => (
            "commit",
            json!({"payment_reference": format!("{payment}-{asset}")}),
        ),
        Write::Release => ("release", json!({})),
        Write::Extend => ("extend", json!({"hold_seconds": 120})),
        Write::Void => ("void", json!({})),
    };
    let response = app
        .post(&format!("/v1/reservations/{id}/{path}"), Some(&key), &body)
        .await;
    let status = response.status().as_u16();
    let body: Value = response.json().await.expect("a JSON answer");
    Answer::of(status, &body)
}

/// Races `a` and `b` on fresh reservations in `state`, `b` staggered by
/// `delays`, and checks every pair of answers against both orders.
async fn race(app: &TestApp, label: &str, state: State, a: Write, b: Write, delays: &[u64]) {
    let setups = join_all(delays.iter().enumerate().map(|(i, _)| {
        let state = state.clone();
        async move {
            let asset = format!("{label}-{i}");
            let id = reservation_in(app, &asset, &state).await;
            (asset, id)
        }
    }))
    .await;
    let answers = join_all(
        setups
            .iter()
            .zip(delays)
            .map(|((asset, id), delay)| async move {
                let first = send(app, id, asset, a, "a");
                let second = async {
                    stagger(Duration::from_millis(*delay)).await;
                    send(app, id, asset, b, "b").await
                };
                let (x, y) = tokio::join!(first, second);
                (asset, x, y)
            }),
    )
    .await;
    let forward = in_order(&state, a, b);
    let backward = in_order(&state, b, a);
    for (asset, x, y) in answers {
        let agrees = (x.clone(), y.clone()) == forward || (y.clone(), x.clone()) == backward;
        assert!(
            agrees,
            "{asset}: {a:?} answered {x:?} and {b:?} answered {y:?} from {state:?}; \
             one order gives {forward:?}, the other {backward:?}"
        );
    }
}

/// The race found from outside: a sale voided while its own payment is
/// committed again under a new key, the commit a few milliseconds later.
async fn a_void_racing_the_sales_own_commit_agrees_with_one_order(app: TestApp) {
    let delays: Vec<u64> = (0..24).map(|i| i % 8).collect();
    let sold = State::Committed("pay");
    race(&app, "VC", sold, Write::Void, Write::Commit("pay"), &delays).await;
}

/// Every pair of writes on one reservation, held or sold.
async fn every_pair_of_writes_agrees_with_one_order(app: TestApp) {
    let writes = [
        Write::Commit("pay"),
        Write::Commit("other"),
        Write::Release,
        Write::Extend,
        Write::Void,
    ];
    let delays = [0, 1, 3];
    let mut races = Vec::new();
    for (state_tag, state) in [("H", State::Held), ("S", State::Committed("pay"))] {
        for (i, a) in writes.iter().enumerate() {
            for (j, b) in writes.iter().enumerate().skip(i) {
                let label = format!("P{state_tag}{i}{j}");
                races.push((label, state.clone(), *a, *b));
            }
        }
    }
    join_all(
        races
            .iter()
            .map(|(label, state, a, b)| race(&app, label, state.clone(), *a, *b, &delays)),
    )
    .await;
}

backend_tests!(
    a_void_racing_the_sales_own_commit_agrees_with_one_order,
    every_pair_of_writes_agrees_with_one_order,
);
