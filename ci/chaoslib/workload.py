"""The workload: client threads that act as storefronts, payment systems and
operators at once, against all instances, retrying blindly.

Each thread loops: hold an asset, then commit it (at once, or late, past the
hold's expiry), release it, extend it, or abandon it; void some sales and
follow up on them; now and then withdraw and reinstate an asset, move a
sale's opening, list reservations, or look a payment up; queue for an asset
someone holds (fresh waiters, who sometimes leave, and who act on the hold a
hand-off gives them once they find it), or, as an operator, offer an
available asset to a named buyer. Payment references
are mostly fresh, but some commits reuse one already sent for another
reservation (a blind retry to the wrong reservation is a real client bug):
one that bought or was refunded elsewhere, or one still in flight; and some
send one reference to several reservations at once."""

from __future__ import annotations

import collections
import functools
import heapq
import random
import threading
import time
import urllib.parse
import uuid

from .client import Http, perform, send
from .common import HOLD_SECONDS_MAX, iso, parse_ts

# What a client thread does besides holding, per iteration of its loop.
RATE_WITHDRAW = 0.012       # an admin withdraws an asset (sometimes forced), reinstates it later
RATE_GATE = 0.006           # an admin moves an asset's sale opening (available_from)
RATE_LIST = 0.012           # someone lists reservations (by asset, buyer, status), page by page
RATE_REINSTATE = 0.002      # an admin reinstates any asset (mostly: nothing to do)
RATE_FANOUT = 0.010         # one payment reference sent to several holds at once
RATE_LOOKUP = 0.010         # the payment system asks what became of a payment
RATE_JOIN = 0.030           # a fresh buyer queues for an asset held a moment ago
RATE_OFFER = 0.006          # an admin offers an asset to a named buyer for a few seconds
P_LEAVE = 0.3               # a waiter leaves the queue a little later
P_CLAIM = 0.6               # a waiter looks for the hold a hand-off gave it, and acts on it
# After a hold, and after a sale.
P_EXTEND = 0.08             # a chain of one to three extensions before deciding
P_VOID_HELD = 0.012         # voiding a hold (not a sale): 409
P_VOID_SALE = 0.10          # voiding a sale, then what follows a void
P_GATED_ASSET = 0.08        # a replacement asset created with a sale opening a few seconds on
P_REUSE = 0.08              # a commit carries a reference already sent for another reservation


class AssetPool:
    def __init__(self):
        self.lock = threading.Lock()
        self.ids: list[str] = []
        self.index: dict[str, int] = {}
        self.created = 0
        self.counter = 0

    def add(self, asset_id):
        with self.lock:
            if asset_id not in self.index:
                self.index[asset_id] = len(self.ids)
                self.ids.append(asset_id)

    def remove(self, asset_id) -> bool:
        with self.lock:
            i = self.index.pop(asset_id, None)
            if i is None:
                return False
            last = self.ids.pop()
            if last != asset_id:
                self.ids[i] = last
                self.index[last] = i
            return True

    def pick(self, rng):
        with self.lock:
            return rng.choice(self.ids) if self.ids else None

    def next_id(self):
        with self.lock:
            self.counter += 1
            return f"chaos-{self.counter:05d}"

    def __len__(self):
        with self.lock:
            return len(self.ids)


class Ledger:
    """The payment references sent so far, and for which reservation: what a
    confused client may send again for another one."""

    RECENT = 8               # the last few: likely still in flight

    def __init__(self):
        self.lock = threading.Lock()
        self.sent: collections.deque = collections.deque(maxlen=500)  # (pref, rid)

    def note(self, pref, rid):
        with self.lock:
            self.sent.append((pref, rid))

    def pick(self, rng, rid=None):
        """A reference sent for a reservation other than rid: half the time
        one of the last few sent (perhaps in flight), else any."""
        with self.lock:
            pool = list(self.sent)
        if rng.random() < 0.5:
            pool = pool[-self.RECENT:]
        pool = [p for p, r in pool if r != rid]
        return rng.choice(pool) if pool else None


class Context:
    def __init__(self, rec, ports, pool, deadline, seed):
        self.rec = rec
        self.ports = ports
        self.pool = pool
        self.deadline = deadline
        self.seed = seed
        self.ledger = Ledger()
        # Assets held a moment ago: where queues form.
        self.recently_held: collections.deque = collections.deque(maxlen=64)
        self.dups = 0
        self.lock = threading.Lock()
        self.intents = collections.Counter()

    def new_op(self, kind, method, path, payload, idempotent, meta):
        with self.lock:
            self.intents[meta["intent"]] += 1
        return self.rec.new_op(kind, method, path, payload, idempotent, meta)


class Res:
    """What a client thread knows of one of its reservations. Only the thread
    that made it acts on it (other threads may end it: a forced withdrawal)."""

    __slots__ = ("rid", "asset_id", "buyer_id", "created_at", "expires_at")

    def __init__(self, rid, asset_id, buyer_id, created_at, expires_at):
        self.rid = rid
        self.asset_id = asset_id
        self.buyer_id = buyer_id
        self.created_at = created_at
        self.expires_at = expires_at

    def meta(self, intent, **more):
        m = {"rid": self.rid, "asset_id": self.asset_id, "expires_at": self.expires_at,
             "created_at": self.created_at, "intent": intent}
        m.update(more)
        return m


def new_pref():
    return f"pay-{uuid.uuid4().hex[:20]}"


def create_asset(ctx, http_, rng, phase="load", gated=False):
    asset_id = ctx.pool.next_id()
    payload = {"id": asset_id, "name": f"Chaos lot {asset_id}"}
    meta = {"asset_id": asset_id, "intent": "create"}
    if gated:
        # The sale opens a few seconds from now: holds before are SALE_NOT_OPEN.
        payload["available_from"] = iso(time.time() + rng.uniform(0.5, 3.0))
        meta.update(intent="create-gated", available_from=payload["available_from"])
    op = ctx.new_op("create_asset", "POST", "/v1/assets", payload, False, meta)
    a = perform(ctx.rec, http_, op, ctx.ports, phase=phase, rng=rng)
    if a is not None and (a.status == 201 or (a.status == 409 and a.code == "ASSET_EXISTS")):
        ctx.pool.add(asset_id)
        with ctx.pool.lock:
            ctx.pool.created += 1
    return a


def maybe_duplicate(ctx, http_, rng, op, a):
    """Sometimes send an answered request once more, as a client that never saw
    the answer would: same key, same body, any instance."""
    if a is None or op.key is None or not a.good or rng.random() >= 0.12:
        return
    with ctx.lock:
        ctx.dups += 1
    send(ctx.rec, http_, op, rng.choice(ctx.ports), "dup", rng)


def hold(ctx, http_, rng, asset_id, buyer, first_port=None, intent="hold"):
    """A hold; the Res of the reservation when it was granted."""
    hold_s = rng.randint(1, 5)
    op = ctx.rec.new_op("hold", "POST", f"/v1/assets/{asset_id}/reservations",
                        {"buyer_id": buyer, "hold_seconds": hold_s}, True,
                        {"asset_id": asset_id, "buyer_id": buyer, "intent": intent})
    a = perform(ctx.rec, http_, op, ctx.ports, rng=rng, first_port=first_port)
    maybe_duplicate(ctx, http_, rng, op, a)
    if a is None or not isinstance(a.body, dict):
        return a, None
    if a.status == 409:
        if a.body.get("asset_status") == "SOLD":
            ctx.pool.remove(asset_id)
        return a, None
    if a.status not in (200, 201):
        return a, None
    rid = a.body.get("reservation_id")
    expires_at = parse_ts(a.body.get("expires_at"))
    created_at = parse_ts(a.body.get("created_at"))
    if not rid or expires_at is None or created_at is None:
        return a, None
    if a.status == 200 and op.attempts and created_at < op.attempts[0].t0:
        # The buyer's own live hold, made before this request: another flow
        # acts on that reservation, and two flows on one would each judge
        # the other's changes as unexplained.
        return a, None
    with ctx.lock:
        ctx.recently_held.append(asset_id)
    return a, Res(rid, asset_id, buyer, created_at, expires_at)


def res_of(asset_id, body):
    """The Res of a reservation read or answered as `body`, or None."""
    rid = body.get("reservation_id")
    created_at = parse_ts(body.get("created_at"))
    expires_at = parse_ts(body.get("expires_at"))
    if not rid or created_at is None or expires_at is None:
        return None
    return Res(rid, asset_id, body.get("buyer_id"), created_at, expires_at)


def offer(ctx, http_, rng, asset_id):
    """An admin's offer of the asset to a fresh named buyer, lasting a few
    seconds; the Res of the offer's hold when it was made."""
    buyer = f"offeree-{uuid.uuid4().hex[:10]}"
    payload = {"buyer_id": buyer, "client": "-",
               "expires_at": iso(time.time() + rng.uniform(2.0, HOLD_SECONDS_MAX))}
    op = ctx.new_op("offer", "POST", f"/v1/assets/{asset_id}/offers", payload, True,
                    {"asset_id": asset_id, "buyer_id": buyer, "intent": "offer"})
    a = perform(ctx.rec, http_, op, ctx.ports, rng=rng)
    maybe_duplicate(ctx, http_, rng, op, a)
    if a is None or a.status != 201 or not isinstance(a.body, dict):
        return None
    return res_of(asset_id, a.body)


def join(ctx, http_, rng, asset_id):
    """A fresh buyer queues for the asset; its id when it is queued."""
    waiter = f"waiter-{uuid.uuid4().hex[:10]}"
    op = ctx.new_op("join", "POST", f"/v1/assets/{asset_id}/waitlist", {"buyer_id": waiter},
                    True, {"asset_id": asset_id, "buyer_id": waiter, "intent": "join"})
    a = perform(ctx.rec, http_, op, ctx.ports, rng=rng)
    maybe_duplicate(ctx, http_, rng, op, a)
    return waiter if a is not None and a.status in (200, 201) else None


def leave(ctx, http_, rng, asset_id, waiter):
    """The waiter leaves the queue: 204, or 404 when a hand-off, a sale or a
    withdrawal took it off first."""
    op = ctx.new_op("leave", "DELETE", f"/v1/assets/{asset_id}/waitlist/{waiter}", None, False,
                    {"asset_id": asset_id, "buyer_id": waiter, "intent": "leave"})
    return perform(ctx.rec, http_, op, ctx.ports, rng=rng)


def claim(ctx, http_, rng, asset_id, waiter):
    """The waiter's live hold of the asset, as its shop would find it after
    the hand-off's webhook: the Res, or None."""
    query = urllib.parse.urlencode({"buyer_id": waiter, "asset_id": asset_id, "status": "HELD"})
    op = ctx.new_op("claim", "GET", f"/v1/reservations?{query}", None, False,
                    {"asset_id": asset_id, "buyer_id": waiter, "intent": "claim"})
    a = perform(ctx.rec, http_, op, ctx.ports, rng=rng)
    if a is None or a.status != 200 or not isinstance(a.body, dict):
        return None
    items = a.body.get("items") or []
    return res_of(asset_id, items[0]) if items else None


def commit(ctx, http_, rng, res, intent, pref=None):
    pref = pref or new_pref()
    op = ctx.new_op("commit", "POST", f"/v1/reservations/{res.rid}/commit",
                    {"payment_reference": pref}, True, res.meta(intent, pref=pref))
    ctx.ledger.note(pref, res.rid)
    a = perform(ctx.rec, http_, op, ctx.ports, rng=rng)
    maybe_duplicate(ctx, http_, rng, op, a)
    if a is not None and a.status == 200:
        # Sold: take it out of the pool and put a fresh asset in.
        if ctx.pool.remove(res.asset_id):
            create_asset(ctx, http_, rng, gated=rng.random() < P_GATED_ASSET)
    return a


def commit_all(ctx, rng, targets, pref, intent):
    """One payment reference sent for several reservations at the same
    moment, each from its own connection: [(res, answer or None)]."""
    out = [None] * len(targets)
    start = threading.Barrier(len(targets))

    def one(i, res, seed):
        http_ = Http()
        try:
            start.wait(timeout=5)
        except threading.BrokenBarrierError:
            pass
        out[i] = commit(ctx, http_, random.Random(seed), res, intent, pref=pref)
        for port in list(http_.conns):
            http_.drop(port)

    threads = [threading.Thread(target=one, args=(i, res, rng.random()), daemon=True)
               for i, res in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return list(zip(targets, out))


def lookup_payment(ctx, http_, rng):
    """GET /v1/payments/{ref}: a reference sent before (its fate, or none
    yet), or now and then one no commit ever carried."""
    pref = ctx.ledger.pick(rng)
    intent = "payment-lookup"
    if pref is None or rng.random() < 0.1:
        pref, intent = f"pay-never-{uuid.uuid4().hex[:16]}", "payment-lookup-unsent"
    op = ctx.new_op("payment", "GET", f"/v1/payments/{pref}", None, False,
                    {"pref": pref, "intent": intent})
    return perform(ctx.rec, http_, op, ctx.ports, rng=rng)


def release(ctx, http_, rng, res, intent):
    op = ctx.new_op("release", "POST", f"/v1/reservations/{res.rid}/release", {}, True,
                    res.meta(intent))
    a = perform(ctx.rec, http_, op, ctx.ports, rng=rng)
    maybe_duplicate(ctx, http_, rng, op, a)
    return a


def extend(ctx, http_, rng, res, intent, seconds=None):
    seconds = seconds or rng.randint(2, HOLD_SECONDS_MAX)
    op = ctx.new_op("extend", "POST", f"/v1/reservations/{res.rid}/extend",
                    {"hold_seconds": seconds}, True, res.meta(intent, seconds=seconds))
    a = perform(ctx.rec, http_, op, ctx.ports, rng=rng)
    maybe_duplicate(ctx, http_, rng, op, a)
    return a


def void(ctx, http_, rng, res, intent, refund=True, pref=None):
    # The default body gives the payment back too.
    payload = {} if refund and rng.random() < 0.5 else {"refund": refund}
    op = ctx.new_op("void", "POST", f"/v1/reservations/{res.rid}/void", payload, True,
                    res.meta(intent, refund=refund, pref=pref))
    a = perform(ctx.rec, http_, op, ctx.ports, rng=rng)
    maybe_duplicate(ctx, http_, rng, op, a)
    return a


def withdraw(ctx, http_, rng, asset_id, force):
    payload = {"force": True} if force else rng.choice([{}, None])
    op = ctx.new_op("withdraw", "POST", f"/v1/assets/{asset_id}/withdraw", payload, False,
                    {"asset_id": asset_id, "force": force,
                     "intent": "withdraw-force" if force else "withdraw"})
    return perform(ctx.rec, http_, op, ctx.ports, rng=rng)


def reinstate(ctx, http_, rng, asset_id, intent="reinstate"):
    op = ctx.new_op("reinstate", "POST", f"/v1/assets/{asset_id}/reinstate",
                    rng.choice([{}, None]), False, {"asset_id": asset_id, "intent": intent})
    return perform(ctx.rec, http_, op, ctx.ports, rng=rng)


def set_gate(ctx, http_, rng, asset_id, at, intent):
    """PATCH available_from: `at` seconds since the epoch, or None to open now."""
    value = iso(at) if at is not None else None
    op = ctx.new_op("gate", "PATCH", f"/v1/assets/{asset_id}", {"available_from": value}, False,
                    {"asset_id": asset_id, "available_from": value, "intent": intent})
    return perform(ctx.rec, http_, op, ctx.ports, rng=rng)


def browse(ctx, http_, rng):
    """GET /v1/reservations by asset, buyer and/or status, up to three pages."""
    filters = {}
    u = rng.random()
    if u < 0.45:
        asset_id = ctx.pool.pick(rng)
        if asset_id:
            filters["asset_id"] = asset_id
    elif u < 0.8:
        filters["buyer_id"] = f"buyer-{rng.randrange(500):03d}"
    if rng.random() < 0.35:
        filters["status"] = rng.choice(["HELD", "COMMITTED", "RELEASED", "EXPIRED", "VOIDED"])
    limit = rng.randint(1, 20)
    intent = "list-" + "-".join(sorted(filters)) if filters else "list-all"
    cursor, prev_last = None, None
    for page in range(3):
        query = dict(filters, limit=limit)
        if cursor:
            query["cursor"] = cursor
        op = ctx.new_op("list", "GET", "/v1/reservations?" + urllib.parse.urlencode(query),
                        None, False, {"filters": filters, "limit": limit,
                                      "prev_last": prev_last, "page": page, "intent": intent})
        a = perform(ctx.rec, http_, op, ctx.ports, rng=rng)
        if a is None or a.status != 200 or not isinstance(a.body, dict):
            return
        items = a.body.get("items") or []
        cursor = a.body.get("next_cursor")
        if not cursor or not items:
            return
        prev_last = items[-1].get("reservation_id")


def client(ctx: Context, tid: int):
    rng = random.Random(ctx.seed * 1000 + tid)
    http_ = Http()
    home = ctx.ports[tid % len(ctx.ports)]
    # Late actions wait here, so that the thread keeps working meanwhile.
    later: list = []
    seq = 0

    def defer(at, fn, *fargs):
        nonlocal seq
        seq += 1
        if at <= ctx.deadline:
            heapq.heappush(later, (at, seq, functools.partial(fn, *fargs)))

    # Every flow below gives up on a reservation once one of its requests goes
    # unanswered (retries exhausted): what it did is settled at the end, and
    # nothing else may act on that reservation meanwhile.

    def payment(res, intent):
        """The reference a commit carries, and its intent: mostly a fresh
        one; sometimes one already sent for another reservation."""
        if rng.random() < P_REUSE:
            pref = ctx.ledger.pick(rng, res.rid)
            if pref is not None:
                return "reuse-" + intent, pref
        return intent, None

    def decide(res):
        r = rng.random()
        if r < 0.38:
            c = commit(ctx, http_, rng, res, *payment(res, "commit-now"))
            if c is not None and c.status == 200:
                after_sale(res, c.op.meta["pref"])
        elif r < 0.56:
            # Late commit: the payment arrives after the hold lapsed.
            defer(res.expires_at + rng.uniform(0.2, 1.5), late_commit, res)
        elif r < 0.78:
            rl = release(ctx, http_, rng, res, "release-now")
            if rl is not None and rl.status == 200:
                s = rng.random()
                if s < 0.25:  # the payment arrives after the release: refunded
                    commit(ctx, http_, rng, res, *payment(res, "after-release"))
                elif s < 0.35:
                    release(ctx, http_, rng, res, "release-again")
                elif s < 0.41:
                    extend(ctx, http_, rng, res, "extend-released")
                elif s < 0.45:
                    void(ctx, http_, rng, res, "void-released")
        elif r < 0.86:
            # Abandoned, then released too late.
            defer(res.expires_at + rng.uniform(0.2, 1.0), release, ctx, http_, rng, res,
                  "late-release")
        elif r < 0.88:
            # Abandoned, then extended too late.
            defer(res.expires_at + rng.uniform(0.2, 1.0), extend, ctx, http_, rng, res,
                  "late-extend")
        # else: abandoned; the janitor or the next hold expires it.

    def late_commit(res):
        c = commit(ctx, http_, rng, res, *payment(res, "late"))
        if c is not None and c.status == 200 and rng.random() < P_VOID_SALE:
            void_sale(res, c.op.meta["pref"])

    def after_sale(res, pref):
        s = rng.random()
        follow = True
        if s < 0.08:  # a second payment for a sold reservation: refunded
            follow = commit(ctx, http_, rng, res, "second-payment")
        elif s < 0.13:  # the same payment under a new key: 200, nothing changes
            follow = commit(ctx, http_, rng, res, "same-payment", pref=pref)
        elif s < 0.17:  # release after the sale: 409
            follow = release(ctx, http_, rng, res, "release-sold")
        elif s < 0.20:  # extend after the sale: 409
            follow = extend(ctx, http_, rng, res, "extend-sold")
        if follow is not None and rng.random() < P_VOID_SALE:
            void_sale(res, pref)

    def void_sale(res, pref):
        v = void(ctx, http_, rng, res, "void", refund=rng.random() < 0.7, pref=pref)
        if v is None or v.status != 200:
            return
        ctx.pool.add(res.asset_id)  # on sale again
        s = rng.random()
        if s < 0.2:
            void(ctx, http_, rng, res, "void-again", refund=rng.random() < 0.5, pref=pref)
        elif s < 0.45:  # the voided payment again, under a new key: nothing new
            commit(ctx, http_, rng, res, "commit-after-void", pref=pref)
        elif s < 0.6:  # another payment for the voided sale: refunded
            commit(ctx, http_, rng, res, "commit-after-void-new")
        elif s < 0.85:  # the voided payment for another hold of the asset: still used
            _, res2 = hold(ctx, http_, rng, res.asset_id, f"buyer-{rng.randrange(500):03d}",
                           intent="hold-after-void")
            if res2 is None:
                return
            c = commit(ctx, http_, rng, res2, "reuse-voided-payment", pref=pref)
            if c is None:
                return
            if rng.random() < 0.5:
                release(ctx, http_, rng, res2, "release-now")
            else:
                commit(ctx, http_, rng, res2, "commit-now")

    def fanout():
        """Holds on two to four assets (some then released), and one payment
        reference (mostly fresh, sometimes one already sent) sent for all of
        them at the same moment, at once or once the first hold lapsed: it
        buys one, or is refunded once, and every other answer is
        PAYMENT_REFERENCE_USED. A live hold the payment did not buy is then
        decided anew (paid with a payment of its own, released, left)."""
        mine, want = [], rng.randint(2, 4)
        for _ in range(3 * want):
            if len(mine) == want:
                break
            asset_id = ctx.pool.pick(rng)
            if asset_id is None or any(r.asset_id == asset_id for r in mine):
                continue
            _, res = hold(ctx, http_, rng, asset_id, f"buyer-{rng.randrange(500):03d}",
                          intent="hold-fanout")
            if res is not None:
                mine.append(res)
        if not mine:
            return
        targets = []
        for res in mine:
            if len(mine) > 1 and rng.random() < 0.3:
                if release(ctx, http_, rng, res, "release-before-fanout") is None:
                    continue
            targets.append(res)
        if not targets:
            return
        pref = (ctx.ledger.pick(rng) if rng.random() < 0.2 else None) or new_pref()
        if rng.random() < 0.25:
            # Late: the first hold to lapse has lapsed, the others may not have.
            at = min(r.expires_at for r in targets) + rng.uniform(0.2, 1.0)
            defer(at, pay_all, targets, pref)
        else:
            pay_all(targets, pref)

    def pay_all(targets, pref):
        for res, a in commit_all(ctx, rng, targets, pref, "fanout"):
            if a is None or not isinstance(a.body, dict):
                continue
            if a.status == 200:
                if rng.random() < P_VOID_SALE:
                    void_sale(res, a.op.meta["pref"])
            elif a.code == "PAYMENT_REFERENCE_USED" and \
                    (a.body.get("reservation") or {}).get("status") == "HELD":
                decide(res)

    def extend_step(res, k, kmax):
        e = extend(ctx, http_, rng, res, "extend")
        if e is None:
            return
        if e.status == 200 and isinstance(e.body, dict):
            res.expires_at = parse_ts(e.body.get("expires_at")) or res.expires_at
            if k < kmax:
                # Sometimes just after the hold lapsed: 409 RESERVATION_NOT_ACTIVE.
                wait = rng.uniform(0, min(3.0, max(0.0, res.expires_at - time.time()) + 0.3))
                defer(time.time() + wait, extend_step, res, k + 1, kmax)
                return
        decide(res)

    def admin_withdraw():
        asset_id = ctx.pool.pick(rng)
        if asset_id is None:
            return
        w = withdraw(ctx, http_, rng, asset_id, force=rng.random() < 0.4)
        if w is not None and w.status == 200:
            defer(time.time() + rng.uniform(0.3, 3.0), reinstate, ctx, http_, rng, asset_id)

    def queue_up():
        """A fresh buyer queues for an asset held a moment ago; later it may
        leave, or look for the hold a hand-off gave it and act on it."""
        with ctx.lock:
            held = list(ctx.recently_held)
        if not held:
            return
        asset_id = rng.choice(held)
        waiter = join(ctx, http_, rng, asset_id)
        if waiter is None:
            return
        if rng.random() < P_LEAVE:
            defer(time.time() + rng.uniform(0.1, 3.0), leave, ctx, http_, rng, asset_id, waiter)
        elif rng.random() < P_CLAIM:
            defer(time.time() + rng.uniform(1.0, 2 * HOLD_SECONDS_MAX), look_for_hand_off,
                  asset_id, waiter, 3)

    def look_for_hand_off(asset_id, waiter, tries):
        res = claim(ctx, http_, rng, asset_id, waiter)
        if res is not None:
            decide(res)
        elif tries > 1:
            defer(time.time() + rng.uniform(1.0, 3.0), look_for_hand_off, asset_id, waiter,
                  tries - 1)

    def admin_offer():
        asset_id = ctx.pool.pick(rng)
        if asset_id is None:
            return
        res = offer(ctx, http_, rng, asset_id)
        if res is not None:
            decide(res)

    def admin_gate():
        asset_id = ctx.pool.pick(rng)
        if asset_id is None:
            return
        if rng.random() < 0.2:  # a sale opening in the past: nothing is gated
            set_gate(ctx, http_, rng, asset_id, time.time() - rng.uniform(1, 30), "gate-past")
            return
        at = time.time() + rng.uniform(0.5, 3.0)
        g = set_gate(ctx, http_, rng, asset_id, at, "gate")
        if g is not None and g.status == 200 and rng.random() < 0.3:
            # The operator opens the sale early.
            defer(time.time() + rng.uniform(0.1, max(0.1, at - time.time())), set_gate, ctx,
                  http_, rng, asset_id, None, "gate-open")

    while True:
        now = time.time()
        if later and later[0][0] <= min(now, ctx.deadline):
            heapq.heappop(later)[2]()
            continue
        if now >= ctx.deadline:
            break
        x = rng.random()
        if x < RATE_WITHDRAW:
            admin_withdraw()
            continue
        x -= RATE_WITHDRAW
        if x < RATE_GATE:
            admin_gate()
            continue
        x -= RATE_GATE
        if x < RATE_LIST:
            browse(ctx, http_, rng)
            continue
        x -= RATE_LIST
        if x < RATE_REINSTATE:
            asset_id = ctx.pool.pick(rng)
            if asset_id:
                reinstate(ctx, http_, rng, asset_id, "reinstate-any")
            continue
        x -= RATE_REINSTATE
        if x < RATE_FANOUT:
            fanout()
            continue
        x -= RATE_FANOUT
        if x < RATE_LOOKUP:
            lookup_payment(ctx, http_, rng)
            continue
        x -= RATE_LOOKUP
        if x < RATE_JOIN:
            queue_up()
            continue
        x -= RATE_JOIN
        if x < RATE_OFFER:
            admin_offer()
            continue
        asset_id = ctx.pool.pick(rng)
        if asset_id is None:
            create_asset(ctx, http_, rng)
            continue
        a, res = hold(ctx, http_, rng, asset_id, f"buyer-{rng.randrange(500):03d}",
                      first_port=home)
        if res is None:
            if a is not None and a.status == 409:
                time.sleep(rng.uniform(0, 0.05))
            continue
        if rng.random() < P_VOID_HELD:
            if void(ctx, http_, rng, res, "void-held") is None:
                continue
        if rng.random() < P_EXTEND:
            wait = rng.uniform(0, min(3.0, max(0.0, res.expires_at - time.time()) + 0.3))
            defer(time.time() + wait, extend_step, res, 1, rng.randint(1, 3))
        else:
            decide(res)
    for port in list(http_.conns):
        http_.drop(port)

