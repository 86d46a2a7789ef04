"""Starting a holdfast service for a benchmark script, and its database."""

from __future__ import annotations

import http.client
import os
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
