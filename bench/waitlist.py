"""The flash sale with a waiting list, on each backend: BENCH_JOINS (10,000)
buyers queue for one held asset through wrk (64 connections), then the
holder releases and every release hands the asset to the queue's head, in
the release's own transaction. Measured, and written to bench/RESULTS.md
(section `waitlist`):

- the join rate, and the joins' p50/p99 (wrk);
- the hand-off latency: from sending a release of the current hold to its
  answer, by which time the head holds the asset (BENCH_HANDOFFS releases
  in a row, one connection), beside the same number of releases of an asset
  nobody waits for, in the same run;
- that every hand-off went to the head, in the order the queue listed.

    python3 bench/waitlist.py [--backend postgres|sqlite|both]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import sections  # noqa: E402
from service import need_wrk, psql, serve  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PG = "postgres://postgres@127.0.0.1:5432"
PORT = 18321


class Api:
    """One keep-alive connection to the service."""

    def __init__(self, port: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(self, method: str, path: str, body=None, key: str | None = None):
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Idempotency-Key"] = key
        data = json.dumps(body).encode() if body is not None else None
        self.conn.request(method, path, body=data, headers=headers)
        response = self.conn.getresponse()
        raw = response.read()
        return response.status, (json.loads(raw) if raw else None)

    def ok(self, method: str, path: str, body=None, key: str | None = None, want=(200, 201)):
        status, answer = self.call(method, path, body, key)
        if status not in want:
            raise SystemExit(f"{method} {path}: {status} {answer}")
        return answer


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def joins_with_wrk(api: "Api", joins: int) -> dict:
    """The crowd: wrk until the queue is full (its threads stop by then, but
    wrk itself only at the end of its duration or at SIGINT, which still
    prints the summary)."""
    env = dict(os.environ, BENCH_ASSET="FLASH", BENCH_JOINS=str(joins))
    wrk = subprocess.Popen(["wrk", "-t2", "-c64", "-d600s", "-s",
                            os.path.join(ROOT, "bench/join.lua"), f"http://127.0.0.1:{PORT}"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while time.time() < deadline and wrk.poll() is None:
        time.sleep(0.1)
        if api.ok("GET", "/v1/assets/FLASH")["waitlist_length"] >= joins:
            break
    wrk.send_signal(signal.SIGINT)
    out, err = wrk.communicate(timeout=60)
    if "STATUS" not in out:
        raise SystemExit(f"wrk gave no summary: {out} {err}")
    statuses = {int(s): int(n) for s, n in re.findall(r"^STATUS (\d+) (\d+)$", out, re.M)}
    requests, seconds = re.search(r"^REQUESTS (\d+) SECONDS ([\d.]+)$", out, re.M).groups()
    p50, p99 = re.search(r"^LATENCY p50=(\d+) p99=(\d+)$", out, re.M).groups()
    return {"statuses": statuses, "requests": int(requests), "seconds": float(seconds),
            "p50_ms": int(p50) / 1000, "p99_ms": int(p99) / 1000}


def join_rate(entries: list[dict]) -> float:
    """Joins per second, from the first join to the last, by the service's
    own clock (`joined_at`)."""
    def at(entry: dict) -> float:
        stamp = entry["joined_at"].rstrip("Z")
        whole, _, fraction = stamp.partition(".")
        seconds = time.mktime(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
        return seconds + float("0." + (fraction or "0"))
    span = at(entries[-1]) - at(entries[0])
    return (len(entries) - 1) / span if span > 0 else float("nan")


def timed(api: Api, method: str, path: str, body, key: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    answer = api.ok(method, path, body, key, want=(200,))
    return (time.perf_counter() - t0) * 1000, answer


def run_backend(binary: str, backend: str, joins: int, handoffs: int, work: str) -> dict:
    db = None
    if backend == "postgres":
        db = f"holdfast_bench_waitlist_{os.getpid()}"
        psql(f"CREATE DATABASE {db}")
        url = f"{PG}/{db}"
    else:
        url = f"sqlite://{work}/waitlist.db"
    proc = serve(binary, url, PORT, f"{work}/{backend}.log", waitlist_max=str(joins),
                 db_pool_size="64" if url.startswith("postgres") else "16")
    try:
        api = Api(PORT)
        api.ok("POST", "/v1/assets", {"id": "FLASH", "name": "The plate everyone wants"})
        api.ok("POST", "/v1/assets", {"id": "PLAIN", "name": "A plate nobody queues for"})
        api.ok("POST", "/v1/assets/FLASH/reservations",
               {"buyer_id": "holder", "hold_seconds": 3600}, key="hold-flash")
        print(f"{backend}: {joins} buyers join FLASH's queue (wrk, 64 connections)",
              file=sys.stderr)
        crowd = joins_with_wrk(api, joins)
        asset = api.ok("GET", "/v1/assets/FLASH")
        entries = api.ok("GET", "/v1/assets/FLASH/waitlist")["items"]
        crowd["rate"] = join_rate(entries)
        queue = [e["buyer_id"] for e in entries]
        assert asset["waitlist_length"] == len(queue) == joins, (asset, len(queue))

        print(f"{backend}: {handoffs} releases handing FLASH on, {handoffs} plain releases",
              file=sys.stderr)
        handed, plain = [], []
        for i in range(handoffs):
            rid = api.ok("GET", "/v1/assets/FLASH")["current_reservation_id"]
            ms, _ = timed(api, "POST", f"/v1/reservations/{rid}/release", {}, f"rel-f-{i}")
            handed.append(ms)
            now = api.ok("GET", "/v1/assets/FLASH")
            head = api.ok("GET", f"/v1/reservations/{now['current_reservation_id']}")
            if head["buyer_id"] != queue[i] or head["via"] != "waitlist":
                raise SystemExit(f"hand-off {i} went to {head['buyer_id']}, the head was {queue[i]}")
            rid = api.ok("POST", "/v1/assets/PLAIN/reservations", {"buyer_id": f"plain-{i}"},
                         key=f"hold-p-{i}")["reservation_id"]
            ms, _ = timed(api, "POST", f"/v1/reservations/{rid}/release", {}, f"rel-p-{i}")
            plain.append(ms)
        left = api.ok("GET", "/v1/assets/FLASH")["waitlist_length"]
        assert left == joins - handoffs, left
    finally:
        proc.terminate()
        proc.wait()
        if db:
            psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    return {"crowd": crowd, "handed": handed, "plain": plain}


def table(results: dict, joins: int, handoffs: int, took: float) -> str:
    lines = [
        "## Waiting list: a flash sale's queue (`bench/waitlist.py`)",
        "",
        f"Run on {time.strftime('%Y-%m-%d')}: {os.cpu_count()} CPUs, {platform.platform()}; "
        f"service, database and wrk share the machine; took {took:.0f} s. {joins} buyers join "
        "one held asset's waiting list, each a new buyer with a key of its own (wrk, 2 threads, "
        "64 connections; PostgreSQL with a pool of 64); then the asset is released "
        f"{handoffs} times in a row, each release handing it to the queue's head in its own "
        "transaction (the answer arrives when the head holds it; every hand-off went to the "
        f"head, in queue order), beside {handoffs} releases of an asset nobody waits for, "
        "alternating, on one connection. The queue's limit is the crowd's size, so the "
        "requests in flight when it fills are answered 409 `WAITLIST_FULL` (other answers). "
        "Latencies in ms.",
        "",
        "| backend | joins/s (first to last `joined_at`) | join p50 | join p99 | other answers | hand-off p50 | hand-off p99 "
        "| plain release p50 | plain release p99 | hand-off / plain (p50) |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for backend, r in results.items():
        c = r["crowd"]
        created = c["statuses"].get(201, 0)
        others = ", ".join(f"{n}× {s}" for s, n in sorted(c["statuses"].items()) if s != 201)
        h50, h99 = percentile(r["handed"], 50), percentile(r["handed"], 99)
        p50, p99 = percentile(r["plain"], 50), percentile(r["plain"], 99)
        lines.append(
            f"| {backend} | {c['rate']:.0f} | {c['p50_ms']:.2f} | {c['p99_ms']:.2f} "
            f"| {others or 'none'} | {h50:.2f} | {h99:.2f} | {p50:.2f} | {p99:.2f} "
            f"| {h50 / p50:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["postgres", "sqlite", "both"], default="both")
    parser.add_argument("--joins", type=int, default=int(os.environ.get("BENCH_JOINS", 10000)))
    parser.add_argument("--handoffs", type=int,
                        default=int(os.environ.get("BENCH_HANDOFFS", 200)))
    parser.add_argument("--bin", help="holdfast binary (default: cargo build --release)")
    args = parser.parse_args()
    need_wrk()
    started = time.time()
    if subprocess.run(["sh", "-c", "command -v wrk"], capture_output=True).returncode != 0:
        print("installing wrk", file=sys.stderr)
        subprocess.run("apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive "
                       "apt-get install -y -qq wrk >/dev/null", shell=True, check=True)
    binary = args.bin
    if binary is None:
        subprocess.run(["cargo", "build", "-q", "--release", "--bin", "holdfast"], cwd=ROOT,
                       check=True)
        target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
        binary = os.path.join(target, "release", "holdfast")
    backends = ["postgres", "sqlite"] if args.backend == "both" else [args.backend]
    results = {}
    with tempfile.TemporaryDirectory() as work:
        for backend in backends:
            results[backend] = run_backend(binary, backend, args.joins, args.handoffs, work)
    text = table(results, args.joins, args.handoffs, time.time() - started)
    print(text)
    sections.replace(os.path.join(ROOT, "bench/RESULTS.md"), "waitlist", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
