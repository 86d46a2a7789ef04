"""Starting a holdfast service for a benchmark script, and its database."""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import time


def serve(binary: str, url: str, port: int, log: str, **settings: str) -> subprocess.Popen:
    """Starts `binary serve` on `url`, bound to 127.0.0.1:`port`, its janitor
    off unless `settings` say otherwise, with `settings` as further
    HOLDFAST_* variables; returns once it answers /readyz."""
    env = dict(os.environ, HOLDFAST_DATABASE_URL=url, HOLDFAST_BIND=f"127.0.0.1:{port}",
               HOLDFAST_JANITOR_INTERVAL_SECONDS="0", RUST_LOG="warn")
    env.update({f"HOLDFAST_{name.upper()}": value for name, value in settings.items()})
    proc = subprocess.Popen([binary, "serve"], env=env, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT)
    for _ in range(400):
        try:
            http.client.HTTPConnection("127.0.0.1", port, timeout=1).request("GET", "/readyz")
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"the service did not start: see {log}")


def wrk(port: int, env: dict, expected: set[str], threads: int = 2) -> dict:
    """One wrk run of bench/load.lua at 64 connections against the service on
    `port`, with `env` (BENCH_MODE and the rest, and the duration in
    BENCH_WRK_SECONDS): its requests, seconds, p99 (ms), the count of each
    status, and how many answers were none of `expected`."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(["wrk", f"-t{threads}", "-c64", f"-d{env['BENCH_WRK_SECONDS']}s", "-s",
                          os.path.join(root, "bench/load.lua"), f"http://127.0.0.1:{port}"],
                         check=True, capture_output=True, text=True, env=env).stdout
    statuses = dict(re.findall(r" (\d+)=(\d+)", re.search(r"^STATUSES.*$", out, re.M).group(0)))
    return {"requests": int(re.search(r"(\d+) requests in", out).group(1)),
            "seconds": float(re.search(r"seconds=([\d.]+)", out).group(1)),
            "p99": int(re.search(r"p99=(\d+)", out).group(1)) / 1000,
            "statuses": statuses,
            "bad": sum(int(c) for st, c in statuses.items() if st not in expected)}


def need_wrk() -> None:
    """Installs wrk from the distribution when it is missing (as run.sh does)."""
    if subprocess.run(["sh", "-c", "command -v wrk"], capture_output=True).returncode == 0:
        return
    print("installing wrk", flush=True)
    subprocess.run(["sh", "-c", "apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive "
                    "apt-get install -y -qq wrk >/dev/null"], check=True)


def psql(sql: str, db: str = "postgres") -> str:
    """The rows `sql` answers on database `db`, unaligned, `|` between columns;
    a failed statement raises."""
    return subprocess.run(["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1",
                           "-U", "postgres", "-d", db, "-c", sql], check=True, capture_output=True,
                          text=True).stdout.strip()
