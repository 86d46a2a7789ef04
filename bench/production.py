"""holdfast at production size on PostgreSQL, beside a fresh database.

Builds two databases through bench/production.sql on the migrations' own
schema: one of production size (2,000,000 assets, the oldest 500,000 sold,
3,000,000 reservations, 6,500,000 events, 1,000,000 payments, 300,000
stored answers of the last day) and a fresh one (10,000 assets, in the same
proportions). Then, on each, with default settings:

- the janitor (`holdfast sweep --once`) on 50,000 lapsed holds, right after
  loading with autovacuum off (the planner's statistics are those of empty
  tables) and again after ANALYZE;
- `holdfast audit`;
- 200 sequential requests of `GET /v1/asset-counts` and of the first page
  of each status, p50 and p99, the two databases alternating;
- on the large one only: the janitor's pass with 30-day event retention
  (about 4,300,000 events due) in a running service, events purged per
  second, while holds lapse every half second (the latest expiry after its
  due time, against the janitor's interval); then SIGTERM mid-purge, and
  the time to exit against the shutdown grace.

The figures go to bench/RESULTS.md (section `production`), with the plans
of the queries each measurement depends on.

    python3 bench/production.py [--keep] [--reuse fresh|large]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import sections  # noqa: E402
from service import serve  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PG = "postgres://postgres@127.0.0.1:5432"
SIZES = {
    "fresh": dict(n=10_000, sold=2_500, twice=2_500, days=90, keys=1_500),
    "large": dict(n=2_000_000, sold=500_000, twice=500_000, days=90, keys=300_000),
}
LAPSED = {"fresh": 2_500, "large": 50_000}
TABLES = ["assets", "reservations", "events", "refunds", "payments", "idempotency_keys",
          "asset_attributes", "waitlist"]
READS = ["/v1/asset-counts", "/v1/assets?status=AVAILABLE&limit=50",
         "/v1/assets?status=SOLD&limit=50", "/v1/assets?status=HELD&limit=50",
         "/v1/assets?status=WITHDRAWN&limit=50"]


def say(text: str) -> None:
    print(f"[production {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def psql(db: str, sql: str, *args: str) -> str:
    out = subprocess.run(["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1",
                          "-U", "postgres", "-d", db, *args, "-c", sql],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip()


def url(db: str) -> str:
    return f"{PG}/{db}"


def build(binary: str, db: str, size: dict) -> float:
    """The database `db` at `size`, autovacuum off on its tables; seconds."""
    t0 = time.time()
    psql("postgres", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    psql("postgres", f"CREATE DATABASE {db}")
    subprocess.run([binary, "migrate"], env=dict(os.environ, HOLDFAST_DATABASE_URL=url(db)),
                   check=True, capture_output=True)
    for table in TABLES:
        psql(db, f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
    args = []
    for name, value in size.items():
        args += ["-v", f"{name}={value}"]
    proc = subprocess.Popen(["psql", "-X", "-q", "-h", "127.0.0.1", "-U", "postgres", "-d", db,
                             *args, "-f", os.path.join(ROOT, "bench", "production.sql")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    step = time.time()
    for line in proc.stdout:
        say(f"{db}: {line.strip()} (after {time.time() - step:.0f}s)")
    if proc.wait() != 0:
        raise SystemExit(f"building {db} failed")
    return time.time() - t0


def analyze(db: str) -> None:
    for table in TABLES:
        psql(db, f"ALTER TABLE {table} RESET (autovacuum_enabled)")
    psql(db, "VACUUM ANALYZE")


def lapse(db: str, count: int, tag: str) -> None:
    """`count` AVAILABLE assets held by a hold that lapsed a minute ago, as
    the hold would have written it: reservation, asset, event. Their ids
    are `tag`, the time of day and the asset's rank."""
    psql(db, f"""
        WITH pick AS (
            SELECT id, last_event_sequence + 1 AS seq,
                   '{tag}' || to_char(now(), 'HH24MISS')
                   || lpad((row_number() OVER ())::text, 19, '0') AS n FROM assets
             WHERE status = 'AVAILABLE' ORDER BY id DESC LIMIT {count}
        ), r AS (
            INSERT INTO reservations (id, asset_id, buyer_id, status, expires_at, created_at,
                                      client)
            SELECT 'res_' || n, id, 'lapsing', 'HELD',
                   now() - interval '1 minute', now() - interval '6 minutes', '-'
              FROM pick RETURNING id, asset_id, expires_at
        ), a AS (
            UPDATE assets SET status = 'HELD', hold_expires_at = r.expires_at,
                   current_reservation_id = r.id, version = version + 1,
                   last_event_sequence = pick.seq, updated_at = now()
              FROM r JOIN pick ON pick.id = r.asset_id WHERE assets.id = r.asset_id
        )
        INSERT INTO events (id, asset_id, sequence, type, data, created_at, client)
        SELECT 'evt_' || pick.n, r.asset_id, pick.seq, 'reservation.held',
               '{{"reservation_id":"' || r.id || '"}}', now() - interval '6 minutes', '-'
          FROM r JOIN pick ON pick.id = r.asset_id""")


def sweep(binary: str, db: str, **settings: str) -> tuple[float, str]:
    env = dict(os.environ, HOLDFAST_DATABASE_URL=url(db), RUST_LOG="warn",
               **{f"HOLDFAST_{k.upper()}": v for k, v in settings.items()})
    t0 = time.time()
    out = subprocess.run([binary, "sweep", "--once"], env=env, capture_output=True, text=True)
    took = time.time() - t0
    lines = (out.stdout + out.stderr).strip().splitlines()
    return took, lines[-1] if lines else f"exit {out.returncode}"


def held(db: str) -> int:
    return int(psql(db, "SELECT count(*) FROM assets WHERE status = 'HELD'"))


def audit(binary: str, db: str) -> tuple[float, bool, str]:
    env = dict(os.environ, HOLDFAST_DATABASE_URL=url(db), RUST_LOG="warn")
    t0 = time.time()
    out = subprocess.run([binary, "audit"], env=env, capture_output=True, text=True)
    return time.time() - t0, out.returncode == 0, (out.stdout + out.stderr)[-2000:]


def timed_gets(port: int, path: str, n: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise SystemExit(f"GET {path}: {response.status}")
        times.append((time.perf_counter() - t0) * 1000)
    return times


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def reads(binary: str, dbs: dict[str, str], work: str) -> list[tuple[str, dict]]:
    """200 sequential GETs of each read on each database, alternating in
    rounds of 20; p50 and p99 per database."""
    servers, ports = {}, {}
    for i, (name, db) in enumerate(dbs.items()):
        ports[name] = 18600 + i
        servers[name] = serve(binary, url(db), ports[name], os.path.join(work, f"{name}.log"))
    try:
        rows = []
        for path in READS:
            got = {name: [] for name in dbs}
            for name in dbs:
                timed_gets(ports[name], path, 10)  # warm
            for _ in range(10):
                for name in dbs:
                    got[name] += timed_gets(ports[name], path, 20)
            rows.append((path, {name: (pct(t, 50), pct(t, 99)) for name, t in got.items()}))
            say(f"{path}: " + ", ".join(f"{n} p50 {v[0]:.2f} ms" for n, v in rows[-1][1].items()))
        return rows
    finally:
        for proc in servers.values():
            proc.terminate()
            proc.wait()


def deleted_events(db: str) -> int:
    """Events deleted so far, as the statistics collector counts them (a
    count(*) of millions of rows every half second would weigh on the run)."""
    return int(psql(db, "SELECT coalesce((SELECT n_tup_del FROM pg_stat_user_tables "
                        "WHERE relname = 'events'), 0)"))


def purge(binary: str, db: str, work: str) -> dict:
    """The janitor with 30-day retention in a running service; holds made
    to lapse every half second meanwhile; SIGTERM once a third is purged."""
    before = deleted_events(db)
    due = int(psql(db, "SELECT count(*) FROM events WHERE created_at < now() - interval '30 days' "
                       "AND delivered_at IS NOT NULL"))
    port = 18610
    proc = serve(binary, url(db), port, os.path.join(work, "purge.log"),
                 janitor_interval_seconds="1", event_retention_days="30",
                 hold_seconds_min="1", max_holds_per_buyer="0")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    free = psql(db, "SELECT id FROM assets WHERE status = 'AVAILABLE' ORDER BY id LIMIT 400")
    free = free.split()
    t0 = time.time()
    made = []
    stopped_at = None
    while True:
        if free:
            asset = free.pop()
            conn.request("POST", f"/v1/assets/{asset}/reservations",
                         body=json.dumps({"buyer_id": "purge-" + asset, "hold_seconds": 1}),
                         headers={"Content-Type": "application/json",
                                  "Idempotency-Key": "purge-" + asset})
            response = conn.getresponse()
            body = response.read()
            if response.status == 201:
                made.append(json.loads(body)["reservation_id"])
        time.sleep(0.5)
        now = time.time()
        purged = deleted_events(db) - before
        if stopped_at is None and purged >= due // 3:
            rate = purged / (now - t0)
            proc.send_signal(signal.SIGTERM)
            stopped_at = time.time()
            proc.wait(timeout=120)
            exit_after = time.time() - stopped_at
            break
        if now - t0 > 1800:
            raise SystemExit("the purge did not reach a third in 30 minutes")
    late = psql(db, """
        SELECT coalesce(max(extract(epoch FROM e.created_at - r.expires_at)), 0)
          FROM reservations r JOIN events e ON e.asset_id = r.asset_id
           AND e.type = 'reservation.expired'
           AND e.data LIKE '%"reservation_id":"' || r.id || '"%'
         WHERE r.buyer_id LIKE 'purge-%'""")
    # Holds due well before the stop that nobody expired count as late.
    missed = psql(db, f"""
        SELECT count(*) FROM reservations WHERE buyer_id LIKE 'purge-%' AND status = 'HELD'
           AND expires_at < to_timestamp({stopped_at - 2})""")
    return {"due": due, "purged": deleted_events(db) - before, "seconds": stopped_at - t0,
            "rate": rate, "holds": len(made), "latest_expiry": float(late),
            "missed": int(missed), "exit_after": exit_after}


# The statements the service sends for the reads measured (src/store/read.rs),
# their parameters inlined, for their plans.
PLANS = {
    "first page of SOLD":
        "SELECT a.id FROM assets a WHERE a.shelf = 'SOLD' ORDER BY a.id COLLATE \"C\" LIMIT 50",
    "first page of AVAILABLE (AVAILABLE and lapsed holds, on the ON_SALE shelf)":
        "SELECT a.id FROM assets a WHERE a.shelf = 'ON_SALE' AND (a.status = 'AVAILABLE' "
        "OR a.status = 'HELD' AND a.hold_expires_at <= now() AND a.waitlist_length = 0) "
        "ORDER BY a.id COLLATE \"C\" LIMIT 50",
    "first page of HELD (through the HELD reservations)":
        "SELECT a.id FROM assets a WHERE a.id IN (SELECT h.asset_id FROM reservations h "
        "WHERE h.status = 'HELD') AND a.status = 'HELD' AND (a.hold_expires_at > now() "
        "OR a.waitlist_length > 0) ORDER BY a.id COLLATE \"C\" LIMIT 50",
    "asset counts":
        "SELECT m.status, CAST(sum(m.n) AS BIGINT) AS n FROM (SELECT status, n FROM asset_counts "
        "UNION ALL SELECT status, delta FROM asset_count_changes) m GROUP BY m.status "
        "UNION ALL SELECT 'HELD', count(*) FROM reservations r WHERE r.status = 'HELD' "
        "AND (r.expires_at > now() OR EXISTS (SELECT 1 FROM assets a WHERE a.id = r.asset_id "
        "AND a.waitlist_length > 0))",
    "the janitor's choice of lapsed holds":
        "SELECT id, current_reservation_id FROM assets WHERE id = ANY (ARRAY(SELECT asset_id "
        "FROM reservations WHERE status = 'HELD' AND expires_at <= now() LIMIT 500)) "
        "AND status = 'HELD' AND hold_expires_at <= now() FOR UPDATE SKIP LOCKED",
    "the purge's batch of events":
        "SELECT id FROM events WHERE id < '{event_floor}' "
        "AND created_at < now() - interval '30 days' "
        "AND delivered_at IS NOT NULL ORDER BY id LIMIT 500",
}


def event_floor(days: int) -> str:
    """The least event id made `days` days ago or later (as `EventId::floor`)."""
    ms = int((time.time() - days * 86400) * 1000)
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    return "evt_" + "".join(alphabet[(ms >> (5 * (9 - d))) & 31] for d in range(10)) + "0" * 16


def plan(db: str, sql: str) -> str:
    return psql(db, f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) {sql}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the databases")
    parser.add_argument("--reuse", choices=["fresh", "large"], action="append", default=[],
                        help="reuse that database as an earlier --keep run left it "
                             "(before its measurements)")
    args = parser.parse_args()
    say("building holdfast (release)")
    subprocess.run(["cargo", "build", "-q", "--release", "--bin", "holdfast"], cwd=ROOT,
                   check=True)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    binary = os.path.join(target, "release", "holdfast")
    dbs = {"fresh": "holdfast_production_fresh", "large": "holdfast_production_large"}
    work = tempfile.mkdtemp(prefix="holdfast-production-")
    r = {name: {} for name in dbs}
    for name, db in dbs.items():
        if name not in args.reuse:
            r[name]["build"] = build(binary, db, SIZES[name])
            say(f"{db}: built in {r[name]['build']:.0f}s")
        # The janitor, statistics of empty tables, then after ANALYZE.
        for tag, stats in (("A", "empty"), ("B", "analyzed")):
            if stats == "analyzed":
                analyze(db)
            lapse(db, LAPSED[name], tag)
            took, line = sweep(binary, db)
            r[name][f"janitor_{stats}"] = (took, held(db))
            say(f"{db}: sweep with {stats} statistics: {took:.1f}s, {held(db)} still HELD ({line})")
        took, ok, out = audit(binary, db)
        r[name]["audit"] = (took, ok)
        say(f"{db}: audit {'passed' if ok else 'FAILED'} in {took:.1f}s")
        if not ok:
            print(out, file=sys.stderr)
        r[name]["size"] = psql(db, f"SELECT pg_size_pretty(pg_database_size('{db}'))")
    rows = reads(binary, dbs, work)
    purged = purge(binary, dbs["large"], work)
    say(f"purge: {purged}")
    plans = {name: plan(dbs["large"], sql.format(event_floor=event_floor(30)))
             for name, sql in PLANS.items()}
    write(r, rows, purged, plans)
    if not args.keep:
        for db in dbs.values():
            psql("postgres", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def write(r: dict, rows: list, purged: dict, plans: dict) -> None:
    f, l = r["fresh"], r["large"]
    lines = [
        f"Run {time.strftime('%Y-%m-%d %H:%M')} on {platform.node()} "
        f"({os.cpu_count()} cores), PostgreSQL with default settings, "
        "`python3 bench/production.py`. Fresh: 10,000 assets; large: 2,000,000 assets "
        "(500,000 sold), 3,000,000 reservations, 6,500,000 events, 1,000,000 payments, "
        f"300,000 stored answers ({l.get('size', '?')}).",
        "",
        "| | fresh | large | ratio |",
        "|---|---:|---:|---:|",
    ]
    if "build" in l:
        lines.append(f"| build (bench/production.sql) | {f['build']:.0f} s | {l['build']:.0f} s | |")
    for stats in ("empty", "analyzed"):
        ft, fh = f[f"janitor_{stats}"]
        lt, lh = l[f"janitor_{stats}"]
        lines.append(f"| janitor, {LAPSED['fresh']:,} / {LAPSED['large']:,} lapsed holds, "
                     f"{stats} statistics (still HELD after) | {ft:.1f} s ({fh}) | "
                     f"{lt:.1f} s ({lh}) | |")
    lines.append(f"| `holdfast audit` | {f['audit'][0]:.1f} s "
                 f"({'pass' if f['audit'][1] else 'FAIL'}) | {l['audit'][0]:.1f} s "
                 f"({'pass' if l['audit'][1] else 'FAIL'}) | |")
    for path, v in rows:
        (fp50, fp99), (lp50, lp99) = v["fresh"], v["large"]
        lines.append(f"| `GET {path}` p50 / p99 | {fp50:.2f} / {fp99:.2f} ms | "
                     f"{lp50:.2f} / {lp99:.2f} ms | {lp50 / fp50:.2f} |")
    lines += [
        "",
        f"Event purge, 30-day retention, in a running service (janitor every second): "
        f"{purged['purged']:,} of {purged['due']:,} due events in {purged['seconds']:.0f} s, "
        f"**{purged['rate']:,.0f} events/s**; {purged['holds']} holds of one second made "
        f"meanwhile, the latest expired {purged['latest_expiry']:.1f} s after its due time "
        f"({purged['missed']} due before the stop left unexpired); "
        f"SIGTERM mid-purge: exited after {purged['exit_after']:.1f} s.",
        "",
    ]
    for name, text in plans.items():
        lines += [f"Plan, {name} (large):", "", "```", text, "```", ""]
    path = os.path.join(ROOT, "bench", "RESULTS.md")
    sections.replace(path, "production", "\n".join(lines))
    say(f"wrote the production section of {path}")


if __name__ == "__main__":
    main()
