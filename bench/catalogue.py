"""The catalogue at production size, on each backend: `holdfast import` of
generated plates (bench/plates.py: 2,000,000 on PostgreSQL, 200,000 on
SQLite), timed, then again (nothing to do); and the first page of each
filter of `GET /v1/assets` on that catalogue against the same on 10,000
plates, p50 and p99 side by side (wrk, 2 connections, the two catalogues
alternating for six rounds, the median of the rounds), with each query's
plan.

Two connections, one request in flight per core, because the service, its
database and wrk share two cores: at 8 connections every request queues for
a core, and the tail measures the machine's run queue (a request of a
millisecond waited 20 to 100 ms whenever the scheduler ran something else
first, on the small catalogue as on the large one) rather than the query. Written to bench/RESULTS.md (section
`catalogue`).

    python3 bench/catalogue.py [--backend postgres|sqlite|both] [--seconds 12]
"""

from __future__ import annotations

import argparse
import http.client
import os
import platform
import re
import sqlite3
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
# Rounds of each filter, the two catalogues alternating.
ROUNDS = 6
# Requests in flight (see above).
CONNECTIONS = 2
# Seconds of the same requests on each catalogue before the rounds: every
# connection of the pool has prepared the statement and made its plans.
WARM = 2
SMALL = 10_000
LARGE = {"postgres": 2_000_000, "sqlite": 200_000}

# Each filter's first page, and the SQL the service sends for it (its
# parameters inlined): src/store/read.rs, assets_query.
ASSETS = ("SELECT a.*, r.client AS holder FROM assets a "
          "LEFT JOIN reservations r ON r.id = a.current_reservation_id")
BY_ATTRIBUTE = ("SELECT a.*, r.client AS holder FROM asset_attributes x "
                "JOIN assets a ON a.id = x.asset_id "
                "LEFT JOIN reservations r ON r.id = a.current_reservation_id")
FILTERS = [
    # AB1: a full page on both catalogues (101 plates of 10,000; 4,444 of
    # 2,000,000), so that both answer the same number of items.
    ("id_prefix", "/v1/assets?id_prefix=AB1",
     lambda id_: f"{ASSETS} WHERE true AND {id_} >= 'AB1' AND {id_} < 'AB1\x7f' "
                 f"ORDER BY {id_} LIMIT 50"),
    ("attribute", "/v1/assets?attribute=premium:true",
     lambda _: f"{BY_ATTRIBUTE} WHERE x.key = 'premium' AND x.kind = 'b' AND x.value = 'true' "
               "ORDER BY x.asset_id LIMIT 50"),
    ("price_max (most pass)", "/v1/assets?price_max=150000000&currency=IDR",
     lambda id_: f"{ASSETS} WHERE true AND a.price_currency = 'IDR' "
                 f"AND a.price_amount <= 150000000 ORDER BY {id_} LIMIT 50"),
    ("price_max (none pass)", "/v1/assets?price_max=100&currency=IDR",
     lambda id_: f"{ASSETS} WHERE true AND a.price_currency = 'IDR' "
                 f"AND a.price_amount <= 100 ORDER BY {id_} LIMIT 50"),
    ("all three", "/v1/assets?id_prefix=B1&attribute=region:B&price_max=150000000&currency=IDR",
     lambda _: f"{BY_ATTRIBUTE} WHERE x.key = 'region' AND x.kind = 's' AND x.value = 'B' "
               "AND x.asset_id >= 'B1' AND x.asset_id < 'B1\x7f' AND a.price_currency = 'IDR' "
               "AND a.price_amount <= 150000000 ORDER BY x.asset_id LIMIT 50"),
]


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def imported(binary: str, url: str, path: str) -> tuple[float, str]:
    env = dict(os.environ, HOLDFAST_DATABASE_URL=url)
    t0 = time.monotonic()
    out = run([binary, "import", path], env=env).stdout.strip()
    return time.monotonic() - t0, out


def ms(value: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", value).groups()
    return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def page(port: int, path: str, seconds: float) -> tuple[float, float, float, int]:
    """(req/s, p50 ms, p99 ms, items on the page) of GETs of path."""
    conn = http.client.HTTPConnection("127.0.0.1", port)
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read().decode()
    if response.status != 200:
        raise SystemExit(f"GET {path}: {response.status} {body}")
    items = body.count('"current_reservation_id"')
    out = run(["wrk", "-t1", f"-c{CONNECTIONS}", f"-d{max(1, round(seconds))}s", "--latency",
               f"http://127.0.0.1:{port}{path}"]).stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p50 = ms(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1))
    p99 = ms(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1))
    return rate, p50, p99, items


def plan(backend: str, target: str, sql: str) -> str:
    if backend == "postgres":
        rows = psql(f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) {sql}", target)
        return rows
    conn = sqlite3.connect(f"file:{target}?mode=ro", uri=True)
    try:
        return "\n".join(row[-1] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}"))
    finally:
        conn.close()


def run_backend(binary: str, backend: str, seconds: float, work: str) -> dict:
    sizes = {"small": SMALL, "large": LARGE[backend]}
    csvs = {}
    for name, n in sizes.items():
        csvs[name] = f"{work}/plates-{n}.csv"
        with open(csvs[name], "w") as out:
            subprocess.run([sys.executable, os.path.join(ROOT, "bench/plates.py"), str(n)],
                           stdout=out, check=True)
    urls, targets, dbs = {}, {}, []
    for name, n in sizes.items():
        if backend == "postgres":
            db = f"holdfast_bench_catalogue_{name}_{os.getpid()}"
            psql(f"CREATE DATABASE {db}")
            dbs.append(db)
            urls[name], targets[name] = f"{PG}/{db}", db
        else:
            path = f"{work}/catalogue-{name}.db"
            urls[name], targets[name] = f"sqlite://{path}", path
    procs = []
    try:
        result = {"sizes": sizes, "import": {}, "pages": {}, "plans": {}}
        for name in sizes:
            print(f"{backend}: importing {sizes[name]} plates", file=sys.stderr)
            first = imported(binary, urls[name], csvs[name])
            again = imported(binary, urls[name], csvs[name])
            print(f"{backend}: {first[1]}\n{backend}: again in {again[0]:.1f} s", file=sys.stderr)
            result["import"][name] = (first, again)
        if backend == "postgres":
            for db in dbs:
                psql("VACUUM ANALYZE", db)
            # The import's pages written out before the reads are timed.
            psql("CHECKPOINT")
        ports = {"small": 18331, "large": 18332}
        for name in sizes:
            procs.append(serve(binary, urls[name], ports[name], f"{work}/{backend}-{name}.log"))
        id_ = 'a.id COLLATE "C"' if backend == "postgres" else "a.id"
        for label, path, sql in FILTERS:
            print(f"{backend}: first page, {label}", file=sys.stderr)
            runs = {"small": [], "large": []}
            for name in ("small", "large"):  # warm: the pool's connections, their plans
                page(ports[name], path, WARM)
            for _ in range(ROUNDS):  # alternating
                for name in ("small", "large"):
                    runs[name].append(page(ports[name], path, seconds / ROUNDS))
            result["pages"][label] = (path, {
                name: (statistics.mean(r[0] for r in rs), statistics.median(r[1] for r in rs),
                       statistics.median(r[2] for r in rs), rs[0][3], max(r[2] for r in rs))
                for name, rs in runs.items()})
            result["plans"][label] = plan(backend, targets["large"], sql(id_))
        return result
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()
        for db in dbs:
            psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def report(results: dict, took: float) -> str:
    out = [
        "## The catalogue at production size (`bench/catalogue.py`)",
        "",
        f"Run on {time.strftime('%Y-%m-%d')}: {os.cpu_count()} CPUs, {platform.platform()}; "
        f"service, database and load generator share the machine; took {took:.0f} s. Plates "
        "from `bench/plates.py` (three attributes each: `region`, `digits`, `premium`; a "
        "price in IDR).",
        "",
        "### `holdfast import`",
        "",
        "| backend | plates | first import | rows/s | again (nothing to do) |",
        "|---|---:|---:|---:|---:|",
    ]
    for backend, r in results.items():
        for name in ("large", "small"):
            (first, said), (again, _) = r["import"][name]
            n = r["sizes"][name]
            out.append(f"| {backend} | {n:,} | {first:.1f} s | {n / first:,.0f} | {again:.1f} s |")
    out += ["", "### The first page of each filter, large catalogue against 10,000",
            "",
            f"wrk, {CONNECTIONS} connections, each catalogue in its own instance, after {WARM} s of "
            f"the same requests, alternating for {ROUNDS} rounds; p50 and p99 the median of the rounds (the worst round's p99 "
            "in parentheses). Latencies in ms.",
            "",
            "| backend | filter | items (10,000 / large) | 10,000: req/s | p50 | p99 | large: req/s | p50 | p99 "
            "| p50 large / 10,000 | p99 large / 10,000 |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for backend, r in results.items():
        for label, (path, by) in r["pages"].items():
            s, l_ = by["small"], by["large"]
            out.append(
                f"| {backend} ({r['sizes']['large']:,}) | `{path.split('?', 1)[1]}` "
                f"| {s[3]} / {l_[3]} "
                f"| {s[0]:.0f} | {s[1]:.2f} | {s[2]:.2f} ({s[4]:.2f}) | {l_[0]:.0f} | {l_[1]:.2f} | "
                f"{l_[2]:.2f} ({l_[4]:.2f}) | {l_[1] / s[1]:.2f} | {l_[2] / s[2]:.2f} |")
    out += ["", "### Plans on the large catalogue", ""]
    for backend, r in results.items():
        for label, text in r["plans"].items():
            out += [f"{backend}, {label}:", "", "```", text, "```", ""]
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["postgres", "sqlite", "both"], default="both")
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--bin", help="holdfast binary (default: cargo build --release)")
    args = parser.parse_args()
    need_wrk()
    started = time.time()
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
            results[backend] = run_backend(binary, backend, args.seconds, work)
    text = report(results, time.time() - started)
    print(text)
    sections.replace(os.path.join(ROOT, "bench/RESULTS.md"), "catalogue", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
