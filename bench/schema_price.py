"""The price of holdfast's schema on PostgreSQL: the design's canonical hold
(bench/canonical_hold.sql) and hold-and-sale (bench/canonical_hold_commit.sql),
each transaction sent in one round trip (a pgbench pipeline, prepared
statements, 64 clients), run on the least schema they need
(bench/minimal_schema.sql: each table with its primary key only) and on
holdfast's own (`holdfast migrate`), the two alternating for three rounds.
Measured per transaction: the rate, the WAL written (pg_stat_wal around
the run) and the share of asset updates made in place (HOT). What the
second costs more is the price of what holdfast's schema adds. Beside
them, in the same rounds, the service itself on a database of its own:
`spread-hold` and `hold-commit` of bench/compare.py (wrk, 64 connections),
holds and sales a second and the WAL written per hold and per sale, against
the minimal schema's canonical transactions: how near the service comes to
the ceiling. Written to bench/RESULTS.md (section `schema-price`).

    python3 bench/schema_price.py [--seconds 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import sections  # noqa: E402
from compare import Side  # noqa: E402
from service import need_wrk, psql  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PG = "postgres://postgres@127.0.0.1:5432"
CLIENTS = 64
# Room for this many transactions a second per script and run.
TPS_MAX = 20_000
HOLD_BODY = ('{"reservation_id":"res_01KB2Q5W7M3N8P4R6T9V0X1Y2Z","asset_id":"M-0-12345",'
             '"buyer_id":"b-M-0-12345","status":"HELD","expires_at":"2026-12-01T10:10:00.123456Z",'
             '"created_at":"2026-12-01T10:00:00.123456Z","committed_at":null,"released_at":null,'
             '"payment_reference":null,"voided_at":null,"refunds":[]}')
COMMIT_BODY = HOLD_BODY.replace('"HELD"', '"COMMITTED"').replace(
    '"committed_at":null', '"committed_at":"2026-12-01T10:00:00.234567Z"')
SCRIPTS = {"hold": "bench/canonical_hold.sql", "hold-commit": "bench/canonical_hold_commit.sql"}
# The service's scenario (bench/compare.py) for each canonical transaction.
SCENARIOS = {"hold": "spread-hold", "hold-commit": "hold-commit"}


def seed(db: str, slots: int) -> None:
    for prefix in ("C", "K"):
        psql(f"INSERT INTO assets (id, name, created_at, updated_at) "
             f"SELECT '{prefix}-' || (n * 100 + c), 'lot', now(), now() "
             f"FROM generate_series(0, {CLIENTS - 1}) c, generate_series(1, {slots}) n "
             "ORDER BY c, n", db)
    psql("VACUUM ANALYZE", db)


def release_binary(given: str | None) -> str:
    """`given`, or the working tree's release build (built now)."""
    if given:
        return given
    subprocess.run(["cargo", "build", "-q", "--release", "--bin", "holdfast"], cwd=ROOT,
                   check=True)
    return os.path.join(ROOT, "target/release/holdfast")


def create(db: str, minimal: bool, binary: str) -> None:
    """Database `db` with the minimal schema, or migrated by `binary`."""
    psql(f"CREATE DATABASE {db}")
    if minimal:
        with open(os.path.join(ROOT, "bench/minimal_schema.sql")) as f:
            psql(f.read(), db)
    else:
        subprocess.run([binary, "migrate"], check=True, capture_output=True,
                       env=dict(os.environ, HOLDFAST_DATABASE_URL=f"{PG}/{db}"))


def counters(db: str) -> tuple[int, int, int]:
    """WAL bytes written so far, and the assets' updates and HOT updates."""
    wal = int(float(psql("SELECT wal_bytes FROM pg_stat_wal", db)))
    updates, hot = psql("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                        "WHERE relname = 'assets'", db).split("|")
    return wal, int(updates), int(hot)


def pgbench(db: str, script: str, seconds: int, start: int) -> tuple[float, int, int]:
    """(transactions a second, WAL bytes, asset updates HOT in percent)."""
    psql("CHECKPOINT", db)
    before = counters(db)
    out = subprocess.run(
        ["pgbench", "-n", "-h", "127.0.0.1", "-U", "postgres", "-M", "prepared", "-c", str(CLIENTS),
         "-j", "2", "-T", str(seconds), "-D", f"n={start}", "-D", f"hold_body={HOLD_BODY}",
         "-D", f"commit_body={COMMIT_BODY}", "-D", f"fingerprint={'f' * 64}",
         "-f", os.path.join(ROOT, script), db],
        capture_output=True, text=True)
    if out.returncode != 0 or "aborted" in out.stdout + out.stderr:
        raise SystemExit(f"pgbench {script} on {db}:\n{out.stdout}\n{out.stderr}")
    time.sleep(1.0)  # the statistics collector's report
    after = counters(db)
    tps = float(re.search(r"tps = ([0-9.]+)", out.stdout).group(1))
    done = int(re.search(r"number of transactions actually processed: (\d+)", out.stdout).group(1))
    (wal0, n0, hot0), (wal1, n1, hot1) = before, after
    updates = n1 - n0
    return tps, round((wal1 - wal0) / max(done, 1)), \
        round(100 * (hot1 - hot0) / updates) if updates else 0


def table_row(name: str, minimal: list, other: list) -> str:
    """A table's row: the medians of `other`'s runs against `minimal`'s, each
    run (rate, WAL per transaction, HOT %) paired with the one of its round."""
    ratios = " / ".join(f"{b[0] / a[0]:.2f}" for a, b in zip(minimal, other))
    wal_m, wal_o = statistics.median(x[1] for x in minimal), statistics.median(x[1] for x in other)
    return (f"| {name} | {statistics.median(x[0] for x in minimal):,.0f} "
            f"| {statistics.median(x[0] for x in other):,.0f} "
            f"| {statistics.median(b[0] / a[0] for a, b in zip(minimal, other)):.2f} ({ratios}) "
            f"| {wal_m:,.0f} B → {wal_o:,.0f} B ({wal_o / wal_m:.2f}×) "
            f"| {statistics.median(x[2] for x in minimal):.0f} % → "
            f"{statistics.median(x[2] for x in other):.0f} % |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bin", help="holdfast binary (default: cargo build --release)")
    args = parser.parse_args()
    binary = release_binary(args.bin)
    started = time.monotonic()
    load = os.getloadavg()[0]
    # Every round of both scripts takes its own assets: slots per client.
    per_run = (args.seconds + 2) * TPS_MAX // CLIENTS + 50
    slots = per_run * args.rounds
    dbs = {"minimal": f"holdfast_bench_min_{os.getpid()}",
           "holdfast": f"holdfast_bench_full_{os.getpid()}"}
    need_wrk()
    work = tempfile.mkdtemp(prefix="holdfast-schema-price-")
    service = None
    try:
        for name, db in dbs.items():
            create(db, name == "minimal", binary)
            print(f"seeding {name}: {CLIENTS * slots * 2:,} assets", file=sys.stderr)
            seed(db, slots)
        print("seeding the service's database", file=sys.stderr)
        service = Side("service", binary, 18391, work, 10_000, args.rounds, args.seconds)
        runs = {(s, n): [] for s in SCRIPTS for n in [*dbs, "service"]}
        for r in range(args.rounds):
            for script, path in SCRIPTS.items():
                for name, db in (list(dbs.items()) if r % 2 == 0 else list(dbs.items())[::-1]):
                    result = pgbench(db, path, args.seconds, r * per_run)
                    print(f"round {r + 1} {script} {name}: {result[0]:.0f} tx/s, "
                          f"{result[1]} B WAL, {result[2]} % HOT", file=sys.stderr)
                    runs[(script, name)].append(result)
                served = service.measure(SCENARIOS[script], args.seconds, r)
                if served["bad"]:
                    raise SystemExit(f"{SCENARIOS[script]}: {served['bad']} unexpected answers "
                                     f"(see {work}/service.log)")
                hot_updates, updates = served["hot"]
                result = (served["rps"], round(served["wal"]),
                          round(100 * hot_updates / updates) if updates else 0)
                print(f"round {r + 1} {script} service: {result[0]:.0f}/s, {result[1]} B WAL, "
                      f"{result[2]} % HOT", file=sys.stderr)
                runs[(script, "service")].append(result)
        indexes = {name: psql("SELECT tablename || ': ' || string_agg(indexname, ', ' "
                                   "ORDER BY indexname) FROM pg_indexes WHERE schemaname = 'public' "
                                   "AND tablename IN ('assets', 'reservations', 'events', "
                                   "'idempotency_keys', 'payments') GROUP BY tablename "
                                   "ORDER BY tablename", db)
                   for name, db in dbs.items()}
    finally:
        if service:
            service.stop()
        for db in dbs.values():
            psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    took = time.monotonic() - started
    out = [
        "## The price of holdfast's schema (`bench/schema_price.py`)",
        "",
        f"Run on {time.strftime('%Y-%m-%d')}: {os.cpu_count()} CPUs, {platform.platform()}; "
        f"load average {load:.2f} at the start; took {took:.0f} s. The canonical transactions "
        f"(bench/canonical_hold.sql, bench/canonical_hold_commit.sql), one round trip each, "
        f"pgbench with prepared statements and {CLIENTS} clients for {args.seconds} s, on the "
        f"minimal schema (bench/minimal_schema.sql) and on holdfast's, alternating for "
        f"{args.rounds} rounds; medians of the rounds. A hold-commit transaction is a hold and "
        "its sale (two transactions, counted as one).",
    ]
    for other, label in (("holdfast", "holdfast's"), ("service", "the service")):
        if other == "service":
            out += ["", f"The service in the same rounds, on a database of its own (`spread-hold`: "
                    f"holds a second, 201; `hold-commit`: sales a second, 200; wrk, 64 connections, "
                    f"{args.seconds} s; bench/compare.py's scenarios), against the minimal schema's "
                    "canonical transactions: the schema's price and the service's own together. "
                    "WAL per hold and per sale, each run after a CHECKPOINT as the canonical ones "
                    "are."]
        out += ["", f"| transaction | minimal: per second | {label}: per second | ratio (rounds) "
                "| WAL per transaction | asset updates in place (HOT) |", "|---|---:|---:|---|---|---|"]
        for script in SCRIPTS:
            name = f"{script} ({SCENARIOS[script]})" if other == "service" else script
            out.append(table_row(name, runs[(script, "minimal")], runs[(script, other)]))
    out += ["", "Indexes of the written tables:", ""]
    for name, text in indexes.items():
        out += [f"- {name}:"] + [f"  - {line}" for line in text.splitlines()]
    sections.replace(os.path.join(ROOT, "bench/RESULTS.md"), "schema-price", "\n".join(out))
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
