#!/usr/bin/env python3
"""A bounded chaos run against holdfast, on PostgreSQL and/or SQLite.

    python3 ci/chaos.py [--backend postgres|sqlite|both] [--seconds N] [--bin PATH]
                        [--late-commit mixed|refund|accept-if-free]

PostgreSQL: a fresh database, three instances on it (janitors every second),
~200 seeded assets and two dozen client threads holding, extending holds,
committing (at once and late, past the hold's expiry), releasing, voiding
sales, withdrawing and reinstating assets, gating sales with available_from,
listing reservations, and blindly retrying with the same Idempotency-Key and
body after any connection error, timeout or 503 (on another instance). Mid-run
one instance is killed with SIGKILL and started again a few seconds later,
and later PostgreSQL itself is restarted. With --late-commit mixed (the
default) the third instance runs HOLDFAST_LATE_COMMIT=accept-if-free, the
others refund late payments.

SQLite: one instance on a file, a dozen client threads, the instance killed
with SIGKILL mid-run and started again on the same file (with mixed: it
refunds late payments before the kill and accepts them if free after).

Then, with every instance answering again: requests left without an answer
are retried with their key until they get one, `holdfast audit --json` must
exit 0, and the client's own record is checked against the service and the
database: acknowledged writes are all there (holds, commits, releases,
extensions, voids), a retried request never acted twice, no 5xx other than
503, one refund per refused or voided payment, late commits judged by the mode
of the instances that served them, no hold granted while its asset was
withdrawn or before its sale opened (as far as the order of acknowledged
answers shows), and listings agree with the database. Any violation makes
the exit status 1. Python standard library only.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import datetime
import functools
import heapq
import http.client
import json
import os
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOST = "127.0.0.1"
PG_HOST = "127.0.0.1"
PG_PORT = 5432
PG_USER = "postgres"

HTTP_TIMEOUT = 8.0          # seconds per request (the service bounds DB work at 3 s)
MAX_ATTEMPTS = 10           # per request during the load
RESOLVE_ATTEMPTS = 25       # per request left without an answer, after the load
BACKOFF_BASE = 0.1
BACKOFF_CAP = 1.0
EXPIRY_MARGIN = 0.5         # seconds of slack when judging timing against expires_at
# Some attempts give up almost at once, while the service is still working on
# them: the answer is lost whether or not the change committed, and the retry
# must replay (or wait for the running duplicate), never act again.
IMPATIENT_SHARE = 0.04
IMPATIENT_TIMEOUT = (0.002, 0.08)

# The hold bounds of the run's instances: short holds, and a cap on a hold's
# whole life (extensions included) that extensions reach within seconds.
HOLD_SECONDS_MAX = 8
HOLD_MAX_TOTAL_SECONDS = 12
LATE_MODES = ("refund", "accept-if-free")

# What a client thread does besides holding, per iteration of its loop.
RATE_WITHDRAW = 0.012       # an admin withdraws an asset (sometimes forced), reinstates it later
RATE_GATE = 0.006           # an admin moves an asset's sale opening (available_from)
RATE_LIST = 0.012           # someone lists reservations (by asset, buyer, status), page by page
RATE_REINSTATE = 0.002      # an admin reinstates any asset (mostly: nothing to do)
# After a hold, and after a sale.
P_EXTEND = 0.08             # a chain of one to three extensions before deciding
P_VOID_HELD = 0.012         # voiding a hold (not a sale): 409
P_VOID_SALE = 0.10          # voiding a sale, then what follows a void
P_GATED_ASSET = 0.08        # a replacement asset created with a sale opening a few seconds on

# Statuses the client treats as "no answer": retry with the same key and body.
RETRYABLE_CODES = {"IDEMPOTENCY_KEY_IN_USE", "RATE_LIMITED"}

# What each kind of request may legitimately answer (besides the retryable ones).
EXPECTED = {
    "create_asset": {(201, None), (409, "ASSET_EXISTS")},
    "hold": {(201, None), (200, None), (409, "ASSET_UNAVAILABLE"), (409, "SALE_NOT_OPEN")},
    "commit": {
        (200, None),
        (409, "HOLD_EXPIRED"),
        (409, "RESERVATION_NOT_ACTIVE"),
        (409, "ALREADY_COMMITTED"),
        # PAYMENT_REFERENCE_USED is left out: every payment reference here is
        # fresh, so it would be a bug, except where a voided sale's payment is
        # deliberately sent for another reservation (EXPECTED_BY_INTENT).
    },
    "release": {(200, None), (409, "RESERVATION_NOT_ACTIVE")},
    "extend": {(200, None), (409, "RESERVATION_NOT_ACTIVE"), (409, "HOLD_EXTENSION_LIMIT")},
    "void": {(200, None), (409, "RESERVATION_NOT_ACTIVE")},
    "withdraw": {(200, None), (409, "ASSET_HELD"), (409, "ASSET_SOLD")},
    "reinstate": {(200, None)},
    "gate": {(200, None)},
    "list": {(200, None)},
}
# Flows whose answer is known in advance, narrower than their kind's.
EXPECTED_BY_INTENT = {
    # A voided sale's payment keeps its one fate (it bought that sale): for
    # another reservation it is used, whatever that reservation's state.
    "reuse-voided-payment": {(409, "PAYMENT_REFERENCE_USED")},
    # A voided sale's own payment again: nothing new (the void's refund, if
    # it gave one); another payment for it is given back.
    "commit-after-void": {(409, "RESERVATION_NOT_ACTIVE")},
    "commit-after-void-new": {(409, "RESERVATION_NOT_ACTIVE")},
    # Only a sale can be voided; only a live hold extended.
    "void-held": {(409, "RESERVATION_NOT_ACTIVE")},
    "void-released": {(409, "RESERVATION_NOT_ACTIVE")},
    "extend-released": {(409, "RESERVATION_NOT_ACTIVE")},
    "extend-sold": {(409, "RESERVATION_NOT_ACTIVE")},
    # A voided sale voided again: 200, unchanged.
    "void-again": {(200, None)},
}
# The refund reasons a refused commit may carry, by its error_code (a voided
# sale's own payment, voided without refund, carries none).
REFUND_CODES = {
    "HOLD_EXPIRED": {"HOLD_EXPIRED"},
    "RESERVATION_NOT_ACTIVE": {"RESERVATION_RELEASED", "SALE_VOIDED"},
    "ALREADY_COMMITTED": {"ALREADY_COMMITTED"},
}
TS_EPS = 1e-3               # seconds: two renderings of one stored instant

_print_lock = threading.Lock()
_t_origin = time.time()


def log(msg: str) -> None:
    with _print_lock:
        print(f"[chaos +{time.time() - _t_origin:7.1f}s] {msg}", flush=True)


def parse_ts(text):
    if not text:
        return None
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc) \
        .isoformat(timespec="milliseconds").replace("+00:00", "Z")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------
# Everything that must be undone at exit, whatever happens.
# --------------------------------------------------------------------------


class Cleanup:
    def __init__(self):
        self.lock = threading.RLock()
        self.procs: list[subprocess.Popen] = []
        self.pg_databases: list[str] = []
        self.pg_touched = False
        self.done = False

    def add_proc(self, proc):
        with self.lock:
            self.procs.append(proc)

    def run(self):
        with self.lock:
            if self.done:
                return
            self.done = True
            for proc in self.procs:
                if proc.poll() is None:
                    try:
                        proc.kill()
                    except OSError:
                        pass
            for proc in self.procs:
                try:
                    proc.wait(timeout=10)
                except Exception:
                    pass
            if self.pg_touched and not pg_ready():
                log("PostgreSQL is not accepting connections; starting it")
                pg_ctl("start")
                for _ in range(60):
                    if pg_ready():
                        break
                    time.sleep(0.5)
            for db in self.pg_databases:
                try:
                    psql(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)', timeout=30)
                    log(f"dropped database {db}")
                except Exception as e:  # noqa: BLE001
                    log(f"could not drop database {db}: {e}")


CLEANUP = Cleanup()


# --------------------------------------------------------------------------
# PostgreSQL helpers
# --------------------------------------------------------------------------


def _pg_env():
    env = dict(os.environ)
    env["PGCONNECT_TIMEOUT"] = "5"
    env.pop("PGPASSWORD", None)
    return env


def psql(sql: str, db: str = "postgres", timeout: float = 60):
    r = subprocess.run(
        ["psql", "-X", "-q", "-h", PG_HOST, "-p", str(PG_PORT), "-U", PG_USER, "-d", db,
         "-v", "ON_ERROR_STOP=1", "-tA", "-F", "\t", "-c", sql],
        capture_output=True, text=True, timeout=timeout, env=_pg_env(),
    )
    if r.returncode != 0:
        raise RuntimeError(f"psql failed ({r.returncode}): {r.stderr.strip()}")
    return [line.split("\t") for line in r.stdout.splitlines() if line != ""]


def pg_ready() -> bool:
    try:
        r = subprocess.run(["pg_isready", "-q", "-h", PG_HOST, "-p", str(PG_PORT)],
                           timeout=10, env=_pg_env())
        return r.returncode == 0
    except Exception:  # noqa: BLE001
        return False


def pg_version() -> str:
    versions = sorted(os.listdir("/etc/postgresql"))
    for v in versions:
        if os.path.isdir(os.path.join("/etc/postgresql", v, "main")):
            return v
    raise RuntimeError("no PostgreSQL cluster 'main' under /etc/postgresql")


def pg_ctl(action: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", pg_version(), "main", action],
        capture_output=True, text=True, timeout=timeout,
    )


# --------------------------------------------------------------------------
# holdfast instances
# --------------------------------------------------------------------------


class Instance:
    def __init__(self, name, binary, db_url, workdir, late_commit="refund"):
        self.name = name
        self.binary = binary
        self.db_url = db_url
        self.port = free_port()
        self.log_path = os.path.join(workdir, f"{name}.log")
        self.proc = None
        self.starts = 0
        self.late_commit = late_commit
        # (start time, HOLDFAST_LATE_COMMIT) of each start: which mode served
        # a request sent at a given time.
        self.modes: list[tuple[float, str]] = []

    def mode_at(self, t: float) -> str:
        mode = self.modes[0][1] if self.modes else self.late_commit
        for start, m in self.modes:
            if start <= t:
                mode = m
        return mode

    def env(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HOLDFAST_")}
        env.update({
            "HOLDFAST_DATABASE_URL": self.db_url,
            "HOLDFAST_BIND": f"{HOST}:{self.port}",
            "HOLDFAST_JANITOR_INTERVAL_SECONDS": "1",
            "HOLDFAST_HOLD_SECONDS_MIN": "1",
            "HOLDFAST_HOLD_SECONDS": "5",
            "HOLDFAST_HOLD_SECONDS_MAX": str(HOLD_SECONDS_MAX),
            "HOLDFAST_HOLD_MAX_TOTAL_SECONDS": str(HOLD_MAX_TOTAL_SECONDS),
            "HOLDFAST_LATE_COMMIT": self.late_commit,
            "HOLDFAST_MAX_HOLDS_PER_BUYER": "0",
            "RUST_LOG": "warn",
        })
        return env

    def start(self):
        logf = open(self.log_path, "ab")
        logf.write(f"\n==== start {self.starts + 1} at {time.time():.3f} "
                   f"(HOLDFAST_LATE_COMMIT={self.late_commit})\n".encode())
        logf.flush()
        self.proc = subprocess.Popen([self.binary, "serve"], env=self.env(), stdout=logf,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        logf.close()
        CLEANUP.add_proc(self.proc)
        self.modes.append((time.time(), self.late_commit))
        self.starts += 1

    def kill9(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def ready(self) -> bool:
        try:
            conn = http.client.HTTPConnection(HOST, self.port, timeout=3)
            conn.request("GET", "/readyz")
            status = conn.getresponse().status
            conn.close()
            return status == 200
        except (OSError, http.client.HTTPException):
            return False

    def wait_ready(self, timeout=60.0):
        end = time.time() + timeout
        while time.time() < end:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; "
                                   f"log:\n{tail(self.log_path)}")
            if self.ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready after {timeout}s; log:\n{tail(self.log_path)}")


def tail(path, lines=30):
    try:
        with open(path, "rb") as f:
            return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# --------------------------------------------------------------------------
# The client's record of every request
# --------------------------------------------------------------------------


class Attempt:
    __slots__ = ("op", "port", "t0", "t1", "status", "error", "replayed", "code", "body",
                 "raw", "phase", "timeout")

    def __init__(self, op, port, phase, timeout):
        self.op = op
        self.port = port
        self.phase = phase
        self.timeout = timeout
        self.t0 = time.time()
        self.t1 = None
        self.status = None
        self.error = None
        self.replayed = False
        self.code = None
        self.body = None
        self.raw = b""

    @property
    def answered(self):
        return self.status is not None

    @property
    def retryable(self):
        if self.status is None or self.status >= 500 or self.status == 429:
            return True
        return self.status == 409 and self.code in RETRYABLE_CODES

    @property
    def refund(self):
        if self.status == 409 and isinstance(self.body, dict):
            r = self.body.get("refund")
            return r if isinstance(r, dict) else None
        return None

    @property
    def good(self):
        """A 2xx, or a 409 that carries a refund: the answers idempotency must keep."""
        return self.status is not None and (200 <= self.status < 300 or self.refund is not None)

    def label(self):
        if self.status is None:
            return "conn-error"
        return str(self.status) if not self.code else f"{self.status} {self.code}"


class Op:
    """One logical request: one Idempotency-Key and body, any number of attempts."""

    __slots__ = ("id", "kind", "method", "path", "key", "payload", "body", "attempts",
                 "final", "meta", "lock")

    def __init__(self, oid, kind, method, path, payload, key, meta):
        self.id = oid
        self.kind = kind
        self.method = method
        self.path = path
        self.key = key
        self.payload = payload
        self.body = json.dumps(payload).encode() if payload is not None else None
        self.attempts: list[Attempt] = []
        self.final: Attempt | None = None
        self.meta = meta
        self.lock = threading.Lock()


class Recorder:
    def __init__(self):
        self.lock = threading.Lock()
        self.ops: list[Op] = []
        self.n_attempts = 0
        self.status_counts = collections.Counter()

    def new_op(self, kind, method, path, payload, idempotent, meta=None):
        key = f"chaos-{kind}-{uuid.uuid4()}" if idempotent else None
        with self.lock:
            op = Op(len(self.ops), kind, method, path, payload, key, meta or {})
            self.ops.append(op)
        return op

    def note(self, a: Attempt):
        with self.lock:
            self.n_attempts += 1
            self.status_counts[a.label()] += 1


class Http:
    """Per-thread keep-alive connections, one per instance port."""

    def __init__(self):
        self.conns = {}

    def drop(self, port):
        conn = self.conns.pop(port, None)
        if conn is not None:
            try:
                conn[0].close()
            except Exception:  # noqa: BLE001
                pass

    def request(self, port, method, path, body=None, headers=None, timeout=HTTP_TIMEOUT):
        entry = self.conns.get(port)
        # Don't reuse a connection idle long enough for the server to close it.
        if entry is not None and time.time() - entry[1] > 2.0:
            self.drop(port)
            entry = None
        if entry is None:
            conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
        else:
            conn = entry[0]
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
        hdrs = {"Accept": "application/json"}
        if body is not None:
            hdrs["Content-Type"] = "application/json"
        hdrs.update(headers or {})
        try:
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            raw = resp.read()
            rheaders = {k.lower(): v for k, v in resp.getheaders()}
        except BaseException:
            self.conns.pop(port, None)
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass
            raise
        if rheaders.get("connection", "").lower() == "close":
            conn.close()
            self.conns.pop(port, None)
        else:
            self.conns[port] = (conn, time.time())
        return resp.status, rheaders, raw


def send(rec: Recorder, http_: Http, op: Op, port: int, phase: str, rng=None) -> Attempt:
    timeout = HTTP_TIMEOUT
    if rng is not None and op.method == "POST" and rng.random() < IMPATIENT_SHARE:
        timeout = rng.uniform(*IMPATIENT_TIMEOUT)
    a = Attempt(op, port, phase, timeout)
    headers = {"Idempotency-Key": op.key} if op.key else {}
    try:
        status, rheaders, raw = http_.request(port, op.method, op.path, op.body, headers,
                                              timeout)
        a.status = status
        a.raw = raw
        a.replayed = rheaders.get("idempotent-replayed", "").lower() == "true"
        try:
            a.body = json.loads(raw) if raw else None
        except ValueError:
            a.body = None
        if isinstance(a.body, dict) and status >= 400:
            a.code = a.body.get("error_code")
    except (OSError, http.client.HTTPException) as e:
        a.error = f"{type(e).__name__}: {e}"
    a.t1 = time.time()
    with op.lock:
        op.attempts.append(a)
    rec.note(a)
    return a


def perform(rec, http_, op, ports, phase="load", max_attempts=MAX_ATTEMPTS, rng=random,
            first_port=None, impatient=True, stop_at=None):
    """Sends op until it gets a definitive answer; blind retries with the same
    key and body after a connection error, timeout, 5xx or key-in-use, moving
    to another instance when there is one."""
    port = first_port if first_port is not None else rng.choice(ports)
    for n in range(max_attempts):
        # The last attempts are patient, so that impatience alone never
        # exhausts the retries.
        a = send(rec, http_, op, port, phase,
                 rng if impatient and n < max_attempts - 3 else None)
        if not a.retryable:
            op.final = a
            return a
        if n + 1 == max_attempts or (stop_at is not None and time.time() > stop_at):
            break
        delay = min(BACKOFF_CAP, BACKOFF_BASE * (2 ** n)) * (0.5 + rng.random())
        time.sleep(delay)
        others = [p for p in ports if p != port]
        if others:
            port = rng.choice(others)
    return None


# --------------------------------------------------------------------------
# The load
# --------------------------------------------------------------------------


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


class Context:
    def __init__(self, rec, ports, pool, deadline, seed):
        self.rec = rec
        self.ports = ports
        self.pool = pool
        self.deadline = deadline
        self.seed = seed
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
    return a, Res(rid, asset_id, buyer, created_at, expires_at)


def commit(ctx, http_, rng, res, intent, pref=None):
    pref = pref or new_pref()
    op = ctx.new_op("commit", "POST", f"/v1/reservations/{res.rid}/commit",
                    {"payment_reference": pref}, True, res.meta(intent, pref=pref))
    a = perform(ctx.rec, http_, op, ctx.ports, rng=rng)
    maybe_duplicate(ctx, http_, rng, op, a)
    if a is not None and a.status == 200:
        # Sold: take it out of the pool and put a fresh asset in.
        if ctx.pool.remove(res.asset_id):
            create_asset(ctx, http_, rng, gated=rng.random() < P_GATED_ASSET)
    return a


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

    def decide(res):
        r = rng.random()
        if r < 0.38:
            c = commit(ctx, http_, rng, res, "commit-now")
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
                    commit(ctx, http_, rng, res, "after-release")
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
        c = commit(ctx, http_, rng, res, "late")
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
        elif s < 0.45:  # the voided payment again, under a new key: refunded once
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


# --------------------------------------------------------------------------
# One backend's run
# --------------------------------------------------------------------------


class Violations:
    def __init__(self):
        self.items = collections.defaultdict(list)

    def add(self, category, text):
        self.items[category].append(text)

    def total(self):
        return sum(len(v) for v in self.items.values())

    def print(self):
        for category in sorted(self.items):
            found = self.items[category]
            print(f"  VIOLATION {category}: {len(found)}")
            for text in found[:8]:
                print(f"      {text}")
            if len(found) > 8:
                print(f"      … and {len(found) - 8} more")


class Phase:
    def __init__(self, backend, args, binary, workdir):
        self.backend = backend
        self.args = args
        self.binary = binary
        self.workdir = workdir
        self.rec = Recorder()
        self.v = Violations()
        self.instances: list[Instance] = []
        self.kills = 0
        self.instance_restarts = 0
        self.db_restarts = 0
        self.windows: list[tuple[float, float]] = []  # database restart windows
        self.outages: list[tuple[float, float]] = []  # database certainly down
        self.kill_windows: list[tuple[float, float]] = []
        self.db_name = None
        self.db_url = None
        self.sqlite_path = None
        self.threads = args.pg_threads if backend == "postgres" else args.sqlite_threads
        self.audit_summary = "not run"
        self.figures = {}

    # ---- setup
    def setup(self):
        if self.backend == "postgres":
            CLEANUP.pg_touched = True
            if not pg_ready():
                raise RuntimeError("PostgreSQL is not accepting connections on "
                                   f"{PG_HOST}:{PG_PORT}")
            self.db_name = f"holdfast_chaos_{os.getpid()}_{uuid.uuid4().hex[:6]}"
            CLEANUP.pg_databases.append(self.db_name)
            psql(f'CREATE DATABASE "{self.db_name}"')
            self.db_url = f"postgres://{PG_USER}@{PG_HOST}:{PG_PORT}/{self.db_name}"
            n = 3
        else:
            self.sqlite_path = os.path.join(self.workdir, "holdfast-chaos.db")
            self.db_url = f"sqlite://{self.sqlite_path}"
            n = 1
        for i in range(n):
            self.instances.append(Instance(f"{self.backend}-{i + 1}", self.binary, self.db_url,
                                           self.workdir, self.late_commit_mode(i)))
        for inst in self.instances:  # all at once: migrations must be safe concurrently
            inst.start()
        for inst in self.instances:
            inst.wait_ready()
        self.by_port = {i.port: i for i in self.instances}
        log(f"{self.backend}: {n} instance(s) ready on ports "
            f"{', '.join(str(i.port) for i in self.instances)} ({self.db_url}); "
            f"late commits: " + ", ".join(f"{i.name} {i.late_commit}" for i in self.instances)
            + (" (accept-if-free after its restart)" if self.flip_on_restart else ""))

    def late_commit_mode(self, i):
        """HOLDFAST_LATE_COMMIT of the i-th instance at its first start."""
        if self.args.late_commit != "mixed":
            return self.args.late_commit
        # PostgreSQL: the third instance accepts late payments when the asset
        # is free, the others refund; SQLite: refund until the kill.
        return "accept-if-free" if self.backend == "postgres" and i == 2 else "refund"

    @property
    def flip_on_restart(self):
        return self.backend == "sqlite" and self.args.late_commit == "mixed"

    def mode_at(self, port, t):
        return self.by_port[port].mode_at(t)

    def op_modes(self, op):
        """The late-commit modes of the instances any attempt of op may have
        reached (each attempt judged at its start and at its end)."""
        return {self.mode_at(a.port, t) for a in op.attempts for t in (a.t0, a.t1)}

    def drop_database(self):
        if self.db_name and self.db_name in CLEANUP.pg_databases:
            try:
                if not pg_ready():
                    pg_ctl("start")
                    for _ in range(60):
                        if pg_ready():
                            break
                        time.sleep(0.5)
                psql(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)', timeout=30)
                CLEANUP.pg_databases.remove(self.db_name)
                log(f"dropped database {self.db_name}")
            except Exception as e:  # noqa: BLE001
                log(f"could not drop database {self.db_name} now ({e}); retrying at exit")

    @property
    def ports(self):
        return [i.port for i in self.instances]

    # ---- chaos actions
    def kill_and_restart(self, inst: Instance, down: float):
        t0 = time.time()
        log(f"kill -9 {inst.name} (pid {inst.proc.pid})")
        inst.kill9()
        self.kills += 1
        time.sleep(down)
        if self.flip_on_restart:
            inst.late_commit = "accept-if-free"
        log(f"starting {inst.name} again (HOLDFAST_LATE_COMMIT={inst.late_commit})")
        inst.start()
        inst.wait_ready()
        self.instance_restarts += 1
        self.kill_windows.append((t0, time.time()))
        log(f"{inst.name} ready again after {time.time() - t0:.1f}s")

    def restart_database(self):
        """Restarts PostgreSQL: stop (fast: sessions are cut), stay down for
        --db-down-seconds, start. With 0, one `pg_ctlcluster restart`."""
        down = self.args.db_down_seconds
        t0 = time.time()
        if down <= 0:
            log("restarting PostgreSQL (pg_ctlcluster restart)")
            r = pg_ctl("restart")
            if r.returncode != 0:
                self.v.add("chaos", f"pg_ctlcluster restart failed ({r.returncode}): "
                                    f"{r.stderr.strip()}")
                pg_ctl("start")
        else:
            log(f"restarting PostgreSQL: stop, {down:g}s down, start")
            r = pg_ctl("stop")
            stopped = time.time()
            if r.returncode != 0:
                self.v.add("chaos", f"pg_ctlcluster stop failed ({r.returncode}): "
                                    f"{r.stderr.strip()}")
            time.sleep(down)
            if r.returncode == 0 and not pg_ready():
                # From the end of the stop to the start command, nothing can
                # reach the database.
                self.outages.append((stopped, time.time()))
            r = pg_ctl("start")
            if r.returncode != 0:
                self.v.add("chaos", f"pg_ctlcluster start failed ({r.returncode}): "
                                    f"{r.stderr.strip()}")
        self.db_restarts += 1
        end = time.time() + 90
        pending = list(self.instances)
        while pending and time.time() < end:
            pending = [i for i in pending if not i.ready()]
            if pending:
                time.sleep(0.1)
        t1 = time.time()
        self.windows.append((t0, t1))
        if pending:
            self.v.add("chaos", "instances not ready 90 s after the database restart: "
                                + ", ".join(i.name for i in pending))
        log(f"PostgreSQL restarted; all instances ready again after {t1 - t0:.2f}s")

    # ---- the run
    def run(self):
        self.setup()
        rng = random.Random(self.args.seed)
        pool = AssetPool()
        start = time.time()
        seed_ctx = Context(self.rec, self.ports, pool, start + 3600, self.args.seed)
        http_ = Http()
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda _: create_asset(seed_ctx, Http(), random.Random(), "seed"),
                        range(self.args.assets)))
        log(f"seeded {len(pool)} assets")

        load_start = time.time()
        deadline = load_start + self.args.seconds
        ctx = Context(self.rec, self.ports, pool, deadline, self.args.seed)
        threads = [threading.Thread(target=client, args=(ctx, t), daemon=True,
                                    name=f"client-{t}") for t in range(self.threads)]
        for t in threads:
            t.start()
        log(f"{self.backend}: {self.threads} client threads for {self.args.seconds}s")

        # The chaos schedule, relative to the start of the load.
        plan = []
        if self.backend == "postgres":
            plan.append((0.30, "kill"))
            plan.append((0.60, "db-restart"))
        else:
            plan.append((0.40, "kill"))
        last_report = time.time()
        for frac, action in plan:
            at = load_start + frac * self.args.seconds
            while time.time() < at:
                time.sleep(min(0.2, max(0.0, at - time.time())))
                if time.time() - last_report > 15:
                    self.progress(pool)
                    last_report = time.time()
            if action == "kill":
                victim = self.instances[rng.randrange(len(self.instances))]
                self.kill_and_restart(victim, self.args.down_seconds)
            else:
                self.restart_database()
        while time.time() < deadline:
            time.sleep(min(0.5, max(0.0, deadline - time.time())))
            if time.time() - last_report > 15:
                self.progress(pool)
                last_report = time.time()
        log("load over; waiting for clients to finish their current request")
        join_end = time.time() + 90
        for t in threads:
            t.join(timeout=max(0.0, join_end - time.time()))
        stuck = [t.name for t in threads if t.is_alive()]
        if stuck:
            self.v.add("harness", f"client threads still running 90 s after the deadline: "
                                  f"{stuck}")
        self.load_seconds = time.time() - load_start
        self.ctx = ctx
        self.pool = pool

        # Every instance must answer again before the checks.
        for inst in self.instances:
            if inst.proc.poll() is not None:
                self.v.add("crash", f"{inst.name} exited by itself with {inst.proc.returncode}; "
                                    f"log tail:\n{tail(inst.log_path)}")
                inst.start()
                self.instance_restarts += 1
            inst.wait_ready()

        self.resolve(http_)
        self.write_record()
        self.verify()

    def write_record(self):
        """Every client request, one JSON line per attempt, in the work dir."""
        path = os.path.join(self.workdir, "requests.jsonl")
        with open(path, "w") as out:
            for op in self.rec.ops:
                final = op.final.label() if op.final else None
                for a in op.attempts:
                    out.write(json.dumps({
                        "op": op.id, "kind": op.kind, "method": op.method, "path": op.path,
                        "idempotency_key": op.key, "body": op.payload, "intent":
                        op.meta.get("intent"), "phase": a.phase, "port": a.port,
                        "t0": round(a.t0, 4), "t1": round(a.t1, 4), "timeout": a.timeout,
                        "status": a.status, "error_code": a.code, "error": a.error,
                        "replayed": a.replayed, "final": final,
                        "response": a.raw.decode(errors="replace")[:2000],
                    }) + "\n")
        self.record_path = path

    def progress(self, pool):
        with self.rec.lock:
            n = self.rec.n_attempts
            top = ", ".join(f"{k}={v}" for k, v in self.rec.status_counts.most_common(6))
        log(f"{self.backend}: {n} requests so far ({top}); {len(pool)} assets for sale")

    def resolve(self, http_):
        """Requests that never got an answer (retries exhausted) are retried now,
        with the same key and body, until they get one: only then is the
        client's record complete enough to compare with the database."""
        pending = [op for op in self.rec.ops if op.final is None and op.attempts]
        self.figures["unanswered_after_load"] = len(pending)
        if not pending:
            return
        log(f"{len(pending)} requests without an answer after their retries; retrying them")
        unresolved = []
        stop_at = time.time() + 60
        for op in pending:
            a = perform(self.rec, http_, op, self.ports, phase="resolve",
                        max_attempts=RESOLVE_ATTEMPTS, impatient=False, stop_at=stop_at)
            if a is None:
                unresolved.append(op)
        for op in unresolved:
            last = op.attempts[-1]
            self.v.add("unanswered", f"{op.kind} {op.path} key={op.key}: no answer after "
                                     f"{len(op.attempts)} attempts (last: {last.label()} "
                                     f"{last.error or ''})")

    # ---- checks
    def audit(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HOLDFAST_")}
        env["HOLDFAST_DATABASE_URL"] = self.db_url
        env["RUST_LOG"] = "warn"
        try:
            r = subprocess.run([self.binary, "audit", "--json"], env=env, capture_output=True,
                               text=True, timeout=180)
        except subprocess.TimeoutExpired:
            self.v.add("audit", "holdfast audit --json did not finish within 180 s")
            self.audit_summary = "timed out"
            return
        if r.returncode == 2 and ("unrecognized subcommand" in r.stderr
                                  or "unexpected argument" in r.stderr):
            self.v.add("audit", "this holdfast binary has no `audit` subcommand yet: "
                                + r.stderr.strip().splitlines()[0])
            self.audit_summary = "missing (no `audit` subcommand in this binary)"
            print("  audit: holdfast has no `audit` subcommand (exit 2)")
            return
        try:
            report = json.loads(r.stdout)
        except ValueError:
            report = None
        print(f"  audit: exit {r.returncode}")
        if isinstance(report, dict):
            for check in report.get("checks", []):
                n = check.get("violations")
                print(f"    {'ok  ' if not n else 'FAIL'} {check.get('name')}: "
                      f"{n} violation(s) — {check.get('description', '')}")
                for ex in (check.get("examples") or [])[:5]:
                    print(f"           e.g. {json.dumps(ex)[:300]}")
        else:
            print("    (stdout is not JSON)")
            print("    stdout: " + r.stdout.strip()[:1000])
        if r.stderr.strip():
            print("    stderr: " + r.stderr.strip()[:1000])
        ok = r.returncode == 0 and isinstance(report, dict) and report.get("ok") is True
        n_checks = len(report.get("checks", [])) if isinstance(report, dict) else 0
        self.audit_summary = f"{'ok' if ok else 'FAILED'} (exit {r.returncode}, {n_checks} checks)"
        if not ok:
            bad = [c.get("name") for c in (report or {}).get("checks", []) if c.get("violations")]
            self.v.add("audit", f"holdfast audit --json exit {r.returncode}, ok="
                                f"{(report or {}).get('ok')!r}, failing checks {bad}")

    # ---- reading the database and the service back
    def db_select(self, table, cols, ts=(), where=""):
        """Rows of a table as dicts; the columns named in ts as epoch seconds."""
        if self.backend == "postgres":
            sel = ", ".join(f"extract(epoch from {c})" if c in ts else c for c in cols)
            rows = psql(f"SELECT {sel} FROM {table} {where}", db=self.db_name, timeout=120)
            return [{c: None if v == "" else (float(v) if c in ts else v)
                     for c, v in zip(cols, row)} for row in rows]
        conn = sqlite3.connect(f"file:{self.sqlite_path}?mode=ro", uri=True, timeout=30)
        try:
            rows = conn.execute(f"SELECT {', '.join(cols)} FROM {table} {where}").fetchall()
        finally:
            conn.close()
        return [{c: parse_ts(v) if c in ts else v for c, v in zip(cols, row)} for row in rows]

    def db_state(self):
        return {
            "reservations": self.db_select(
                "reservations",
                ["id", "status", "payment_reference", "asset_id", "buyer_id", "created_at",
                 "expires_at", "committed_at", "released_at", "voided_at"],
                ts=("created_at", "expires_at", "committed_at", "released_at", "voided_at")),
            "refunds": self.db_select(
                "refunds", ["id", "reservation_id", "payment_reference", "reason", "created_at"],
                ts=("created_at",)),
            "assets": self.db_select("assets", ["id", "status", "current_reservation_id"]),
            "withdrawals": self.db_select(
                "events", ["asset_id", "type", "created_at"], ts=("created_at",),
                where="WHERE type IN ('asset.withdrawn', 'asset.reinstated')"),
        }

    def get_one(self, http_, path, stop_at):
        """GET path, retrying connection errors and 503; the last attempt."""
        rng = random.Random()
        op = Op(-1, "get", "GET", path, None, None, {})
        with self.verify_rec.lock:
            self.verify_ops.append(op)
        for n in range(RESOLVE_ATTEMPTS):
            a = send(self.verify_rec, http_, op, rng.choice(self.ports), "verify")
            if not a.retryable or time.time() > stop_at:
                return a
            time.sleep(min(BACKOFF_CAP, BACKOFF_BASE * 2 ** n))
        return op.attempts[-1]

    def get_all(self, paths):
        """GETs every path (retrying connection errors and 503), in parallel."""
        local = threading.local()
        stop_at = time.time() + 120

        def one(path):
            if not hasattr(local, "http"):
                local.http = Http()
            return path, self.get_one(local.http, path, stop_at)

        with concurrent.futures.ThreadPoolExecutor(16) as ex:
            return dict(ex.map(one, paths))

    def list_all(self, queries):
        """Every page of each GET /v1/reservations query, following next_cursor:
        [(query, items or None, error)]."""
        local = threading.local()
        stop_at = time.time() + 120

        def one(query):
            if not hasattr(local, "http"):
                local.http = Http()
            items, cursor = [], None
            for _ in range(5000):
                q = dict(query, cursor=cursor) if cursor else query
                path = "/v1/reservations?" + urllib.parse.urlencode(q)
                a = self.get_one(local.http, path, stop_at)
                if a.status != 200 or not isinstance(a.body, dict):
                    return query, None, f"GET {path} answered {a.label()}"
                items.extend(a.body.get("items") or [])
                cursor = a.body.get("next_cursor")
                if not cursor:
                    return query, items, None
            return query, None, "more than 5000 pages"

        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            return list(ex.map(one, queries))

    # ---- checks
    def check_answer(self, a, gate_values, unrefunded_voids):
        """What one answer says, checked on its own (its body against its request)."""
        v, op, M = self.v, a.op, EXPIRY_MARGIN
        body = a.body if isinstance(a.body, dict) else {}
        what = f"{op.kind} {op.path} key={op.key} ({op.meta.get('intent')})"
        if op.kind == "hold":
            if a.status == 200 and not a.replayed or a.status == 201 and a.replayed:
                # A hold is 201 when it acts, 200 only as a replay.
                v.add("idempotency", f"hold key={op.key} answered {a.status} with "
                                     f"Idempotent-Replayed={a.replayed}")
            elif a.code == "ASSET_UNAVAILABLE" and \
                    body.get("asset_status") not in ("HELD", "SOLD", "WITHDRAWN"):
                v.add("unexpected-answer", f"{what}: ASSET_UNAVAILABLE with asset_status "
                                           f"{body.get('asset_status')!r}")
            elif a.code == "SALE_NOT_OPEN":
                t = parse_ts(body.get("available_from"))
                known = gate_values.get(op.meta["asset_id"], [])
                if t is None or not any(abs(t - k) < TS_EPS for k in known):
                    v.add("sale-not-open", f"{what}: SALE_NOT_OPEN until "
                                           f"{body.get('available_from')}, which no client set")
                elif t <= a.t0 - M:
                    v.add("sale-not-open", f"{what}: SALE_NOT_OPEN sent {a.t0 - t:.2f}s after "
                                           f"the sale opened ({body.get('available_from')})")
        elif op.kind == "commit" and a.code in REFUND_CODES:
            rf = a.refund
            if rf is None and op.meta["intent"] == "commit-after-void" and \
                    op.meta["rid"] in unrefunded_voids:
                pass  # the sale's own payment: the void settled it, with no refund
            elif rf is None or rf.get("reason") not in REFUND_CODES[a.code]:
                v.add("refund", f"commit {op.path} answered {a.code} without the refund it "
                                f"must carry: {a.raw[:300]!r}")
            elif op.meta["intent"] in ("commit-after-void", "commit-after-void-new") and \
                    rf.get("reason") != "SALE_VOIDED":
                v.add("refund", f"{what}: a payment for a voided sale refunded as "
                                f"{rf.get('reason')}")
        elif op.kind == "extend":
            n = op.meta["seconds"]
            rsv = body if a.status == 200 else body.get("reservation") or {}
            if a.status == 200:
                e = parse_ts(body.get("expires_at"))
                good = [x for x in op.attempts if x.status == 200]
                lo, hi = op.attempts[0].t0 + n - M, good[0].t1 + n + M
                if body.get("status") != "HELD" or e is None:
                    v.add("extend", f"{what}: 200 with status {body.get('status')}")
                elif not lo <= e <= hi:
                    v.add("extend", f"{what}: expires_at {body.get('expires_at')} is not "
                                    f"{n}s after the request (off by "
                                    f"{min(abs(e - lo), abs(e - hi)):.2f}s)")
                elif e - op.meta["created_at"] > HOLD_MAX_TOTAL_SECONDS + TS_EPS:
                    v.add("extend", f"{what}: extended to {e - op.meta['created_at']:.2f}s from "
                                    f"creation, over the {HOLD_MAX_TOTAL_SECONDS}s cap")
                if op.attempts[0].t0 > op.meta["expires_at"] + M:
                    v.add("late-extend-accepted",
                          f"{what}: first sent {op.attempts[0].t0 - op.meta['expires_at']:.2f}s "
                          f"after the hold lapsed, answered 200")
            elif a.code == "HOLD_EXTENSION_LIMIT":
                if a.t1 + n < op.meta["created_at"] + HOLD_MAX_TOTAL_SECONDS - M:
                    v.add("extend", f"{what}: HOLD_EXTENSION_LIMIT though now+{n}s stays "
                                    f"{op.meta['created_at'] + HOLD_MAX_TOTAL_SECONDS - a.t1 - n:.2f}s "
                                    f"within the cap")
            elif a.code == "RESERVATION_NOT_ACTIVE" and rsv.get("status") == "HELD":
                v.add("extend", f"{what}: RESERVATION_NOT_ACTIVE for a HELD reservation")
        elif op.kind == "void":
            if a.status == 200 and body.get("status") != "VOIDED":
                v.add("void", f"{what}: 200 with status {body.get('status')}")
            elif a.status == 409 and (body.get("reservation") or {}).get("status") == "COMMITTED":
                v.add("void", f"{what}: RESERVATION_NOT_ACTIVE for a COMMITTED reservation")
        elif op.kind == "withdraw":
            asset = body if a.status == 200 else body.get("asset") or {}
            want = {200: "WITHDRAWN", "ASSET_HELD": "HELD", "ASSET_SOLD": "SOLD"}
            expect = want[200] if a.status == 200 else want.get(a.code)
            if asset.get("status") != expect:
                v.add("withdraw", f"{what} force={op.meta['force']}: {a.label()} with asset "
                                  f"status {asset.get('status')}")
            if a.code == "ASSET_HELD" and op.meta["force"]:
                v.add("withdraw", f"{what}: a forced withdrawal answered ASSET_HELD")
        elif op.kind == "gate":
            want, got = op.meta["available_from"], body.get("available_from")
            if (want is None) != (got is None) or \
                    (want is not None and abs(parse_ts(want) - (parse_ts(got) or 0)) > TS_EPS):
                v.add("gate", f"{what}: asked available_from {want}, answered {got}")
        elif op.kind == "list":
            self.check_page(a, body)

    def check_page(self, a, body):
        v, meta = self.v, a.op.meta
        items = body.get("items")
        if not isinstance(items, list):
            v.add("list", f"GET {a.op.path}: no items: {a.raw[:200]!r}")
            return
        ids = [it.get("reservation_id") or "" for it in items]
        if any(ids[i] <= ids[i + 1] for i in range(len(ids) - 1)):
            v.add("list", f"GET {a.op.path}: not newest first: {ids[:10]}")
        if meta["prev_last"] and ids and ids[0] >= meta["prev_last"]:
            v.add("list", f"GET {a.op.path}: the next page starts at {ids[0]}, not after "
                          f"{meta['prev_last']}")
        if len(items) > meta["limit"] or (body.get("next_cursor") and len(items) < meta["limit"]):
            v.add("list", f"GET {a.op.path}: {len(items)} items for limit {meta['limit']}, "
                          f"next_cursor {body.get('next_cursor')!r}")
        for it in items:
            for field, want in meta["filters"].items():
                if it.get(field) != want:
                    v.add("list", f"GET {a.op.path}: item {it.get('reservation_id')} has "
                                  f"{field} {it.get(field)!r}")

    def check_effective(self, a):
        """A reservation an answer shows is HELD only before its expiry, EXPIRED
        only after (by the service's clock, read within the request)."""
        if a.replayed or not isinstance(a.body, dict) or a.status is None or a.status >= 500:
            return
        b = a.body
        shown = b.get("items") if isinstance(b.get("items"), list) else \
            [b.get("reservation") if isinstance(b.get("reservation"), dict) else b]
        for r in shown:
            if not isinstance(r, dict) or "reservation_id" not in r:
                continue
            e = parse_ts(r.get("expires_at"))
            if e is None:
                continue
            if r.get("status") == "HELD" and e < a.t0 - EXPIRY_MARGIN:
                self.v.add("effective-status",
                           f"{a.op.method} {a.op.path}: {r['reservation_id']} HELD though it "
                           f"expired {a.t0 - e:.2f}s before the request")
            elif r.get("status") == "EXPIRED" and e > a.t1 + EXPIRY_MARGIN:
                self.v.add("effective-status",
                           f"{a.op.method} {a.op.path}: {r['reservation_id']} EXPIRED "
                           f"{e - a.t1:.2f}s before its expiry")

    def verify(self):
        v = self.v
        rec = self.rec
        M = EXPIRY_MARGIN
        self.verify_rec = Recorder()
        self.verify_ops = []
        print(f"\n== checks ({self.backend})")
        self.audit()

        ops = rec.ops
        attempts = [a for op in ops for a in op.attempts]
        assets_ops = collections.defaultdict(lambda: collections.defaultdict(list))
        for op in ops:
            if "asset_id" in op.meta:
                assets_ops[op.meta["asset_id"]][op.kind].append(op)
        # Every sale opening a client set, per asset.
        gate_values = collections.defaultdict(list)
        for op in ops:
            if op.kind in ("gate", "create_asset") and op.meta.get("available_from"):
                gate_values[op.meta["asset_id"]].append(parse_ts(op.meta["available_from"]))

        # Sales voided without refund: their own payment is never refunded.
        first_voids = {}
        for op in ops:
            if op.kind == "void" and any(a.good for a in op.attempts):
                first_voids.setdefault(op.meta["rid"], op)
        unrefunded_voids = {rid for rid, op in first_voids.items() if not op.meta["refund"]}

        # 4. No 5xx other than 503, ever; and nothing the contract (or the
        # flow, when it knows the answer in advance) does not allow.
        log("checking every answer")
        for a in attempts:
            op = a.op
            if a.status is not None and a.status >= 500 and a.status != 503:
                v.add("5xx", f"{a.status} {a.code} for {op.kind} {op.path} key={op.key} "
                             f"at +{a.t0 - _t_origin:.2f}s: {a.raw[:300]!r}")
                continue
            if a.status is None or a.retryable:
                continue
            expected = EXPECTED_BY_INTENT.get(op.meta.get("intent")) or EXPECTED[op.kind]
            if (a.status, a.code) not in expected:
                v.add("unexpected-answer", f"{a.label()} for {op.kind} {op.path} key={op.key} "
                                           f"({op.meta.get('intent')}) body={op.payload}: "
                                           f"{a.raw[:300]!r}")
                continue
            self.check_answer(a, gate_values, unrefunded_voids)
            self.check_effective(a)
        window_503 = sum(1 for a in attempts if a.status == 503
                         and any(w0 <= a.t1 <= w1 for w0, w1 in self.windows))
        window_conn = sum(1 for a in attempts if a.status is None
                          and any(w0 <= a.t1 <= w1 for w0, w1 in self.windows))
        window_2xx = sum(1 for a in attempts if a.status is not None and 200 <= a.status < 300
                         and any(w0 <= a.t1 <= w1 for w0, w1 in self.windows))
        # A request sent and answered while the database was certainly down
        # cannot have read or written anything: only 503 (or no answer) is right.
        outage_answers = collections.Counter()
        for a in attempts:
            if any(o0 <= a.t0 and a.t1 <= o1 for o0, o1 in self.outages):
                outage_answers[a.label()] += 1
                if a.status is not None and a.status != 503:
                    v.add("answer-while-db-down",
                          f"{a.label()} for {a.op.kind} {a.op.path} sent and answered while "
                          f"PostgreSQL was stopped")

        # 3. Retries never act twice: per key, every 2xx / 409-with-refund is the same.
        for op in ops:
            if op.key is None:
                continue
            goods = [a for a in op.attempts if a.good]
            if not goods:
                continue
            outcomes = set()
            for a in goods:
                body = a.body if isinstance(a.body, dict) else {}
                rf = a.refund
                if 200 <= a.status < 300:
                    rid = body.get("reservation_id")
                    outcomes.add(("2xx", rid, None))
                else:
                    rid = (body.get("reservation") or {}).get("reservation_id")
                    outcomes.add((a.code, rid, rf.get("refund_id") if rf else None))
                if op.kind != "hold" and rid != op.meta["rid"]:
                    v.add("idempotency", f"{op.kind} of {op.meta['rid']} answered about "
                                         f"reservation {rid}")
            if len(outcomes) > 1:
                v.add("idempotency", f"{op.kind} key={op.key} got different answers: "
                                     f"{sorted(outcomes, key=str)}")
            if op.kind == "hold" and sum(1 for a in goods if a.status == 201) > 1:
                v.add("idempotency", f"hold key={op.key} created more than once (several 201)")
            replays = {a.raw for a in goods if a.replayed}
            originals = {a.raw for a in goods if not a.replayed}
            if len(replays) > 1:
                v.add("idempotency", f"{op.kind} key={op.key}: replays differ")
            if replays and originals and not replays <= originals:
                v.add("idempotency", f"{op.kind} key={op.key}: replay is not the original "
                                     f"answer: {next(iter(replays))[:200]!r} vs "
                                     f"{next(iter(originals))[:200]!r}")
            # Once acknowledged, a request stays acknowledged: a later attempt
            # with its key must not answer anything else (a hold retried after
            # its 201 must replay, not find the asset taken).
            seen_good = False
            for a in sorted(op.attempts, key=lambda x: x.t0):
                if a.good:
                    seen_good = True
                elif seen_good and a.status is not None and not a.retryable:
                    v.add("idempotency", f"{op.kind} key={op.key}: acknowledged, then a retry "
                                         f"answered {a.label()}")
            for a in op.attempts:
                if a.replayed and not a.good and a.status is not None:
                    # Only answers that changed something are stored and replayed.
                    v.add("idempotency", f"{op.kind} key={op.key}: replayed a {a.label()}")

        # What the clients were told.
        held = {}          # rid -> hold op
        hold_keys_ok = set()
        committed = {}     # rid -> payment_reference (from 200 commits)
        commit_op = {}     # rid -> the commit op answered 200 with that payment
        released = {}      # rid -> release op answered 200
        voided = {}        # rid -> the first void op answered 200: the one that acted
        extended = collections.defaultdict(list)  # rid -> [(op, expires_at)] answered 200
        refunds_seen = {}  # (rid, pref) -> set(refund_id)
        late = set()       # (rid, pref, refund_id) of 409 HOLD_EXPIRED
        for op in ops:
            goods = [a for a in op.attempts if a.good]
            if op.kind == "hold":
                for a in goods:
                    rid = a.body.get("reservation_id") if isinstance(a.body, dict) else None
                    if rid:
                        held[rid] = op
                        hold_keys_ok.add(op.key)
            elif op.kind == "commit":
                rid, pref = op.meta["rid"], op.meta["pref"]
                for a in goods:
                    if a.status == 200:
                        if committed.get(rid, pref) != pref:
                            v.add("sold-twice", f"{rid} committed (200) with {committed[rid]} "
                                                f"and with {pref}")
                        committed[rid] = pref
                        commit_op.setdefault(rid, op)
                    else:
                        rf = a.refund
                        refunds_seen.setdefault((rid, pref), set()).add(rf.get("refund_id"))
                        if a.code == "HOLD_EXPIRED":
                            late.add((rid, pref, rf.get("refund_id")))
            elif op.kind == "release":
                if any(a.status == 200 for a in goods):
                    released.setdefault(op.meta["rid"], op)
            elif op.kind == "extend":
                if goods and isinstance(goods[0].body, dict):
                    extended[op.meta["rid"]].append((op, parse_ts(goods[0].body.get("expires_at"))))
            elif op.kind == "void":
                rid = op.meta["rid"]
                for a in goods:
                    voided.setdefault(rid, op)
                    for rf in a.body.get("refunds") or []:
                        refunds_seen.setdefault((rid, rf.get("payment_reference")), set()) \
                            .add(rf.get("refund_id"))

        # 2. Acknowledged writes are never lost: read every reservation back.
        rids = sorted(set(held) | {op.meta["rid"] for op in ops if "rid" in op.meta})
        log(f"reading back {len(rids)} reservations")
        got = self.get_all([f"/v1/reservations/{rid}" for rid in rids])
        state = {}
        for rid in rids:
            a = got[f"/v1/reservations/{rid}"]
            if a.status != 200 or not isinstance(a.body, dict):
                if rid in held:
                    v.add("lost-write", f"hold {rid} acknowledged but GET answers {a.label()}")
                continue
            state[rid] = a.body

        def expiry(op):
            """The hold's last expiry (extensions included), else the one the
            client knew when it sent op."""
            s = state.get(op.meta["rid"])
            return parse_ts(s.get("expires_at")) if s else op.meta["expires_at"]

        late_accepted = set()
        for op in ops:
            if op.kind == "commit":
                first, last = op.attempts[0], op.attempts[-1]
                if any(a.status == 200 for a in op.attempts if a.good) and \
                        op.meta["intent"] != "same-payment" and first.t0 > expiry(op) + M:
                    # (A same-payment commit of a sold reservation is 200 at any time.)
                    if "accept-if-free" in self.op_modes(op):
                        late_accepted.add(op.meta["rid"])
                    else:
                        v.add("late-commit-accepted",
                              f"{op.meta['rid']}: commit first sent {first.t0 - expiry(op):.2f}s "
                              f"after expires_at was answered 200 by instances that refund "
                              f"late payments")
                if any(a.code == "HOLD_EXPIRED" for a in op.attempts if a.good) and \
                        last.t1 < expiry(op) - M:
                    v.add("live-hold-refused", f"{op.meta['rid']}: HOLD_EXPIRED answered "
                                               f"{expiry(op) - last.t1:.2f}s before expires_at")
            elif op.kind == "release" and op.meta["intent"] != "release-again" and \
                    any(a.status == 200 for a in op.attempts):
                first = op.attempts[0]
                body = next(a.body for a in op.attempts if a.status == 200)
                ended = parse_ts(body.get("released_at")) if isinstance(body, dict) else None
                # A reservation released before (a forced withdrawal) answers 200 at any time.
                if first.t0 > expiry(op) + M and (ended is None or ended > first.t0 - M):
                    v.add("late-release-accepted",
                          f"{op.meta['rid']}: release first sent {first.t0 - expiry(op):.2f}s "
                          f"after expires_at was answered 200")

        for rid, op in held.items():
            s = state.get(rid)
            if s and (s.get("asset_id") != op.meta["asset_id"]
                      or s.get("buyer_id") != op.meta["buyer_id"]):
                v.add("lost-write", f"{rid}: GET shows asset {s.get('asset_id')} buyer "
                                    f"{s.get('buyer_id')}, hold was for {op.meta}")
        for rid, pref in committed.items():
            s = state.get(rid)
            if not s:
                continue
            want = "VOIDED" if rid in voided else "COMMITTED"
            if s.get("status") != want or s.get("payment_reference") != pref:
                v.add("lost-write", f"commit of {rid} with {pref} acknowledged"
                                    f"{', then its void' if rid in voided else ''}; GET shows "
                                    f"{s.get('status')} {s.get('payment_reference')}")
        for rid in released:
            s = state.get(rid)
            if not s:
                continue
            if s.get("status") == "COMMITTED":
                v.add("released-then-committed", f"{rid} released (200) and later COMMITTED")
            elif s.get("status") != "RELEASED":
                v.add("lost-write", f"release of {rid} acknowledged; GET shows {s.get('status')}")
        # Acknowledged extensions: the hold's expiry is the last one acknowledged
        # (only the thread that holds extends, one request at a time, and it
        # gives up on a reservation once a request goes unanswered).
        for rid, exts in extended.items():
            s = state.get(rid)
            if not s:
                continue
            e = parse_ts(s.get("expires_at"))
            last_op, last_e = exts[-1]
            if e is None or last_e is None or abs(e - last_e) > TS_EPS:
                v.add("extend-lost", f"{rid}: extension key={last_op.key} acknowledged "
                                     f"expires_at {iso(last_e) if last_e else None}; GET shows "
                                     f"{s.get('expires_at')} ({s.get('status')})")
        # Acknowledged voids: VOIDED, with the sale's payment; the refund checked below.
        for rid, op in voided.items():
            s = state.get(rid)
            if rid not in committed:
                v.add("void", f"{rid} voided (200) but no commit of it was acknowledged")
            if s and (s.get("status") != "VOIDED" or not s.get("voided_at")
                      or s.get("payment_reference") != committed.get(rid)):
                v.add("lost-write", f"void of {rid} acknowledged; GET shows {s.get('status')} "
                                    f"voided_at {s.get('voided_at')} payment "
                                    f"{s.get('payment_reference')}")
        # The assets of acknowledged sales read SOLD, to that reservation; a
        # voided sale's asset is no longer its.
        owners = collections.defaultdict(list)
        for rid in committed:
            s = state.get(rid)
            if s and rid not in voided:
                owners[s["asset_id"]].append(rid)
        voided_assets = {state[rid]["asset_id"]: rid for rid in voided if rid in state}
        assets = self.get_all([f"/v1/assets/{aid}"
                               for aid in sorted(set(owners) | set(voided_assets))])
        for aid, rids_ in owners.items():
            a = assets[f"/v1/assets/{aid}"]
            body = a.body if isinstance(a.body, dict) else {}
            if len(rids_) > 1:
                v.add("sold-twice", f"asset {aid}: sales acknowledged to {rids_}, none voided")
            elif a.status != 200 or body.get("status") != "SOLD" \
                    or body.get("current_reservation_id") != rids_[0]:
                v.add("lost-write", f"asset {aid} sold to {rids_[0]}; GET shows {a.label()} "
                                    f"{body.get('status')} {body.get('current_reservation_id')}")
        for aid, rid in voided_assets.items():
            body = assets[f"/v1/assets/{aid}"].body
            if isinstance(body, dict) and body.get("current_reservation_id") == rid:
                v.add("void", f"asset {aid} still {body.get('status')} to voided {rid}")

        # 5. One refund per refused payment, shown on the reservation.
        log("reading the database")
        db = self.db_state()
        res_db = {r["id"]: r for r in db["reservations"]}
        res_by_asset = collections.defaultdict(list)
        for r in db["reservations"]:
            res_by_asset[r["asset_id"]].append(r)
        db_refunds = collections.defaultdict(list)
        for rf in db["refunds"]:
            db_refunds[(rf["reservation_id"], rf["payment_reference"])].append(rf)
        refund_by_id = {rf["id"]: rf for rf in db["refunds"]}
        for key, rows in db_refunds.items():
            if len(rows) != 1:
                v.add("refund", f"refunds for (reservation, payment) {key}: {len(rows)} rows")
        for (rid, pref), ids in refunds_seen.items():
            rows = [rf["id"] for rf in db_refunds.get((rid, pref), [])]
            if len(ids) != 1:
                v.add("refund", f"{rid} / {pref}: answers carried refunds {sorted(map(str, ids))}")
            if len(rows) != 1 or set(rows) != ids:
                v.add("refund", f"{rid} / {pref}: answered refund {sorted(map(str, ids))}, "
                                f"database has {rows}")
            shown = [r.get("refund_id") for r in (state.get(rid) or {}).get("refunds", [])
                     if r.get("payment_reference") == pref]
            if rid in state and set(shown) != ids:
                v.add("refund", f"{rid} / {pref}: answered refund {sorted(map(str, ids))}, "
                                f"GET shows {shown}")
        phantom = set(db_refunds) - set(refunds_seen)
        for key in sorted(phantom)[:50]:
            v.add("refund", f"refund in the database no client was told about: {key}")
        # A void with refund gives the sale's payment back exactly once; one
        # without gives nothing back, then or later (the payment keeps its
        # one fate: it bought that sale).
        for rid, op in voided.items():
            pref = committed.get(rid)
            body = next(a.body for a in op.attempts if a.good)
            rows = db_refunds.get((rid, pref), [])
            shown = [rf for rf in body.get("refunds") or [] if rf.get("payment_reference") == pref]
            if op.meta["refund"]:
                if len(rows) != 1 or rows[0]["reason"] != "SALE_VOIDED" or len(shown) != 1 \
                        or shown[0].get("refund_id") != rows[0]["id"]:
                    v.add("void-refund", f"{rid} voided with refund: database has "
                                         f"{[(r['id'], r['reason']) for r in rows]}, the void "
                                         f"answered {[(r.get('refund_id'), r.get('reason')) for r in shown]}")
            elif shown:
                v.add("void-refund", f"{rid} voided without refund, yet the void answered "
                                     f"refund {shown}")
            elif rows:
                v.add("void-refund", f"{rid} voided without refund; its payment has refund "
                                     f"{[(r['id'], r['reason']) for r in rows]}")

        # 3 (cont.) and 2 (cont.): the database holds exactly what was acknowledged.
        if len(res_db) != len(hold_keys_ok):
            v.add("count", f"{len(res_db)} reservations in the database, {len(hold_keys_ok)} "
                           f"hold keys acknowledged with 201/200")
        for rid in sorted(set(res_db) - set(held))[:50]:
            v.add("count", f"reservation {rid} in the database was never acknowledged")
        for rid in sorted(set(held) - set(res_db))[:50]:
            v.add("lost-write", f"acknowledged hold {rid} is not in the database")
        sold = collections.Counter(r["asset_id"] for r in res_db.values()
                                   if r["status"] == "COMMITTED")
        for aid, n in sold.items():
            if n > 1:
                v.add("sold-twice", f"asset {aid} has {n} COMMITTED reservations")
        db_committed = {rid: r["payment_reference"] for rid, r in res_db.items()
                        if r["status"] == "COMMITTED"}
        want_committed = {rid: p for rid, p in committed.items() if rid not in voided}
        for rid in sorted(set(db_committed) ^ set(want_committed))[:50]:
            v.add("commit-set", f"{rid}: database COMMITTED with {db_committed.get(rid)}, "
                                f"acknowledged {want_committed.get(rid)} "
                                f"(voided: {rid in voided})")
        for rid in sorted(r for r in set(db_committed) & set(want_committed)
                          if db_committed[r] != want_committed[r])[:50]:
            v.add("commit-set", f"{rid}: database payment {db_committed[rid]}, "
                                f"acknowledged {want_committed[rid]}")
        db_voided = {rid for rid, r in res_db.items() if r["status"] == "VOIDED"}
        for rid in sorted(db_voided ^ set(voided))[:50]:
            v.add("void-set", f"{rid}: VOIDED in database {rid in db_voided}, void "
                              f"acknowledged {rid in voided}")
        # RELEASED: by an acknowledged release, or by a forced withdrawal of
        # its asset that was under way then.
        forced = 0
        db_released = {rid for rid, r in res_db.items() if r["status"] == "RELEASED"}
        for rid in sorted(set(released) - db_released)[:50]:
            v.add("release-set", f"{rid}: release acknowledged, database "
                                 f"{res_db.get(rid, {}).get('status')}")
        for rid in sorted(db_released - set(released)):
            r = res_db[rid]
            spans = [(w.attempts[0].t0, max(a.t1 for a in w.attempts))
                     for w in assets_ops[r["asset_id"]]["withdraw"] if w.meta["force"]]
            if any(t0 - M <= r["released_at"] <= t1 + M for t0, t1 in spans):
                forced += 1
            else:
                v.add("release-set", f"{rid}: RELEASED at {iso(r['released_at'])} with neither "
                                     f"a release acknowledged nor a forced withdrawal of "
                                     f"{r['asset_id']} under way")
        # Transitions against the database's own clock.
        late_sold = 0
        for rid, r in res_db.items():
            if r["status"] == "RELEASED" and r["released_at"] > r["expires_at"] + 1e-5:
                v.add("late-release-accepted", f"{rid}: released_at {iso(r['released_at'])} "
                                               f"after expires_at {iso(r['expires_at'])}")
            if r["status"] in ("COMMITTED", "VOIDED") and r["committed_at"] > r["expires_at"] + 1e-5:
                # Sold to a late payment: only by an accept-if-free instance,
                # and only when nobody held or bought the asset since.
                late_sold += 1
                op = commit_op.get(rid)
                if op is not None and "accept-if-free" not in self.op_modes(op):
                    v.add("late-commit-accepted",
                          f"{rid}: committed {r['committed_at'] - r['expires_at']:.2f}s after "
                          f"expires_at by instances that refund late payments")
                since = [o["id"] for o in res_by_asset[r["asset_id"]] if o["id"] != rid
                         and r["created_at"] <= o["created_at"] <= r["committed_at"]]
                if since:
                    v.add("late-sale-not-free", f"{rid}: sold to a late payment though "
                                                f"{since} held {r['asset_id']} since")
            if r["status"] == "VOIDED" and r["voided_at"] < r["committed_at"]:
                v.add("void", f"{rid}: voided_at before committed_at")
            if r["status"] == "COMMITTED" and db_refunds.get((rid, r["payment_reference"])):
                v.add("refund", f"{rid}: the payment that bought the asset is also refunded")
        for asset in db["assets"]:
            cur = res_db.get(asset["current_reservation_id"] or "")
            if cur is not None and cur["status"] == "VOIDED":
                v.add("void", f"asset {asset['id']} is {asset['status']} by voided {cur['id']}")
            if asset["status"] == "WITHDRAWN":
                live = [o["id"] for o in res_by_asset[asset["id"]] if o["status"] == "HELD"]
                if cur is not None or live:
                    v.add("withdrawn-held", f"asset {asset['id']} WITHDRAWN with current "
                                            f"reservation {asset['current_reservation_id']} and "
                                            f"HELD reservations {live}")
        # A late payment refused by accept-if-free instances only: someone held
        # the asset since, or it was withdrawn meanwhile.
        withdrawals = collections.defaultdict(list)
        for ev in db["withdrawals"]:
            if ev["type"] == "asset.withdrawn":
                withdrawals[ev["asset_id"]].append(ev["created_at"])
        late_refused_free = 0
        for op in by_kind_ops(ops, "commit"):
            a = next((a for a in op.attempts if a.good and a.code == "HOLD_EXPIRED"), None)
            if a is None or self.op_modes(op) != {"accept-if-free"}:
                continue
            late_refused_free += 1
            r, rf = res_db.get(op.meta["rid"]), refund_by_id.get((a.refund or {}).get("refund_id"))
            if r is None or rf is None:
                continue  # reported above
            t = rf["created_at"]
            since = [o["id"] for o in res_by_asset[r["asset_id"]] if o["id"] != r["id"]
                     and r["created_at"] <= o["created_at"] <= t + 1e-5]
            gone = [w for w in withdrawals[r["asset_id"]] if r["expires_at"] - 1e-5 <= w <= t + 1e-5]
            if not since and not gone:
                v.add("late-commit-refused",
                      f"{r['id']}: late payment {op.meta['pref']} refunded at {iso(t)} by "
                      f"accept-if-free instances though nobody held {r['asset_id']} since and it "
                      f"was not withdrawn")

        # Holds (and sales) against what the client saw of withdrawals and
        # sale openings: granted while certainly withdrawn or certainly gated
        # is a violation. Certainly: from a withdrawal's (or a sale opening's)
        # answer to the first request that might have undone it.
        log("checking holds against withdrawals and sale openings")

        def span(op):
            return op.attempts[0].t0, max(a.t1 for a in op.attempts)

        n_withdrawn_iv = n_gated_iv = 0
        for aid, kinds in assets_ops.items():
            withdrawn_iv, gated_iv = [], []
            for w in kinds["withdraw"]:
                ack = next((a for a in w.attempts if a.status == 200), None)
                if ack is None:
                    continue
                end = min([span(r)[0] for r in kinds["reinstate"] if span(r)[1] > span(w)[0]],
                          default=float("inf"))
                if ack.t1 < end:
                    withdrawn_iv.append((ack.t1, end))
            gates = [g for g in kinds["gate"] + kinds["create_asset"]
                     if g.meta.get("available_from") or g.kind == "gate"]
            for g in gates:
                ack = next((a for a in g.attempts if a.status in (200, 201)), None)
                t = parse_ts((ack.body or {}).get("available_from")) \
                    if ack is not None and isinstance(ack.body, dict) else None
                if t is None:
                    continue
                end = min([t - M] + [span(o)[0] for o in gates
                                     if o is not g and span(o)[1] > span(g)[0]])
                if ack.t1 < end:
                    gated_iv.append((ack.t1, end, t))
            n_withdrawn_iv += len(withdrawn_iv)
            n_gated_iv += len(gated_iv)
            first_withdraw = min((span(w)[0] for w in kinds["withdraw"]), default=float("inf"))
            for op in kinds["hold"]:
                for a in op.attempts:
                    if a.status == 201:
                        for s, e in withdrawn_iv:
                            if s <= a.t0 and a.t1 <= e:
                                v.add("hold-while-withdrawn",
                                      f"hold key={op.key} of {aid} answered 201 in "
                                      f"[+{a.t0 - _t_origin:.2f}s, +{a.t1 - _t_origin:.2f}s], "
                                      f"after its withdrawal was acknowledged and before any "
                                      f"reinstatement was sent")
                        for s, e, t in gated_iv:
                            if s <= a.t0 and a.t1 <= e:
                                v.add("hold-before-sale-open",
                                      f"hold key={op.key} of {aid} answered 201 "
                                      f"{t - a.t1:.2f}s before its sale opened at {iso(t)}")
                    elif a.code == "ASSET_UNAVAILABLE" and isinstance(a.body, dict) and \
                            a.body.get("asset_status") == "WITHDRAWN" and a.t1 < first_withdraw:
                        v.add("hold-while-withdrawn",
                              f"hold key={op.key} of {aid}: WITHDRAWN before any withdrawal "
                              f"was sent")
            for op in kinds["commit"]:
                for a in op.attempts:
                    if a.status == 200 and not a.replayed and \
                            any(s <= a.t0 and a.t1 <= e for s, e in withdrawn_iv):
                        v.add("sold-while-withdrawn", f"commit key={op.key} of {aid} answered "
                                                      f"200 while it was withdrawn")
            for op in kinds["reinstate"]:
                for a in op.attempts:
                    if a.status == 200 and isinstance(a.body, dict) and \
                            a.body.get("status") == "WITHDRAWN" and \
                            not any(span(w)[0] <= a.t1 and span(w)[1] >= a.t0
                                    for w in kinds["withdraw"]):
                        v.add("reinstate", f"reinstate of {aid} answered WITHDRAWN with no "
                                           f"withdrawal under way")

        # Listings against the database: nothing moves now but lapsing holds,
        # so the ids of each listing, newest first, are known exactly.
        log("listing reservations")
        rng = random.Random(self.args.seed)
        with_res = sorted(res_by_asset)
        buyers = sorted({r["buyer_id"] for r in res_db.values()})
        queries = [{"status": "VOIDED", "limit": 7}, {"status": "COMMITTED", "limit": 500},
                   {"status": "RELEASED", "limit": 250}]
        queries += [{"asset_id": aid, "limit": 3}
                    for aid in rng.sample(with_res, min(40, len(with_res)))]
        queries += [{"buyer_id": b, "limit": 25} for b in rng.sample(buyers, min(12, len(buyers)))]
        for query, items, error in self.list_all(queries):
            if error:
                v.add("list", error)
                continue
            field, value = next((k, q) for k, q in query.items() if k != "limit")
            want = sorted((rid for rid, r in res_db.items() if r[field] == value), reverse=True)
            ids = [it.get("reservation_id") for it in items]
            if ids != want:
                v.add("list", f"GET /v1/reservations?{field}={value} (limit {query['limit']}): "
                              f"{len(ids)} items, database {len(want)}; missing "
                              f"{sorted(set(want) - set(ids))[:3]}, extra "
                              f"{sorted(set(ids) - set(want))[:3]}, order ok "
                              f"{ids == sorted(ids, reverse=True)}")
            for it in items:
                r = res_db.get(it.get("reservation_id"))
                if r and r["status"] in ("COMMITTED", "VOIDED", "RELEASED") \
                        and it.get("status") != r["status"]:
                    v.add("list", f"listing shows {r['id']} {it.get('status')}, database "
                                  f"{r['status']}")
        self.figures["listings"] = len(queries)

        for op in self.verify_ops:
            for a in op.attempts:
                if a.status is not None and a.status >= 500 and a.status != 503:
                    v.add("5xx", f"{a.status} {a.code} for GET {op.path}: {a.raw[:300]!r}")
                elif a.status is not None and not a.retryable and a.status != 200:
                    v.add("lost-write" if op.path.startswith("/v1/reservations/")
                          else "unexpected-answer", f"GET {op.path} answered {a.label()}")
                else:
                    self.check_effective(a)

        # Crashes the process logs may reveal.
        for inst in self.instances:
            text = tail(inst.log_path, 100000)
            if "panicked" in text:
                v.add("panic", f"{inst.name} log has a panic: see {inst.log_path}")

        # Figures.
        by_kind = collections.Counter()
        for a in attempts:
            by_kind[f"{a.op.kind} {a.label()}"] += 1
        final_by_kind = collections.defaultdict(collections.Counter)
        attempts_by_kind = collections.Counter()
        for op in ops:
            final_by_kind[op.kind][op.final.label() if op.final else "unanswered"] += 1
            attempts_by_kind[op.kind] += len(op.attempts)
        lat = sorted(a.t1 - a.t0 for a in attempts if a.status is not None)
        pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else 0  # noqa: E731
        f = self.figures
        f.update({
            "requests": len(attempts),
            "ops": len(ops),
            "by_status": collections.Counter(a.label() for a in attempts),
            "by_kind": by_kind,
            "final_by_kind": final_by_kind,
            "attempts_by_kind": attempts_by_kind,
            "replays": sum(1 for a in attempts if a.replayed),
            "retry_replays": sum(1 for a in attempts if a.replayed and a.phase != "dup"),
            "retries": sum(1 for op in ops for a in op.attempts[1:] if a.phase != "dup"),
            "duplicates": sum(1 for a in attempts if a.phase == "dup"),
            "conn_errors": sum(1 for a in attempts if a.status is None),
            "503": sum(1 for a in attempts if a.status == 503),
            "503_window": window_503,
            "conn_window": window_conn,
            "2xx_window": window_2xx,
            "windows": [round(w1 - w0, 2) for w0, w1 in self.windows],
            "outages": [round(o1 - o0, 2) for o0, o1 in self.outages],
            "outage_answers": outage_answers,
            "kill_windows": [round(w1 - w0, 2) for w0, w1 in self.kill_windows],
            "late_commits": len(late),
            "holds_refused": collections.Counter(
                f"{op.final.code} {(op.final.body or {}).get('asset_status', '')}".strip()
                for op in by_kind_ops(ops, "hold") if op.final is not None
                and op.final.status == 409 and isinstance(op.final.body, dict)),
            "late_accepted": len(late_accepted),
            "late_sold": late_sold,
            "late_refused_free": late_refused_free,
            "refunds_answered": len(refunds_seen),
            "refunds_db": len(db["refunds"]),
            "reservations_db": len(res_db),
            "hold_keys_ok": len(hold_keys_ok),
            "committed": len(committed),
            "released": len(released),
            "forced_releases": forced,
            "voided": len(voided),
            "voided_refund": sum(1 for op in voided.values() if op.meta["refund"]),
            "extended": sum(len(x) for x in extended.values()),
            "extended_res": len(extended),
            "withdrawn_intervals": n_withdrawn_iv,
            "gated_intervals": n_gated_iv,
            "assets_created": self.pool.created,
            "verify_gets": self.verify_rec.n_attempts,
            "impatient": sum(1 for a in attempts if a.timeout < HTTP_TIMEOUT),
            "impatient_lost": sum(1 for a in attempts if a.timeout < HTTP_TIMEOUT
                                  and a.status is None),
            "latency": (pct(0.5), pct(0.99), lat[-1] * 1000 if lat else 0),
            "intents": self.ctx.intents,
        })

    def summary(self):
        f = self.figures
        print(f"\n== summary ({self.backend})")
        print(f"  instances {len(self.instances)} (late commits: "
              + ", ".join(f"{i.name} " + "→".join(m for n, (_, m) in enumerate(i.modes)
                                                 if n == 0 or i.modes[n - 1][1] != m)
                          for i in self.instances)
              + f"), client threads {self.threads}, load {getattr(self, 'load_seconds', 0):.1f}s")
        if "requests" not in f:
            print("  (no figures: the run did not reach its checks)")
        else:
            print(f"  requests {f['requests']} ({f['ops']} logical requests; "
                  f"{f['verify_gets']} GETs to verify, {f['listings']} listings)")
            print("  by status: " + ", ".join(f"{k}={n}" for k, n in sorted(f["by_status"].items())))
            print("  per operation, logical requests by final answer [attempts]:")
            for kind in sorted(f["final_by_kind"]):
                c = f["final_by_kind"][kind]
                print(f"    {kind:<12} {sum(c.values()):>6} [{f['attempts_by_kind'][kind]:>6}]: "
                      + ", ".join(f"{k}={n}" for k, n in sorted(c.items())))
            print("  flows: " + ", ".join(f"{k}={n}" for k, n in sorted(f["intents"].items())))
            print(f"  replays {f['replays']} ({f['retry_replays']} answering blind retries, the "
                  f"rest deliberate duplicates); blind retries {f['retries']}, deliberate "
                  f"duplicates {f['duplicates']}, connection errors {f['conn_errors']}")
            print(f"  impatient attempts {f['impatient']} (answer lost: {f['impatient_lost']}); "
                  f"latency ms p50 {f['latency'][0]:.0f}, p99 {f['latency'][1]:.0f}, "
                  f"max {f['latency'][2]:.0f}")
            print(f"  kills {self.kills}, instance restarts {self.instance_restarts} "
                  f"(down+ready s: {f['kill_windows']}), database restarts {self.db_restarts} "
                  f"(window s: {f['windows']})")
            print(f"  503 total {f['503']}, 503 in window {f['503_window']} (outside it "
                  f"{f['503'] - f['503_window']}), connection errors in window "
                  f"{f['conn_window']}, 2xx in window {f['2xx_window']}")
            if self.outages:
                print(f"  database fully down for {f['outages']} s; requests sent and answered "
                      f"then: " + (", ".join(f"{k}={n}" for k, n in
                                             sorted(f["outage_answers"].items())) or "none"))
            print(f"  unanswered after retries {f.get('unanswered_after_load', 0)} "
                  f"(retried to an answer at the end)")
            print(f"  reservations in db {f['reservations_db']}, hold keys acknowledged "
                  f"{f['hold_keys_ok']}; committed {f['committed']} (voided {f['voided']}, "
                  f"{f['voided_refund']} with refund), released {f['released']} (+{f['forced_releases']} "
                  f"by forced withdrawals), assets created {f['assets_created']}")
            print(f"  extensions acknowledged {f['extended']} on {f['extended_res']} holds; "
                  f"withdrawals certain for {f['withdrawn_intervals']} intervals, sale openings "
                  f"for {f['gated_intervals']}")
            print(f"  late payments: refunded {f['late_commits']} ({f['late_refused_free']} by "
                  f"accept-if-free instances only, each to be explained by a hold since or a "
                  f"withdrawal), accepted {f['late_accepted']} (sales after expiry in db: "
                  f"{f['late_sold']})")
            print("  holds refused: " + ", ".join(f"{k}={n}" for k, n in
                                                  sorted(f["holds_refused"].items())))
            print(f"  refunds answered {f['refunds_answered']}, refunds in db {f['refunds_db']}")
        print(f"  audit: {self.audit_summary}")
        self.v.print()
        print(f"  violations={self.v.total()}")


def by_kind_ops(ops, kind):
    return [op for op in ops if op.kind == kind]


# --------------------------------------------------------------------------


def build_binary() -> str:
    """cargo build, then the executable cargo reports: wherever the target
    directory is (CARGO_TARGET_DIR, a config file, the default target/)."""
    log("cargo build --bin holdfast")
    r = subprocess.run(["cargo", "build", "--bin", "holdfast", "--message-format=json"],
                       cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError("cargo build failed")
    for line in r.stdout.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") \
                and msg.get("target", {}).get("name") == "holdfast":
            return msg["executable"]
    raise RuntimeError("cargo build did not report the holdfast executable")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["postgres", "sqlite", "both"], default="both")
    p.add_argument("--seconds", type=float, default=90.0, help="seconds of load per backend")
    p.add_argument("--bin", help="holdfast binary (default: cargo build, and the executable "
                                 "it reports)")
    p.add_argument("--assets", type=int, default=200, help="assets seeded")
    p.add_argument("--pg-threads", type=int, default=24)
    p.add_argument("--sqlite-threads", type=int, default=12)
    p.add_argument("--down-seconds", type=float, default=3.0,
                   help="how long a killed instance stays down")
    p.add_argument("--db-down-seconds", type=float, default=2.0,
                   help="how long PostgreSQL stays stopped in its restart (0: a plain "
                        "pg_ctlcluster restart)")
    p.add_argument("--late-commit", choices=["mixed", *LATE_MODES], default="mixed",
                   help="HOLDFAST_LATE_COMMIT of the instances; mixed: PostgreSQL's third "
                        "instance accept-if-free, SQLite's instance accept-if-free after its "
                        "restart, the others refund")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--time-limit", type=float, default=None,
                   help="hard bound on the whole run in seconds (default: per backend "
                        "seconds + 240)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = p.parse_args()
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    backends = ["postgres", "sqlite"] if args.backend == "both" else [args.backend]

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)

    binary = os.path.abspath(args.bin) if args.bin else build_binary()
    if not os.access(binary, os.X_OK):
        print(f"chaos: {binary} is not an executable", file=sys.stderr)
        return 2

    limit = args.time_limit or len(backends) * (args.seconds + 240)

    def watchdog():
        log(f"time limit of {limit:.0f}s reached: killing everything")
        CLEANUP.run()
        os._exit(3)

    timer = threading.Timer(limit, watchdog)
    timer.daemon = True
    timer.start()

    workdir = tempfile.mkdtemp(prefix="holdfast-chaos-")
    log(f"seed {args.seed}, binary {binary}, work dir {workdir}, time limit {limit:.0f}s")
    phases = []
    try:
        for backend in backends:
            d = os.path.join(workdir, backend)
            os.makedirs(d)
            phase = Phase(backend, args, binary, d)
            phases.append(phase)
            try:
                phase.run()
            except SystemExit:
                raise
            except Exception as e:  # noqa: BLE001
                where = traceback.extract_tb(e.__traceback__)[-1]
                phase.v.add("harness", f"{type(e).__name__}: {e} (chaos.py line {where.lineno}, "
                                       f"in {where.name})")
            finally:
                for inst in phase.instances:
                    inst.kill9()
                phase.drop_database()
            phase.summary()
    finally:
        timer.cancel()
        CLEANUP.run()
    total = sum(ph.v.total() for ph in phases)
    print("\n== chaos: " + "; ".join(f"{ph.backend} violations={ph.v.total()}" for ph in phases)
          + f"; total violations={total}")
    if total == 0 and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"logs kept in {workdir}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
