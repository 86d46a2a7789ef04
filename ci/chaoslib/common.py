"""What every part of the chaos run shares: where things are, the run's
timing bounds, the log, and timestamps."""

from __future__ import annotations

import datetime
import os
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCUMENT = os.path.join(ROOT, "openapi", "holdfast.json")
HOST = "127.0.0.1"

HTTP_TIMEOUT = 8.0          # seconds per request (the service bounds DB work at 3 s)
MAX_ATTEMPTS = 10           # per request during the load
RESOLVE_ATTEMPTS = 25       # per request left without an answer, after the load
BACKOFF_BASE = 0.1
BACKOFF_CAP = 1.0
EXPIRY_MARGIN = 0.5         # seconds of slack when judging timing against expires_at
TS_EPS = 1e-3               # seconds: two renderings of one stored instant

# The hold bounds of the run's instances: short holds, and a cap on a hold's
# whole life (extensions included) that extensions reach within seconds.
HOLD_SECONDS_MAX = 8
HOLD_MAX_TOTAL_SECONDS = 12
LATE_MODES = ("refund", "accept-if-free")

T_ORIGIN = time.time()
_print_lock = threading.Lock()


def log(msg: str) -> None:
    with _print_lock:
        print(f"[chaos +{time.time() - T_ORIGIN:7.1f}s] {msg}", flush=True)


def parse_ts(text):
    if not text:
        return None
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc) \
        .isoformat(timespec="milliseconds").replace("+00:00", "Z")


def rel(t: float) -> str:
    """An instant as the log shows it: seconds since the run began."""
    return f"+{t - T_ORIGIN:.2f}s"
