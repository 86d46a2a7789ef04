//! A randomized model-based test: seeded sequences of operations (create,
//! holds with short and long lapses, commits on time and late, releases,
//! extensions, voided sales, withdrawals and reinstatements, offers, joins
//! and leaves of waiting lists, replays with the same key, a key reused for
//! another request, segment ends that let short holds lapse) run against the
//! real service and against a small reference model of the contract. Every
//! status and error_code, every hand-off to a waiter, and the final state
//! (queues included) must match: a buyer outside a queue is never given an
//! asset that has waiters. A failing seed is printed; rerun it with
//! HOLDFAST_MODEL_SEED=<seed> cargo test model.

use std::collections::{BTreeMap, BTreeSet};

use reqwest::Method;

use serde_json::{json, Value};

use crate::backend_tests;
use crate::helpers::TestApp;

const BUYERS: &[&str] = &["ana", "ben", "chi"];
const LIMIT: usize = 5;
/// A short hold's length: it lapses at the end of its segment, when the test
/// ages it past its expiry, never by itself while the segment runs.
const SHORT_SECONDS: i64 = 60;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Held,
    Committed,
    Released,
    Expired,
    Voided,
}

/// How a hold was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    Hold,
    Offer,
    Waitlist,
}

#[derive(Debug, Clone)]
struct Res {
    asset: String,
    buyer: String,
    via: Via,
    status: Status,
    /// A short hold made in this epoch (lapses at the end of the segment).
    short_from: Option<u32>,
    payment: Option<String>,
    refunds: BTreeSet<String>,
}

impl Res {
    fn held(asset: &str, buyer: &str, via: Via, short_from: Option<u32>) -> Self {
        Res {
            asset: asset.to_owned(),
            buyer: buyer.to_owned(),
            via,
            status: Status::Held,
            short_from,
            payment: None,
            refunds: BTreeSet::new(),
        }
    }
}

#[derive(Debug, Clone)]
struct Request {
    method: Method,
    path: String,
    body: Value,
    /// Sent with an Idempotency-Key (assets' own operations are not).
    keyed: bool,
}

#[derive(Default)]
struct Model {
    epoch: u32,
    assets: BTreeSet<String>,
    withdrawn: BTreeSet<String>,
    reservations: BTreeMap<String, Res>,
    /// Each asset's waiters, first first.
    queues: BTreeMap<String, Vec<String>>,
    /// Hand-offs made by the last step, (asset, waiter), whose reservation
    /// ids the service chose.
    handed: Vec<(String, String)>,
    /// How often each kind of event the model cares about happened.
    seen: BTreeMap<&'static str, usize>,
    /// Each payment reference's one fate: the reservation it bought, or the
    /// one it was refunded through with the code that refund answers.
    fates: BTreeMap<String, Fate>,
    /// Answers stored under keys: the request they answered, status, raw body.
    stored: BTreeMap<String, (String, u16, Vec<u8>)>,
}

#[derive(Debug, Clone)]
struct Fate {
    reservation: String,
    /// `None`: it bought the reservation; else the code its refund answers.
    refunded: Option<&'static str>,
}

/// What the contract says a request must answer, and whether it is stored.
struct Expect {
    status: u16,
    code: Option<&'static str>,
    stored: bool,
}

/// The code a commit refused by a reservation in this state answers.
fn refusal(status: Status) -> &'static str {
    match status {
        Status::Expired => "HOLD_EXPIRED",
        Status::Committed => "ALREADY_COMMITTED",
        _ => "RESERVATION_NOT_ACTIVE",
    }
}

fn ok(status: u16, stored: bool) -> Expect {
    Expect {
        status,
        code: None,
        stored,
    }
}

fn fail(status: u16, code: &'static str, stored: bool) -> Expect {
    Expect {
        status,
        code: Some(code),
        stored,
    }
}

impl Model {
    fn effective(&self, id: &str) -> Status {
        let r = &self.reservations[id];
        match (r.status, r.short_from) {
            (Status::Held, Some(epoch)) if self.epoch > epoch => Status::Expired,
            (status, _) => status,
        }
    }

    fn live_hold_on(&self, asset: &str) -> Option<String> {
        self.reservations
            .iter()
            .find(|(id, r)| {
                r.asset == asset && matches!(self.effective(id), Status::Held | Status::Committed)
            })
            .map(|(id, _)| id.clone())
    }

    /// The buyer's live holds that count toward its limit (offers do not).
    fn live_holds_of(&self, buyer: &str) -> usize {
        self.reservations
            .iter()
            .filter(|(id, r)| {
                r.buyer == buyer && r.via != Via::Offer && self.effective(id) == Status::Held
            })
            .count()
    }

    fn queue(&self, asset: &str) -> &[String] {
        self.queues.get(asset).map_or(&[], Vec::as_slice)
    }

    /// The hold on `asset` ended without a sale: its first waiter below the
    /// limit gets it, those at the limit before it leave the queue.
    fn hand_off(&mut self, asset: &str) {
        let Some(mut queue) = self.queues.remove(asset) else {
            return;
        };
        while !queue.is_empty() {
            let head = queue.remove(0);
            if self.live_holds_of(&head) < LIMIT {
                self.handed.push((asset.to_owned(), head));
                *self.seen.entry("hand-offs").or_default() += 1;
                break;
            }
            *self.seen.entry("skips").or_default() += 1;
        }
        if !queue.is_empty() {
            self.queues.insert(asset.to_owned(), queue);
        }
    }

    fn expect_join(&self, asset: &str, buyer: &str) -> Expect {
        if !self.assets.contains(asset) {
            return fail(404, "ASSET_NOT_FOUND", false);
        }
        let held_by_other = self.live_hold_on(asset).is_some_and(|id| {
            self.effective(&id) == Status::Held && self.reservations[&id].buyer != buyer
        });
        match held_by_other {
            false => fail(409, "WAITLIST_NOT_OPEN", false),
            true if self.queue(asset).iter().any(|b| b == buyer) => ok(200, true),
            true => ok(201, true),
        }
    }

    fn expect_leave(&self, asset: &str, buyer: &str) -> Expect {
        if !self.assets.contains(asset) {
            return fail(404, "ASSET_NOT_FOUND", false);
        }
        match self.queue(asset).iter().any(|b| b == buyer) {
            true => ok(204, false),
            false => fail(404, "WAITLIST_ENTRY_NOT_FOUND", false),
        }
    }

    fn expect_offer(&self, asset: &str) -> Expect {
        if !self.assets.contains(asset) {
            return fail(404, "ASSET_NOT_FOUND", false);
        }
        if self.live_hold_on(asset).is_some() || self.withdrawn.contains(asset) {
            return fail(409, "ASSET_UNAVAILABLE", false);
        }
        ok(201, true)
    }

    fn expect_hold(&self, asset: &str, buyer: &str) -> Expect {
        if !self.assets.contains(asset) {
            return fail(404, "ASSET_NOT_FOUND", false);
        }
        let live = self.live_hold_on(asset);
        let own = live.as_ref().is_some_and(|id| {
            self.reservations[id].buyer == buyer && self.effective(id) == Status::Held
        });
        if own {
            // The buyer's own live hold: 200 with it, kept under the key.
            return ok(200, true);
        }
        if live.is_some() || self.withdrawn.contains(asset) {
            return fail(409, "ASSET_UNAVAILABLE", false);
        }
        if self.live_holds_of(buyer) >= LIMIT {
            return fail(409, "HOLD_LIMIT_REACHED", false);
        }
        ok(201, true)
    }

    fn expect_commit(&self, id: &str, payment: &str) -> Expect {
        let Some(r) = self.reservations.get(id) else {
            return fail(404, "RESERVATION_NOT_FOUND", false);
        };
        let status = self.effective(id);
        // First the payment's one fate, then the reservation's state.
        match self.fates.get(payment) {
            Some(fate) if fate.reservation != id => fail(409, "PAYMENT_REFERENCE_USED", false),
            Some(Fate {
                refunded: Some(code),
                ..
            }) => fail(409, code, false),
            Some(_) if status == Status::Voided => fail(409, "RESERVATION_NOT_ACTIVE", false),
            Some(_) => {
                assert_eq!(r.payment.as_deref(), Some(payment), "the model bought {id}");
                ok(200, false)
            }
            None => match status {
                Status::Held => ok(200, true),
                other => fail(409, refusal(other), true),
            },
        }
    }

    fn expect_extend(&self, id: &str) -> Expect {
        if !self.reservations.contains_key(id) {
            return fail(404, "RESERVATION_NOT_FOUND", false);
        }
        match self.effective(id) {
            Status::Held => ok(200, true),
            _ => fail(409, "RESERVATION_NOT_ACTIVE", false),
        }
    }

    fn expect_void(&self, id: &str) -> Expect {
        if !self.reservations.contains_key(id) {
            return fail(404, "RESERVATION_NOT_FOUND", false);
        }
        match self.effective(id) {
            Status::Committed => ok(200, true),
            Status::Voided => ok(200, false),
            _ => fail(409, "RESERVATION_NOT_ACTIVE", false),
        }
    }

    fn expect_withdraw(&self, asset: &str, force: bool) -> Expect {
        if !self.assets.contains(asset) {
            return fail(404, "ASSET_NOT_FOUND", false);
        }
        match self.live_hold_on(asset).map(|id| self.effective(&id)) {
            Some(Status::Committed) => fail(409, "ASSET_SOLD", false),
            Some(_) if !force => fail(409, "ASSET_HELD", false),
            _ => ok(200, false),
        }
    }

    fn expect_release(&self, id: &str) -> Expect {
        if !self.reservations.contains_key(id) {
            return fail(404, "RESERVATION_NOT_FOUND", false);
        }
        match self.effective(id) {
            Status::Held => ok(200, true),
            Status::Released => ok(200, false),
            Status::Committed | Status::Expired | Status::Voided => {
                fail(409, "RESERVATION_NOT_ACTIVE", false)
            }
        }
    }
}

#[derive(Clone)]
enum Op {
    Create(String),
    Hold {
        asset: String,
        buyer: String,
        short: bool,
    },
    Commit {
        id: String,
        payment: String,
    },
    Release {
        id: String,
    },
    Extend {
        id: String,
    },
    Void {
        id: String,
        refund: bool,
    },
    Withdraw {
        asset: String,
        force: bool,
    },
    Reinstate {
        asset: String,
    },
    Offer {
        asset: String,
        buyer: String,
        expires_at: String,
        short: bool,
    },
    Join {
        asset: String,
        buyer: String,
    },
    Leave {
        asset: String,
        buyer: String,
    },
}

impl Op {
    fn request(&self) -> Request {
        match self {
            Op::Create(id) => Request {
                method: Method::POST,
                path: "/v1/assets".into(),
                body: json!({"id": id, "name": id}),
                keyed: false,
            },
            Op::Extend { id } => Request {
                method: Method::POST,
                path: format!("/v1/reservations/{id}/extend"),
                body: json!({"hold_seconds": 300}),
                keyed: true,
            },
            Op::Void { id, refund } => Request {
                method: Method::POST,
                path: format!("/v1/reservations/{id}/void"),
                body: json!({ "refund": refund }),
                keyed: true,
            },
            Op::Withdraw { asset, force } => Request {
                method: Method::POST,
                path: format!("/v1/assets/{asset}/withdraw"),
                body: json!({ "force": force }),
                keyed: false,
            },
            Op::Reinstate { asset } => Request {
                method: Method::POST,
                path: format!("/v1/assets/{asset}/reinstate"),
                body: json!({}),
                keyed: false,
            },
            Op::Hold {
                asset,
                buyer,
                short,
            } => Request {
                method: Method::POST,
                path: format!("/v1/assets/{asset}/reservations"),
                body: json!({"buyer_id": buyer, "hold_seconds": if *short { SHORT_SECONDS } else { 300 }}),
                keyed: true,
            },
            Op::Commit { id, payment } => Request {
                method: Method::POST,
                path: format!("/v1/reservations/{id}/commit"),
                body: json!({"payment_reference": payment}),
                keyed: true,
            },
            Op::Release { id } => Request {
                method: Method::POST,
                path: format!("/v1/reservations/{id}/release"),
                body: json!({}),
                keyed: true,
            },
            Op::Offer {
                asset,
                buyer,
                expires_at,
                ..
            } => Request {
                method: Method::POST,
                path: format!("/v1/assets/{asset}/offers"),
                body: json!({"buyer_id": buyer, "client": "-", "expires_at": expires_at}),
                keyed: true,
            },
            Op::Join { asset, buyer } => Request {
                method: Method::POST,
                path: format!("/v1/assets/{asset}/waitlist"),
                body: json!({ "buyer_id": buyer }),
                keyed: true,
            },
            Op::Leave { asset, buyer } => Request {
                method: Method::DELETE,
                path: format!("/v1/assets/{asset}/waitlist/{buyer}"),
                body: Value::Null,
                keyed: false,
            },
        }
    }

    fn expect(&self, model: &Model) -> Expect {
        match self {
            Op::Create(id) if model.assets.contains(id) => fail(409, "ASSET_EXISTS", false),
            Op::Create(_) => ok(201, false),
            Op::Hold { asset, buyer, .. } => model.expect_hold(asset, buyer),
            Op::Commit { id, payment } => model.expect_commit(id, payment),
            Op::Release { id } => model.expect_release(id),
            Op::Extend { id } => model.expect_extend(id),
            Op::Void { id, .. } => model.expect_void(id),
            Op::Withdraw { asset, force } => model.expect_withdraw(asset, *force),
            Op::Reinstate { asset } if model.assets.contains(asset) => ok(200, false),
            Op::Reinstate { .. } => fail(404, "ASSET_NOT_FOUND", false),
            Op::Offer { asset, .. } => model.expect_offer(asset),
            Op::Join { asset, buyer } => model.expect_join(asset, buyer),
            Op::Leave { asset, buyer } => model.expect_leave(asset, buyer),
        }
    }

    /// Applies a successful change to the model.
    fn apply(&self, model: &mut Model, status: u16, body: &Value) {
        match self {
            Op::Create(id) if status == 201 => {
                model.assets.insert(id.clone());
            }
            Op::Hold {
                asset,
                buyer,
                short,
            } if status == 201 => {
                let id = body["reservation_id"].as_str().unwrap().to_owned();
                model.reservations.insert(
                    id,
                    Res::held(asset, buyer, Via::Hold, short.then_some(model.epoch)),
                );
            }
            Op::Offer {
                asset,
                buyer,
                short,
                ..
            } if status == 201 => {
                assert_eq!(body["via"], "offer", "an offer's hold: {body}");
                *model.seen.entry("offers").or_default() += 1;
                let id = body["reservation_id"].as_str().unwrap().to_owned();
                model.reservations.insert(
                    id,
                    Res::held(asset, buyer, Via::Offer, short.then_some(model.epoch)),
                );
            }
            Op::Join { asset, buyer } if status == 201 => {
                *model.seen.entry("joins").or_default() += 1;
                let queue = model.queues.entry(asset.clone()).or_default();
                queue.push(buyer.clone());
                assert_eq!(body["position"], queue.len(), "a newcomer's position");
            }
            Op::Join { asset, buyer } if status == 200 => {
                let position = model.queue(asset).iter().position(|b| b == buyer).unwrap();
                assert_eq!(body["position"], position + 1, "a waiter's position");
            }
            Op::Leave { asset, buyer } if status == 204 => {
                if let Some(queue) = model.queues.get_mut(asset) {
                    queue.retain(|b| b != buyer);
                    if queue.is_empty() {
                        model.queues.remove(asset);
                    }
                }
            }
            Op::Commit { id, payment } if !model.fates.contains_key(payment) => {
                let effective = model.effective(id);
                if status == 200 && effective == Status::Held {
                    let r = model.reservations.get_mut(id).unwrap();
                    r.status = Status::Committed;
                    r.payment = Some(payment.clone());
                    // A sale clears the asset's queue.
                    let asset = r.asset.clone();
                    if model.queues.remove(&asset).is_some() {
                        *model.seen.entry("queues cleared").or_default() += 1;
                    }
                    model.fates.insert(
                        payment.clone(),
                        Fate {
                            reservation: id.clone(),
                            refunded: None,
                        },
                    );
                } else if body.get("refund").is_some() {
                    let r = model.reservations.get_mut(id).unwrap();
                    r.refunds.insert(payment.clone());
                    model.fates.insert(
                        payment.clone(),
                        Fate {
                            reservation: id.clone(),
                            refunded: Some(refusal(effective)),
                        },
                    );
                }
            }
            Op::Release { id } if status == 200 && model.effective(id) == Status::Held => {
                let r = model.reservations.get_mut(id).unwrap();
                r.status = Status::Released;
                let asset = r.asset.clone();
                model.hand_off(&asset);
            }
            Op::Extend { id } if status == 200 => {
                model.reservations.get_mut(id).unwrap().short_from = None;
            }
            Op::Void { id, refund }
                if status == 200 && model.effective(id) == Status::Committed =>
            {
                let r = model.reservations.get_mut(id).unwrap();
                r.status = Status::Voided;
                if *refund {
                    let payment = r.payment.clone().unwrap();
                    r.refunds.insert(payment);
                }
            }
            Op::Withdraw { asset, .. } if status == 200 => {
                if let Some(id) = model.live_hold_on(asset) {
                    model.reservations.get_mut(&id).unwrap().status = Status::Released;
                }
                // A withdrawal clears the queue: nobody is handed the asset.
                model.queues.remove(asset);
                model.withdrawn.insert(asset.clone());
            }
            Op::Reinstate { asset } if status == 200 => {
                model.withdrawn.remove(asset);
            }
            _ => {}
        }
    }
}

struct Run<'a> {
    app: &'a TestApp,
    model: Model,
    rng: fastrand::Rng,
    seed: u64,
    step: usize,
    sent: Vec<(String, Request, Op)>,
}

impl Run<'_> {
    fn pick<'b, T>(&mut self, items: &'b [T]) -> Option<&'b T> {
        (!items.is_empty()).then(|| &items[self.rng.usize(..items.len())])
    }

    fn random_op(&mut self) -> Op {
        let assets: Vec<String> = self.model.assets.iter().cloned().collect();
        let reservations: Vec<String> = self.model.reservations.keys().cloned().collect();
        let payment = format!("pay-{}", self.rng.u8(..12));
        let buyer: String = BUYERS[self.rng.usize(..BUYERS.len())].into();
        let asset = self
            .pick(&assets)
            .cloned()
            .unwrap_or_else(|| "MD-none".into());
        // Assets held now: where queues form.
        let held: Vec<String> = (assets.iter())
            .filter(|a| {
                (self.model.live_hold_on(a))
                    .is_some_and(|id| self.model.effective(&id) == Status::Held)
            })
            .cloned()
            .collect();
        match self.rng.u8(..18) {
            0 => Op::Create(format!("MD-{}", self.rng.u8(..6))),
            14 | 15 => Op::Join {
                asset: self.pick(&held).cloned().unwrap_or(asset),
                buyer,
            },
            16 => Op::Leave { asset, buyer },
            17 => Op::Offer {
                asset,
                buyer,
                expires_at: (chrono::Utc::now() + chrono::Duration::days(2))
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                short: self.rng.bool(),
            },
            10 | 11 => match self.pick(&reservations).cloned() {
                Some(id) if self.rng.bool() => Op::Extend { id },
                Some(id) => Op::Void {
                    id,
                    refund: self.rng.u8(..4) > 0,
                },
                None => Op::Create(format!("MD-{}", self.rng.u8(..6))),
            },
            12 => Op::Withdraw {
                asset,
                force: self.rng.bool(),
            },
            13 => Op::Reinstate { asset },
            1..=4 => Op::Hold {
                asset,
                buyer,
                short: self.rng.bool(),
            },
            5..=7 => match self.pick(&reservations).cloned() {
                Some(id) => Op::Commit { id, payment },
                None => Op::Create(format!("MD-{}", self.rng.u8(..6))),
            },
            _ => match self.pick(&reservations).cloned() {
                Some(id) => Op::Release { id },
                None => Op::Create(format!("MD-{}", self.rng.u8(..6))),
            },
        }
    }

    async fn send(&mut self, key: &str, request: &Request) -> (u16, Value, Vec<u8>, bool) {
        let mut call = self
            .app
            .client
            .request(request.method.clone(), self.app.url(&request.path));
        if !request.body.is_null() {
            call = call.json(&request.body);
        }
        if request.keyed {
            call = call.header("Idempotency-Key", key);
        }
        let response = call.send().await.unwrap();
        let status = response.status().as_u16();
        let replayed = response.headers().get("idempotent-replayed").is_some();
        let bytes = response.bytes().await.unwrap().to_vec();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, body, bytes, replayed)
    }

    fn context(&self, what: &str) -> String {
        format!("seed {} step {} ({what})", self.seed, self.step)
    }

    /// Sends `op` under `key` and checks the answer against the model.
    async fn perform(&mut self, key: String, op: Op) {
        let request = op.request();
        let describe = format!("{} {} {}", request.method, request.path, request.body);
        let keyed = request.keyed;
        let (status, body, bytes, replayed) = self.send(&key, &request).await;
        let ctx = self.context(&describe);
        match self.model.stored.get(&key).filter(|_| keyed) {
            Some((stored_request, stored_status, stored_body)) if stored_request == &describe => {
                let want = if *stored_status == 201 {
                    200
                } else {
                    *stored_status
                };
                assert_eq!(status, want, "{ctx}: replay status");
                assert!(replayed, "{ctx}: replay header");
                assert_eq!(&bytes, stored_body, "{ctx}: replayed body");
            }
            Some(_) => {
                assert_eq!(status, 422, "{ctx}: {body}");
                assert_eq!(body["error_code"], "IDEMPOTENCY_KEY_REUSED", "{ctx}");
            }
            None => {
                let expect = op.expect(&self.model);
                assert_eq!(status, expect.status, "{ctx}: {body}");
                assert!(!replayed, "{ctx}: a first answer is no replay");
                if let Some(code) = expect.code {
                    assert_eq!(body["error_code"], code, "{ctx}");
                }
                op.apply(&mut self.model, status, &body);
                if expect.stored && keyed {
                    self.model
                        .stored
                        .insert(key.clone(), (describe, status, bytes));
                }
            }
        }
        self.sent.push((key, request, op));
        self.find_hand_offs(self.model.epoch).await;
    }

    /// Finds, in the service, the hold each hand-off of the model gave: the
    /// one HELD reservation of the asset the model does not know yet, the
    /// waiter's, via the waiting list. Unless paid, released or extended
    /// first, that hold lapses at the end of segment `lapses_in`: the next
    /// waiter's turn.
    async fn find_hand_offs(&mut self, lapses_in: u32) {
        for (asset, waiter) in std::mem::take(&mut self.model.handed) {
            let page = self
                .app
                .get_json(&format!("/v1/reservations?asset_id={asset}&status=HELD"))
                .await;
            let new: Vec<&Value> = page["items"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| {
                    let id = r["reservation_id"].as_str().unwrap();
                    !self.model.reservations.contains_key(id)
                })
                .collect();
            let ctx = self.context(&format!("hand-off of {asset} to {waiter}"));
            assert_eq!(new.len(), 1, "{ctx}: {page}");
            assert_eq!(new[0]["buyer_id"], waiter.as_str(), "{ctx}: {page}");
            assert_eq!(new[0]["via"], "waitlist", "{ctx}: {page}");
            let id = new[0]["reservation_id"].as_str().unwrap().to_owned();
            let held = Res::held(&asset, &waiter, Via::Waitlist, Some(lapses_in));
            self.model.reservations.insert(id, held);
        }
    }

    async fn step_once(&mut self) {
        self.step += 1;
        match self.rng.u8(..20) {
            // Replay an earlier request with its key.
            0..=2 if !self.sent.is_empty() => {
                let (key, _, op) = &self.sent[self.rng.usize(..self.sent.len())];
                let (key, op) = (key.clone(), op.clone());
                self.perform(key, op).await;
            }
            // Reuse an earlier key for another request.
            3 if !self.sent.is_empty() => {
                let key = self.sent[self.rng.usize(..self.sent.len())].0.clone();
                let op = self.random_op();
                self.perform(key, op).await;
            }
            _ => {
                let op = self.random_op();
                self.perform(ulid::Ulid::new().to_string(), op).await;
            }
        }
    }

    /// Lapses, in the service, every short hold of this segment that the
    /// model has HELD, one after the other. A hold whose asset has waiters
    /// is found at once by the janitor, which hands the asset on; the others
    /// stay unswept, for the next segment to meet by their effective status.
    async fn lapse_short_holds(&mut self) {
        let lapsing: Vec<String> = (self.model.reservations.iter())
            .filter(|(_, r)| r.status == Status::Held && r.short_from == Some(self.model.epoch))
            .map(|(id, _)| id.clone())
            .collect();
        for id in lapsing {
            self.app.lapse(&id).await;
            let r = self.model.reservations.get_mut(&id).unwrap();
            r.status = Status::Expired;
            let asset = r.asset.clone();
            if !self.model.queue(&asset).is_empty() {
                holdfast::janitor::run_once(&self.app.store).await.unwrap();
                self.model.hand_off(&asset);
                self.find_hand_offs(self.model.epoch + 1).await;
            }
        }
    }

    async fn check_final_state(&self) {
        for (id, r) in &self.model.reservations {
            let got = self.app.get_json(&format!("/v1/reservations/{id}")).await;
            let want = match self.model.effective(id) {
                Status::Held => "HELD",
                Status::Committed => "COMMITTED",
                Status::Released => "RELEASED",
                Status::Expired => "EXPIRED",
                Status::Voided => "VOIDED",
            };
            assert_eq!(
                got["status"],
                want,
                "{}: reservation {id}",
                self.context("final")
            );
            let refunds: BTreeSet<String> = got["refunds"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["payment_reference"].as_str().unwrap().to_owned())
                .collect();
            assert_eq!(
                refunds,
                r.refunds,
                "{}: refunds of {id}",
                self.context("final")
            );
        }
        let stored = self.app.count("SELECT count(*) FROM reservations").await;
        let ctx = self.context("final");
        assert_eq!(stored, self.model.reservations.len() as i64, "{ctx}");
        for asset in &self.model.assets {
            let got = self
                .app
                .get_json(&format!("/v1/assets/{asset}/waitlist"))
                .await;
            let waiters: Vec<&str> = (got["items"].as_array().unwrap().iter())
                .map(|e| e["buyer_id"].as_str().unwrap())
                .collect();
            assert_eq!(waiters, self.model.queue(asset), "{ctx}: queue of {asset}");
            let got = self.app.get_json(&format!("/v1/assets/{asset}")).await;
            assert_eq!(got["waitlist_length"], waiters.len(), "{ctx}: {got}");
            let want = match self.model.live_hold_on(asset) {
                Some(id) if self.model.effective(&id) == Status::Committed => "SOLD",
                Some(_) => "HELD",
                None if self.model.withdrawn.contains(asset) => "WITHDRAWN",
                None => "AVAILABLE",
            };
            assert_eq!(
                got["status"],
                want,
                "{}: asset {asset}",
                self.context("final")
            );
        }
    }
}

fn seeds() -> Vec<u64> {
    match std::env::var("HOLDFAST_MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(seed) => vec![seed],
        None => vec![7, 2026, 91_129, 4, 1_000_003, 77, 31_337, 5_150],
    }
}

async fn the_service_behaves_like_the_model(app: TestApp) {
    let mut seen = BTreeMap::new();
    for seed in seeds() {
        app.sql("DELETE FROM idempotency_keys; DELETE FROM waitlist; DELETE FROM events; DELETE FROM payments; DELETE FROM refunds; DELETE FROM reservations; DELETE FROM assets;")
            .await;
        let mut run = Run {
            app: &app,
            model: Model::default(),
            rng: fastrand::Rng::with_seed(seed),
            seed,
            step: 0,
            sent: Vec::new(),
        };
        // Segments of a few fast steps; at the end of each, the short holds
        // of the segment that are still held lapse (as waiting would have
        // made them), unswept unless waiters are due: the next segment meets
        // them as the service does, by their effective status.
        for n in 0..4 {
            run.perform(ulid::Ulid::new().to_string(), Op::Create(format!("MD-{n}")))
                .await;
        }
        for _ in 0..6 {
            for _ in 0..20 {
                run.step_once().await;
            }
            run.lapse_short_holds().await;
            run.model.epoch += 1;
        }
        run.check_final_state().await;
        eprintln!(
            "model seed {seed}: {} steps, {} reservations agree, {:?}",
            run.step,
            run.model.reservations.len(),
            run.model.seen
        );
        for (what, n) in run.model.seen {
            *seen.entry(what).or_insert(0) += n;
        }
    }
    // The seeds reach every waiting-list path the model knows.
    if seeds().len() > 1 {
        for what in ["joins", "hand-offs", "offers", "queues cleared"] {
            assert!(
                seen.get(what).is_some_and(|n| *n > 0),
                "no {what}: {seen:?}"
            );
        }
    }
}

backend_tests!(the_service_behaves_like_the_model);
