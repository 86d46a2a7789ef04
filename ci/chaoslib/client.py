"""The client side of the run: every request as sent and answered, kept for
the checks, and the blind retries of a client that never saw an answer."""

from __future__ import annotations

import collections
import http.client
import json
import random
import threading
import time
import uuid

from .common import BACKOFF_BASE, BACKOFF_CAP, HOST, HTTP_TIMEOUT, MAX_ATTEMPTS

# Some attempts give up almost at once, while the service is still working on
# them: the answer is lost whether or not the change committed, and the retry
# must replay (or wait for the running duplicate), never act again.
IMPATIENT_SHARE = 0.04
IMPATIENT_TIMEOUT = (0.002, 0.08)

# Answers a client treats as "no answer": it retries with the same key and
# body. IDEMPOTENCY_KEY_IN_USE answers a duplicate only when the first attempt
# still runs after the duplicate waited its call timeout for it.
RETRYABLE_CODES = {"IDEMPOTENCY_KEY_IN_USE", "RATE_LIMITED"}


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

