#!/usr/bin/env python3
"""A bounded chaos run against holdfast, on PostgreSQL and/or SQLite.

    python3 ci/chaos.py [--backend postgres|sqlite|both] [--seconds N] [--bin PATH]

PostgreSQL: a fresh database, three instances on it (janitors every second),
~200 seeded assets and two dozen client threads holding, committing (at once
and late, past the hold's expiry), releasing, and blindly retrying with the
same Idempotency-Key and body after any connection error, timeout or 503 (on
another instance). Mid-run one instance is killed with SIGKILL and started
again a few seconds later, and later PostgreSQL itself is restarted.

SQLite: one instance on a file, a dozen client threads, the instance killed
with SIGKILL mid-run and started again on the same file.

Then, with every instance answering again: requests left without an answer
are retried with their key until they get one, `holdfast audit --json` must
exit 0, and the client's own record is checked against the service and the
database: acknowledged writes are all there, a retried request never acted
twice, no 5xx other than 503, one refund per refused payment. Any violation
makes the exit status 1. Python standard library only.
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

# Statuses the client treats as "no answer": retry with the same key and body.
RETRYABLE_CODES = {"IDEMPOTENCY_KEY_IN_USE", "RATE_LIMITED"}

# What each kind of request may legitimately answer (besides the retryable ones).
EXPECTED = {
    "create_asset": {(201, None), (409, "ASSET_EXISTS")},
    "hold": {(201, None), (200, None), (409, "ASSET_UNAVAILABLE")},
    "commit": {
        (200, None),
        (409, "HOLD_EXPIRED"),
        (409, "RESERVATION_NOT_ACTIVE"),
        (409, "ALREADY_COMMITTED"),
        # PAYMENT_REFERENCE_USED is left out: every payment reference here is
        # fresh, so it would be a bug.
    },
    "release": {(200, None), (409, "RESERVATION_NOT_ACTIVE")},
}
REFUND_CODES = {
    "HOLD_EXPIRED": "HOLD_EXPIRED",
    "RESERVATION_NOT_ACTIVE": "RESERVATION_RELEASED",
    "ALREADY_COMMITTED": "ALREADY_COMMITTED",
}

_print_lock = threading.Lock()
_t_origin = time.time()


def log(msg: str) -> None:
    with _print_lock:
        print(f"[chaos +{time.time() - _t_origin:7.1f}s] {msg}", flush=True)


def parse_ts(text):
    if not text:
        return None
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


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
    def __init__(self, name, binary, db_url, workdir):
        self.name = name
        self.binary = binary
        self.db_url = db_url
        self.port = free_port()
        self.log_path = os.path.join(workdir, f"{name}.log")
        self.proc = None
        self.starts = 0

    def env(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HOLDFAST_")}
        env.update({
            "HOLDFAST_DATABASE_URL": self.db_url,
            "HOLDFAST_BIND": f"{HOST}:{self.port}",
            "HOLDFAST_JANITOR_INTERVAL_SECONDS": "1",
            "HOLDFAST_HOLD_SECONDS_MIN": "1",
            "HOLDFAST_MAX_HOLDS_PER_BUYER": "0",
            "RUST_LOG": "warn",
        })
        return env

    def start(self):
        logf = open(self.log_path, "ab")
        logf.write(f"\n==== start {self.starts + 1} at {time.time():.3f}\n".encode())
        logf.flush()
        self.proc = subprocess.Popen([self.binary, "serve"], env=self.env(), stdout=logf,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        logf.close()
        CLEANUP.add_proc(self.proc)
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


def create_asset(ctx, http_, rng, phase="load"):
    asset_id = ctx.pool.next_id()
    op = ctx.rec.new_op("create_asset", "POST", "/v1/assets",
                        {"id": asset_id, "name": f"Chaos lot {asset_id}"}, False,
                        {"asset_id": asset_id})
    a = perform(ctx.rec, http_, op, ctx.ports, phase=phase, rng=rng)
    if a is not None and (a.status == 201 or (a.status == 409 and a.code == "ASSET_EXISTS")):
        ctx.pool.add(asset_id)
        with ctx.pool.lock:
            ctx.pool.created += 1
    return a


def maybe_duplicate(ctx, http_, rng, op, a):
    """Sometimes send an answered request once more, as a client that never saw
    the answer would: same key, same body, any instance."""
    if a is None or not a.good or rng.random() >= 0.12:
        return
    with ctx.lock:
        ctx.dups += 1
    send(ctx.rec, http_, op, rng.choice(ctx.ports), "dup", rng)


def commit(ctx, http_, rng, rid, asset_id, expires_at, intent, pref=None):
    pref = pref or f"pay-{uuid.uuid4().hex[:20]}"
    op = ctx.rec.new_op("commit", "POST", f"/v1/reservations/{rid}/commit",
                        {"payment_reference": pref}, True,
                        {"rid": rid, "asset_id": asset_id, "pref": pref,
                         "expires_at": expires_at, "intent": intent})
    with ctx.lock:
        ctx.intents[intent] += 1
    a = perform(ctx.rec, http_, op, ctx.ports, rng=rng)
    maybe_duplicate(ctx, http_, rng, op, a)
    if a is not None and a.status == 200:
        # Sold: take it out of the pool and put a fresh asset in.
        if ctx.pool.remove(asset_id):
            create_asset(ctx, http_, rng)
    return a


def release(ctx, http_, rng, rid, asset_id, expires_at, intent):
    op = ctx.rec.new_op("release", "POST", f"/v1/reservations/{rid}/release", {}, True,
                        {"rid": rid, "asset_id": asset_id, "expires_at": expires_at,
                         "intent": intent})
    with ctx.lock:
        ctx.intents[intent] += 1
    a = perform(ctx.rec, http_, op, ctx.ports, rng=rng)
    maybe_duplicate(ctx, http_, rng, op, a)
    return a


def client(ctx: Context, tid: int):
    rng = random.Random(ctx.seed * 1000 + tid)
    http_ = Http()
    home = ctx.ports[tid % len(ctx.ports)]
    rec = ctx.rec
    # Late actions wait here, so that the thread keeps working meanwhile.
    later: list = []
    seq = 0

    def defer(at, fn, *fargs):
        nonlocal seq
        seq += 1
        if at <= ctx.deadline:
            heapq.heappush(later, (at, seq, functools.partial(fn, *fargs)))

    while True:
        now = time.time()
        if later and later[0][0] <= min(now, ctx.deadline):
            heapq.heappop(later)[2]()
            continue
        if now >= ctx.deadline:
            break
        asset_id = ctx.pool.pick(rng)
        if asset_id is None:
            create_asset(ctx, http_, rng)
            continue
        buyer = f"buyer-{rng.randrange(500):03d}"
        hold_s = rng.randint(1, 5)
        op = rec.new_op("hold", "POST", f"/v1/assets/{asset_id}/reservations",
                        {"buyer_id": buyer, "hold_seconds": hold_s}, True,
                        {"asset_id": asset_id, "buyer_id": buyer})
        a = perform(rec, http_, op, ctx.ports, rng=rng, first_port=home)
        maybe_duplicate(ctx, http_, rng, op, a)
        if a is None:
            continue
        if a.status == 409:
            if isinstance(a.body, dict) and a.body.get("asset_status") == "SOLD":
                ctx.pool.remove(asset_id)
            time.sleep(rng.uniform(0, 0.05))
            continue
        if a.status not in (200, 201) or not isinstance(a.body, dict):
            continue
        rid = a.body.get("reservation_id")
        expires_at = parse_ts(a.body.get("expires_at"))
        if not rid or expires_at is None:
            continue
        r = rng.random()
        if r < 0.38:
            c = commit(ctx, http_, rng, rid, asset_id, expires_at, "commit-now")
            if c is not None and c.status == 200:
                s = rng.random()
                if s < 0.08:  # a second payment for a sold reservation: refunded
                    commit(ctx, http_, rng, rid, asset_id, expires_at, "second-payment")
                elif s < 0.13:  # the same payment under a new key: 200, nothing changes
                    commit(ctx, http_, rng, rid, asset_id, expires_at, "same-payment",
                           pref=c.op.meta["pref"])
                elif s < 0.17:  # release after the sale: 409
                    release(ctx, http_, rng, rid, asset_id, expires_at, "release-sold")
        elif r < 0.56:
            # Late commit: the payment arrives after the hold lapsed.
            defer(expires_at + rng.uniform(0.2, 1.5), commit, ctx, http_, rng, rid, asset_id,
                  expires_at, "late")
        elif r < 0.78:
            rl = release(ctx, http_, rng, rid, asset_id, expires_at, "release-now")
            if rl is not None and rl.status == 200:
                s = rng.random()
                if s < 0.25:  # the payment arrives after the release: refunded
                    commit(ctx, http_, rng, rid, asset_id, expires_at, "after-release")
                elif s < 0.35:
                    release(ctx, http_, rng, rid, asset_id, expires_at, "release-again")
        elif r < 0.86:
            # Abandoned, then released too late.
            defer(expires_at + rng.uniform(0.2, 1.0), release, ctx, http_, rng, rid, asset_id,
                  expires_at, "late-release")
        # else: abandoned; the janitor or the next hold expires it.
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
                                           self.workdir))
        for inst in self.instances:  # all at once: migrations must be safe concurrently
            inst.start()
        for inst in self.instances:
            inst.wait_ready()
        log(f"{self.backend}: {n} instance(s) ready on ports "
            f"{', '.join(str(i.port) for i in self.instances)} ({self.db_url})")

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
        log(f"starting {inst.name} again")
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

    def db_rows(self):
        """From the database: reservation count, reservations, refunds, duplicate refunds,
        assets with several COMMITTED reservations."""
        res_sql = "SELECT id, status, COALESCE(payment_reference, ''), asset_id FROM reservations"
        ref_sql = "SELECT reservation_id, payment_reference, id FROM refunds"
        dup_sql = ("SELECT reservation_id, payment_reference, count(*) FROM refunds "
                   "GROUP BY 1, 2 HAVING count(*) <> 1")
        sold_sql = ("SELECT asset_id, count(*) FROM reservations WHERE status = 'COMMITTED' "
                    "GROUP BY 1 HAVING count(*) > 1")
        if self.backend == "postgres":
            q = lambda s: psql(s, db=self.db_name)  # noqa: E731
            count = int(q("SELECT count(*) FROM reservations")[0][0])
            return count, q(res_sql), q(ref_sql), q(dup_sql), q(sold_sql)
        conn = sqlite3.connect(f"file:{self.sqlite_path}?mode=ro", uri=True, timeout=30)
        try:
            q = lambda s: [list(map(str, row)) for row in conn.execute(s).fetchall()]  # noqa: E731
            count = int(conn.execute("SELECT count(*) FROM reservations").fetchone()[0])
            return count, q(res_sql), q(ref_sql), q(dup_sql), q(sold_sql)
        finally:
            conn.close()

    def get_all(self, paths):
        """GETs every path (retrying connection errors and 503), in parallel."""
        results = {}
        local = threading.local()
        stop_at = time.time() + 120

        def one(path):
            if not hasattr(local, "http"):
                local.http = Http()
            rng = random.Random()
            op = Op(-1, "get", "GET", path, None, None, {})
            with self.verify_rec.lock:
                self.verify_ops.append(op)
            for n in range(RESOLVE_ATTEMPTS):
                a = send(self.verify_rec, local.http, op, rng.choice(self.ports), "verify")
                if not a.retryable or time.time() > stop_at:
                    return path, a
                time.sleep(min(BACKOFF_CAP, BACKOFF_BASE * 2 ** n))
            return path, op.attempts[-1]

        with concurrent.futures.ThreadPoolExecutor(16) as ex:
            for path, a in ex.map(one, paths):
                results[path] = a
        return results

    def verify(self):
        v = self.v
        rec = self.rec
        self.verify_rec = Recorder()
        self.verify_ops = []
        print(f"\n== checks ({self.backend})")
        self.audit()

        ops = rec.ops
        attempts = [a for op in ops for a in op.attempts]

        # 4. No 5xx other than 503, ever; and nothing the contract does not allow.
        for a in attempts:
            if a.status is not None and a.status >= 500 and a.status != 503:
                v.add("5xx", f"{a.status} {a.code} for {a.op.kind} {a.op.path} key={a.op.key} "
                             f"at +{a.t0 - _t_origin:.2f}s: {a.raw[:300]!r}")
            elif a.status is not None and not a.retryable:
                if (a.status, a.code) not in EXPECTED[a.op.kind]:
                    v.add("unexpected-answer", f"{a.label()} for {a.op.kind} {a.op.path} "
                                               f"key={a.op.key} body={a.op.payload}: "
                                               f"{a.raw[:300]!r}")
                elif a.op.kind == "hold" and (a.status == 200) != a.replayed:
                    # A hold is 201 when it acts, 200 only as a replay.
                    v.add("idempotency", f"hold key={a.op.key} answered {a.status} with "
                                         f"Idempotent-Replayed={a.replayed}")
                elif a.op.kind == "commit" and a.code in REFUND_CODES:
                    rf = a.refund
                    if rf is None or rf.get("reason") != REFUND_CODES[a.code]:
                        v.add("refund", f"commit {a.op.path} answered {a.code} without the "
                                        f"refund it must carry: {a.raw[:300]!r}")
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
        released = set()
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
                        first = op.attempts[0]
                        # (A same-payment commit of a sold reservation is 200 at any time.)
                        if op.meta["intent"] != "same-payment" and \
                                first.t0 > op.meta["expires_at"] + EXPIRY_MARGIN:
                            v.add("late-commit-accepted",
                                  f"{rid}: commit first sent {first.t0 - op.meta['expires_at']:.2f}s "
                                  f"after expires_at was answered 200")
                    else:
                        rf = a.refund
                        refunds_seen.setdefault((rid, pref), set()).add(rf.get("refund_id"))
                        if a.code == "HOLD_EXPIRED":
                            late.add((rid, pref, rf.get("refund_id")))
                            last = op.attempts[-1]
                            if last.t1 < op.meta["expires_at"] - EXPIRY_MARGIN:
                                v.add("live-hold-refused",
                                      f"{rid}: HOLD_EXPIRED answered "
                                      f"{op.meta['expires_at'] - last.t1:.2f}s before expires_at")
            elif op.kind == "release":
                if any(a.status == 200 for a in goods):
                    released.add(op.meta["rid"])
                    first = op.attempts[0]
                    # (Releasing a released reservation again is 200 at any time.)
                    if op.meta["intent"] != "release-again" and \
                            first.t0 > op.meta["expires_at"] + EXPIRY_MARGIN:
                        v.add("late-release-accepted",
                              f"{op.meta['rid']}: release first sent "
                              f"{first.t0 - op.meta['expires_at']:.2f}s after expires_at "
                              f"was answered 200")

        # 2. Acknowledged writes are never lost: read every reservation back.
        rids = sorted(set(held) | {op.meta["rid"] for op in ops if op.kind in ("commit", "release")})
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
            if s.get("status") != "COMMITTED" or s.get("payment_reference") != pref:
                v.add("lost-write", f"commit of {rid} with {pref} acknowledged; GET shows "
                                    f"{s.get('status')} {s.get('payment_reference')}")
            c_at, e_at = parse_ts(s.get("committed_at")), parse_ts(s.get("expires_at"))
            if c_at is not None and e_at is not None and c_at > e_at:
                v.add("late-commit-accepted", f"{rid}: committed_at {s.get('committed_at')} "
                                              f"after expires_at {s.get('expires_at')}")
        for rid in released:
            s = state.get(rid)
            if not s:
                continue
            if s.get("status") == "COMMITTED":
                v.add("released-then-committed", f"{rid} released (200) and later COMMITTED")
            elif s.get("status") != "RELEASED":
                v.add("lost-write", f"release of {rid} acknowledged; GET shows {s.get('status')}")
        # The assets of acknowledged sales read SOLD, to that reservation.
        sold_assets = {}
        for rid in committed:
            s = state.get(rid)
            if s:
                sold_assets[s["asset_id"]] = rid
        assets = self.get_all([f"/v1/assets/{aid}" for aid in sorted(sold_assets)])
        for aid, rid in sold_assets.items():
            a = assets[f"/v1/assets/{aid}"]
            body = a.body if isinstance(a.body, dict) else {}
            if a.status != 200 or body.get("status") != "SOLD" \
                    or body.get("current_reservation_id") != rid:
                v.add("lost-write", f"asset {aid} sold to {rid}; GET shows {a.label()} "
                                    f"{body.get('status')} {body.get('current_reservation_id')}")

        # 5. One refund per refused payment, shown on the reservation.
        count, db_res, db_ref, db_ref_dups, db_sold_twice = self.db_rows()
        for row in db_ref_dups:
            v.add("refund", f"refunds for (reservation, payment) {row[0]}, {row[1]}: {row[2]} rows")
        for row in db_sold_twice:
            v.add("sold-twice", f"asset {row[0]} has {row[1]} COMMITTED reservations")
        db_refunds = collections.defaultdict(list)
        for rid, pref, rf_id in db_ref:
            db_refunds[(rid, pref)].append(rf_id)
        for (rid, pref), ids in refunds_seen.items():
            rows = db_refunds.get((rid, pref), [])
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

        # 3 (cont.) and 2 (cont.): the database holds exactly what was acknowledged.
        db_ids = {row[0] for row in db_res}
        if count != len(hold_keys_ok):
            v.add("count", f"{count} reservations in the database, {len(hold_keys_ok)} hold keys "
                           f"acknowledged with 201/200")
        for rid in sorted(db_ids - set(held))[:50]:
            v.add("count", f"reservation {rid} in the database was never acknowledged")
        for rid in sorted(set(held) - db_ids)[:50]:
            v.add("lost-write", f"acknowledged hold {rid} is not in the database")
        db_committed = {row[0]: row[2] for row in db_res if row[1] == "COMMITTED"}
        db_released = {row[0] for row in db_res if row[1] == "RELEASED"}
        if db_committed != committed:
            for rid in sorted(set(db_committed) ^ set(committed))[:50]:
                v.add("commit-set", f"{rid}: database COMMITTED with "
                                    f"{db_committed.get(rid)}, acknowledged {committed.get(rid)}")
            for rid in sorted(r for r in set(db_committed) & set(committed)
                              if db_committed[r] != committed[r])[:50]:
                v.add("commit-set", f"{rid}: database payment {db_committed[rid]}, "
                                    f"acknowledged {committed[rid]}")
        for rid in sorted(db_released ^ released)[:50]:
            v.add("release-set", f"{rid}: RELEASED in database {rid in db_released}, "
                                 f"acknowledged {rid in released}")

        for op in self.verify_ops:
            for a in op.attempts:
                if a.status is not None and a.status >= 500 and a.status != 503:
                    v.add("5xx", f"{a.status} {a.code} for GET {op.path}: {a.raw[:300]!r}")
                elif a.status is not None and not a.retryable and a.status != 200:
                    v.add("lost-write" if "/reservations/" in op.path else "unexpected-answer",
                          f"GET {op.path} answered {a.label()}")

        # Crashes the process logs may reveal.
        for inst in self.instances:
            text = tail(inst.log_path, 100000)
            if "panicked" in text:
                v.add("panic", f"{inst.name} log has a panic: see {inst.log_path}")

        # Figures.
        by_kind = collections.Counter()
        for a in attempts:
            by_kind[f"{a.op.kind} {a.label()}"] += 1
        lat = sorted(a.t1 - a.t0 for a in attempts if a.status is not None)
        pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else 0  # noqa: E731
        f = self.figures
        f.update({
            "requests": len(attempts),
            "ops": len(ops),
            "by_status": collections.Counter(a.label() for a in attempts),
            "by_kind": by_kind,
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
            "refunds_answered": len(refunds_seen),
            "refunds_db": len(db_ref),
            "reservations_db": count,
            "hold_keys_ok": len(hold_keys_ok),
            "committed": len(committed),
            "released": len(released),
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
        print(f"  instances {len(self.instances)}, client threads {self.threads}, "
              f"load {getattr(self, 'load_seconds', 0):.1f}s")
        if "requests" not in f:
            print("  (no figures: the run did not reach its checks)")
        else:
            print(f"  requests {f['requests']} ({f['ops']} logical requests; "
                  f"{f['verify_gets']} GETs to verify)")
            print("  by status: " + ", ".join(f"{k}={n}" for k, n in sorted(f["by_status"].items())))
            print("  by request: " + ", ".join(f"{k}={n}" for k, n in sorted(f["by_kind"].items())))
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
                  f"{f['hold_keys_ok']}; committed {f['committed']}, released {f['released']}, "
                  f"assets created {f['assets_created']}")
            print(f"  late commits refunded {f['late_commits']}, refunds answered "
                  f"{f['refunds_answered']}, refunds in db {f['refunds_db']}")
        print(f"  audit: {self.audit_summary}")
        self.v.print()
        print(f"  violations={self.v.total()}")


# --------------------------------------------------------------------------


def build_binary() -> str:
    log("cargo build --bin holdfast")
    r = subprocess.run(["cargo", "build", "--bin", "holdfast"], cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError("cargo build failed")
    target = os.environ.get("CARGO_TARGET_DIR") or "target"
    if not os.path.isabs(target):
        target = os.path.join(ROOT, target)
    return os.path.join(target, "debug", "holdfast")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["postgres", "sqlite", "both"], default="both")
    p.add_argument("--seconds", type=float, default=90.0, help="seconds of load per backend")
    p.add_argument("--bin", help="holdfast binary (default: cargo build, then target/debug)")
    p.add_argument("--assets", type=int, default=200, help="assets seeded")
    p.add_argument("--pg-threads", type=int, default=24)
    p.add_argument("--sqlite-threads", type=int, default=12)
    p.add_argument("--down-seconds", type=float, default=3.0,
                   help="how long a killed instance stays down")
    p.add_argument("--db-down-seconds", type=float, default=2.0,
                   help="how long PostgreSQL stays stopped in its restart (0: a plain "
                        "pg_ctlcluster restart)")
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
                phase.v.add("harness", f"{type(e).__name__}: {e}")
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
