"""What the checks judge, gathered once after the load: the client's record
of every request and what its answers told, the audit, what the service
answers now (every reservation, the assets of sales, listings, payments,
timelines), and the database read directly. The checks themselves do no I/O."""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import json
import math
import random
import threading
import time
import urllib.parse
import uuid

from .client import Http, Op, Recorder, send
from .common import BACKOFF_BASE, BACKOFF_CAP, RESOLVE_ATTEMPTS, log, parse_ts
from .contract import Document

TIMELINE_SAMPLE = 40        # assets whose whole timeline is read back, page by page
PAYMENT_SAMPLE = 1000       # references sent once whose fate is read back (besides the others)


class Reader:
    """GETs after the load, retrying connection errors and 503; every attempt
    is kept, for the checks on answers."""

    def __init__(self, ports):
        self.ports = ports
        self.rec = Recorder()
        self.ops: list[Op] = []

    def get_one(self, http_, path, stop_at):
        """GET path; the last attempt."""
        rng = random.Random()
        op = Op(-1, "get", "GET", path, None, None, {})
        with self.rec.lock:
            self.ops.append(op)
        for n in range(RESOLVE_ATTEMPTS):
            a = send(self.rec, http_, op, rng.choice(self.ports), "verify")
            if not a.retryable or time.time() > stop_at:
                return a
            time.sleep(min(BACKOFF_CAP, BACKOFF_BASE * 2 ** n))
        return op.attempts[-1]

    def get_all(self, paths, workers=16):
        """GETs every path in parallel: {path: last attempt}."""
        local = threading.local()
        stop_at = time.time() + 120

        def one(path):
            if not hasattr(local, "http"):
                local.http = Http()
            return path, self.get_one(local.http, path, stop_at)

        with concurrent.futures.ThreadPoolExecutor(workers) as ex:
            return dict(ex.map(one, paths))

    def pages(self, paths_for, queries, workers=8):
        """Every page of each query, following next_cursor until null:
        [(query, items or None, error, pages)]. paths_for(query, cursor)
        gives the path of a page."""
        local = threading.local()
        stop_at = time.time() + 120

        def one(query):
            if not hasattr(local, "http"):
                local.http = Http()
            items, cursor = [], None
            for n in range(5000):
                path = paths_for(query, cursor)
                a = self.get_one(local.http, path, stop_at)
                if a.status != 200 or not isinstance(a.body, dict):
                    return query, None, f"GET {path} answered {a.label()}", n + 1
                items.extend(a.body.get("items") or [])
                cursor = a.body.get("next_cursor")
                if not cursor:
                    return query, items, None, n + 1
            return query, None, "more than 5000 pages", 5000

        with concurrent.futures.ThreadPoolExecutor(workers) as ex:
            return list(ex.map(one, queries))


def span(op):
    """From the first attempt's start to the last attempt's end."""
    return op.attempts[0].t0, max(a.t1 for a in op.attempts)


class Evidence:
    def __init__(self, cluster, rec, ctx, pool, seed, problems):
        self.cluster = cluster
        self.backend = cluster.backend
        self.ops = rec.ops
        self.attempts = [a for op in rec.ops for a in op.attempts]
        self.intents = ctx.intents
        self.assets_created = pool.created
        self.seed = seed
        self.problems = problems            # the harness's own troubles
        self.document = Document()
        self.reader = Reader(cluster.ports)
        self.audit = (None, None, "not run")
        self.state = {}
        self.unread = {}
        self.assets = {}
        self.db = {}
        self.listings = []
        self.payment_gets = {}
        self.unsent_refs = []
        self.timelines = []
        self.unanswered_after_load = 0     # requests the resolve step had to retry

    # ---- gathering (network and database)
    def gather(self):
        self.audit = self.cluster.audit()
        rids = sorted(set(self.held) | {op.meta["rid"] for op in self.ops if "rid" in op.meta})
        log(f"reading back {len(rids)} reservations")
        got = self.reader.get_all([f"/v1/reservations/{rid}" for rid in rids])
        for rid in rids:
            a = got[f"/v1/reservations/{rid}"]
            if a.status == 200 and isinstance(a.body, dict):
                self.state[rid] = a.body
            else:
                self.unread[rid] = a
        aids = sorted({s["asset_id"] for rid, s in self.state.items()
                       if rid in self.committed or rid in self.voided})
        self.assets = {path.rsplit("/", 1)[1]: a for path, a in
                       self.reader.get_all([f"/v1/assets/{aid}" for aid in aids]).items()}
        log("reading the database")
        self.db = self.read_database()
        log("listing reservations, payments and timelines")
        self.listings = self.read_listings()
        self.unsent_refs = [f"pay-never-{uuid.uuid4().hex[:16]}" for _ in range(10)]
        refs = self.refs_to_look_up() + self.unsent_refs
        self.payment_gets = {path.rsplit("/", 1)[1]: a for path, a in
                             self.reader.get_all([f"/v1/payments/{p}" for p in refs]).items()}
        self.timelines = self.read_timelines()

    def refs_to_look_up(self):
        """The references whose fate is read back at the end: every one sent
        for more than one reservation or looked up during the load, and a
        sample of the others."""
        rng = random.Random(self.seed + 2)
        looked_up = {op.meta["pref"] for op in self.ops_of("payment")}
        every, others = [], []
        for pref, ops in sorted(self.commits_by_pref.items()):
            spread = len({op.meta["rid"] for op in ops}) > 1
            (every if spread or pref in looked_up else others).append(pref)
        return every + rng.sample(others, min(PAYMENT_SAMPLE, len(others)))

    def read_database(self):
        c = self.cluster
        return {
            "reservations": c.select(
                "reservations",
                ["id", "status", "payment_reference", "payment_client", "asset_id", "buyer_id",
                 "created_at", "expires_at", "committed_at", "released_at", "voided_at", "via"],
                ts=("created_at", "expires_at", "committed_at", "released_at", "voided_at")),
            "refunds": c.select(
                "refunds", ["id", "reservation_id", "payment_reference", "payment_client", "reason",
                            "created_at"], ts=("created_at",)),
            "payments": c.select(
                "payments", ["client", "reference", "reservation_id", "refund_id", "created_at"],
                ts=("created_at",)),
            "assets": c.select("assets", ["id", "status", "current_reservation_id"]),
            "events": [dict(e, sequence=int(e["sequence"])) for e in c.select(
                "events", ["asset_id", "sequence", "type", "actor", "created_at"],
                ts=("created_at",))],
            "queue_events": self.read_queue_events(),
        }

    def read_queue_events(self):
        """The holds, skips and clearings of every asset someone queued for,
        with their data: what the queue checks replay in each asset's order."""
        queued = sorted({op.meta["asset_id"] for op in self.ops_of("join")})
        out = []
        for i in range(0, len(queued), 500):
            ids = ", ".join("'" + a.replace("'", "''") + "'" for a in queued[i:i + 500])
            out += self.cluster.select(
                "events", ["asset_id", "sequence", "type", "via", "data"],
                where=f"WHERE asset_id IN ({ids}) AND type IN "
                      "('reservation.held', 'waitlist.skipped', 'waitlist.cleared')")
        for e in out:
            e["sequence"] = int(e["sequence"])
            e["data"] = json.loads(e["data"])
            e["via"] = e["via"] or None
        return sorted(out, key=lambda e: (e["asset_id"], e["sequence"]))

    def read_listings(self):
        """GET /v1/reservations by status, asset and buyer, every page."""
        rng = random.Random(self.seed)
        with_res = sorted(self.res_by_asset)
        buyers = sorted({r["buyer_id"] for r in self.res_db.values()})
        queries = [{"status": "VOIDED", "limit": 7}, {"status": "COMMITTED", "limit": 500},
                   {"status": "RELEASED", "limit": 250}]
        queries += [{"asset_id": aid, "limit": 3}
                    for aid in rng.sample(with_res, min(40, len(with_res)))]
        queries += [{"buyer_id": b, "limit": 25} for b in rng.sample(buyers, min(12, len(buyers)))]
        return self.reader.pages(
            lambda q, cursor: "/v1/reservations?" + urllib.parse.urlencode(
                dict(q, cursor=cursor) if cursor else q), queries)

    def read_timelines(self):
        """GET /v1/assets/{id}/events of some assets, a few events a page:
        half of them the longest timelines with an event naming its actor (a
        void, a withdrawal), the others at random."""
        rng = random.Random(self.seed + 1)
        count = collections.Counter(e["asset_id"] for e in self.db["events"])
        acted = {e["asset_id"] for e in self.db["events"] if e["actor"] is not None}
        sample = sorted(acted, key=lambda aid: (-count[aid], aid))[:TIMELINE_SAMPLE // 2]
        others = sorted(set(count) - set(sample))
        sample += rng.sample(others, min(TIMELINE_SAMPLE - len(sample), len(others)))
        queries = [(aid, rng.randint(2, 9)) for aid in sorted(sample)]
        return self.reader.pages(
            lambda q, cursor: f"/v1/assets/{q[0]}/events?" + urllib.parse.urlencode(
                {"limit": q[1], **({"cursor": cursor} if cursor else {})}), queries)

    # ---- what the clients were told
    def ops_of(self, kind):
        return [op for op in self.ops if op.kind == kind]

    @functools.cached_property
    def held(self):
        """rid -> the hold (or offer) op acknowledged with it."""
        out = {}
        for op in self.ops_of("hold") + self.ops_of("offer"):
            for a in op.attempts:
                if a.good and isinstance(a.body, dict) and a.body.get("reservation_id"):
                    # The op that made it (201, or its replays), not a second
                    # tab's hold answered 200 with it.
                    rid = a.body["reservation_id"]
                    if a.status == 201 or rid not in out:
                        out[rid] = op
        return out

    @functools.cached_property
    def hold_keys_ok(self):
        return {op.key for op in self.held.values()}

    @functools.cached_property
    def sales(self):
        """rid -> {pref: [commit ops answered 200 with it]}."""
        out = collections.defaultdict(lambda: collections.defaultdict(list))
        for op in self.ops_of("commit"):
            if any(a.good and a.status == 200 for a in op.attempts):
                out[op.meta["rid"]][op.meta["pref"]].append(op)
        return out

    @functools.cached_property
    def committed(self):
        """rid -> the payment an acknowledged commit sold it with (the first)."""
        return {rid: next(iter(prefs)) for rid, prefs in self.sales.items()}

    @functools.cached_property
    def released(self):
        """rid -> the first release op answered 200."""
        out = {}
        for op in self.ops_of("release"):
            if any(a.good and a.status == 200 for a in op.attempts):
                out.setdefault(op.meta["rid"], op)
        return out

    @functools.cached_property
    def voided(self):
        """rid -> the first void op answered 200: the one that acted."""
        out = {}
        for op in self.ops_of("void"):
            if any(a.good for a in op.attempts):
                out.setdefault(op.meta["rid"], op)
        return out

    @functools.cached_property
    def extended(self):
        """rid -> [(extend op answered 200, its expires_at)], in order sent."""
        out = collections.defaultdict(list)
        for op in self.ops_of("extend"):
            goods = [a for a in op.attempts if a.good]
            if goods and isinstance(goods[0].body, dict):
                out[op.meta["rid"]].append((op, parse_ts(goods[0].body.get("expires_at"))))
        return out

    @functools.cached_property
    def refunds_told(self):
        """(rid, pref) -> {refund_id: reason} carried by commit and void answers."""
        out = collections.defaultdict(dict)
        for op in self.ops:
            for a in op.attempts:
                if not a.good:
                    continue
                if op.kind == "commit" and a.refund is not None:
                    out[(op.meta["rid"], op.meta["pref"])][a.refund.get("refund_id")] = \
                        a.refund.get("reason")
                elif op.kind == "void" and isinstance(a.body, dict):
                    for rf in a.body.get("refunds") or []:
                        out[(op.meta["rid"], rf.get("payment_reference"))][rf.get("refund_id")] = \
                            rf.get("reason")
        return out

    @functools.cached_property
    def commits_by_pref(self):
        """pref -> every commit op that carried it."""
        out = collections.defaultdict(list)
        for op in self.ops_of("commit"):
            out[op.meta["pref"]].append(op)
        return out

    @functools.cached_property
    def assets_ops(self):
        """asset_id -> kind -> ops about that asset."""
        out = collections.defaultdict(lambda: collections.defaultdict(list))
        for op in self.ops:
            if "asset_id" in op.meta:
                out[op.meta["asset_id"]][op.kind].append(op)
        return out

    @functools.cached_property
    def gate_values(self):
        """asset_id -> every sale opening a client set (epoch seconds)."""
        out = collections.defaultdict(list)
        for op in self.ops:
            if op.kind in ("gate", "create_asset") and op.meta.get("available_from"):
                out[op.meta["asset_id"]].append(parse_ts(op.meta["available_from"]))
        return out

    def expiry(self, op):
        """The hold's last expiry (extensions included), else the one the
        client knew when it sent op."""
        s = self.state.get(op.meta["rid"])
        return parse_ts(s.get("expires_at")) if s else op.meta["expires_at"]

    # ---- the database, indexed
    @functools.cached_property
    def res_db(self):
        return {r["id"]: r for r in self.db["reservations"]}

    @functools.cached_property
    def res_by_asset(self):
        out = collections.defaultdict(list)
        for r in self.db["reservations"]:
            out[r["asset_id"]].append(r)
        return out

    @functools.cached_property
    def refunds_db(self):
        """(rid, pref) -> refund rows."""
        out = collections.defaultdict(list)
        for rf in self.db["refunds"]:
            out[(rf["reservation_id"], rf["payment_reference"])].append(rf)
        return out

    @functools.cached_property
    def refund_by_id(self):
        return {rf["id"]: rf for rf in self.db["refunds"]}

    @functools.cached_property
    def fates_db(self):
        """(scope, pref) -> the payments table's row: its recorded fate."""
        return {(p["client"], p["reference"]): p for p in self.db["payments"]}

    @functools.cached_property
    def fate_by_ref(self):
        """pref -> its payments rows (one scope in open mode: at most one)."""
        out = collections.defaultdict(list)
        for p in self.db["payments"]:
            out[p["reference"]].append(p)
        return out

    def fate(self, pref):
        """The recorded fate of a reference this run's client sent (open
        mode: one scope): its payments row, or None."""
        rows = self.fate_by_ref.get(pref, [])
        return rows[0] if len(rows) == 1 else None

    def own_void_refund(self, rid, pref):
        """The SALE_VOIDED refund of a voided sale's own payment, or None."""
        r = self.res_db.get(rid)
        if r is None or r["status"] != "VOIDED" or r["payment_reference"] != pref:
            return None
        return next((rf for rf in self.refunds_db.get((rid, pref), [])
                     if rf["reason"] == "SALE_VOIDED"), None)

    @functools.cached_property
    def withdrawals_db(self):
        """asset_id -> instants of its asset.withdrawn events."""
        out = collections.defaultdict(list)
        for ev in self.db["events"]:
            if ev["type"] == "asset.withdrawn":
                out[ev["asset_id"]].append(ev["created_at"])
        return out

    @functools.cached_property
    def events_by_asset(self):
        out = collections.defaultdict(list)
        for ev in self.db["events"]:
            out[ev["asset_id"]].append(ev)
        for evs in out.values():
            evs.sort(key=lambda e: e["sequence"])
        return out

    @functools.cached_property
    def handed(self):
        """The reservations a hand-off made (via the waiting list): rid -> row."""
        return {rid: r for rid, r in self.res_db.items() if r["via"] == "waitlist"}

    @functools.cached_property
    def joins(self):
        """(asset_id, waiter) -> (first send, first acknowledgement or None) of
        its join: each waiter is a fresh buyer that queues once."""
        out = {}
        for op in self.ops_of("join"):
            acked = [a.t1 for a in op.attempts if a.status in (200, 201)]
            out[(op.meta["asset_id"], op.meta["buyer_id"])] = (
                op.attempts[0].t0, min(acked) if acked else None)
        return out

    @functools.cached_property
    def leaves(self):
        """(asset_id, waiter) -> when it first asked to leave."""
        out = {}
        for op in self.ops_of("leave"):
            key = (op.meta["asset_id"], op.meta["buyer_id"])
            out[key] = min(out.get(key, math.inf), op.attempts[0].t0)
        return out

