"""The writing scenarios on the embedded default, two builds side by side:
the service built from BASE (a git revision) and the working tree's, each on
an SQLite file of its own seeded alike, with the default durability
(`PRAGMA synchronous = FULL`: a commit is on disk before its answer), both
serving at once; `spread-hold` and `hold-commit` (bench/load.lua, wrk at 64
connections) alternate between them for ROUNDS rounds, each after a WAL
checkpoint. Measured besides the rate: the server's CPU time per request.

Beside them, SQLite's own ceiling for the hold at the same durability: the
canonical hold transaction (the asset's guarded update, the reservation,
its event, the stored answer; bench/canonical_hold.sql) on holdfast's SQLite
schema, from Python's sqlite3 on one connection (SQLite has one writer at a
time, however many threads ask), one transaction per hold and then 64 holds
per transaction. Written to bench/RESULTS.md (section `sqlite-writes`).

    python3 bench/sqlite_writes.py 28ccdf4 [--rounds 3] [--seconds 8]
    python3 bench/sqlite_writes.py 28ccdf4 --base-bin B --head-bin H   # built already
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import sections  # noqa: E402
from compare import builds, cpu_seconds  # noqa: E402
from service import need_wrk, serve, wrk  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THREADS = 2
# Assets each wrk thread may hold in one round of a scenario: more than
# the fastest host served (about 4,000 holds a second a thread), since a
# thread that runs out is answered 404s and measures nothing.
PER_THREAD_SECOND = 12_000
SCENARIOS = {"spread-hold": ("spread", "201", {"201"}),
             "hold-commit": ("hold-commit", "200", {"201", "200"})}
HOLD_BODY = ('{"reservation_id":"res_01KB2Q5W7M3N8P4R6T9V0X1Y2Z","asset_id":"M-0-12345",'
             '"buyer_id":"b-M-0-12345","status":"HELD","expires_at":"2026-12-01T10:10:00.123456Z",'
             '"created_at":"2026-12-01T10:00:00.123456Z","committed_at":null,"released_at":null,'
             '"payment_reference":null,"voided_at":null,"refunds":[]}')


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def seed(binary: str, path: str, prefixes: list[str], per_thread: int) -> None:
    subprocess.run([binary, "migrate"], env=dict(os.environ, HOLDFAST_DATABASE_URL=f"sqlite://{path}"),
                   check=True, capture_output=True)
    at = now()
    c = sqlite3.connect(path, timeout=30)
    c.executemany("INSERT INTO assets (id, name, created_at, updated_at) VALUES (?, 'lot', ?, ?)",
                  ((f"{p}-{t}-{n}", at, at) for p in prefixes for t in range(THREADS)
                   for n in range(1, per_thread + 1)))
    c.commit()
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    c.close()


def checkpoint(path: str) -> None:
    c = sqlite3.connect(path, timeout=30)
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    c.close()


class Side:
    def __init__(self, name: str, binary: str, port: int, work: str, rounds: int, seconds: int):
        self.name, self.port = name, port
        self.path = os.path.join(work, f"{name}.db")
        seed(binary, self.path, [f"{p}{r}" for r in range(rounds) for p in ("R", "HR")],
             seconds * PER_THREAD_SECOND)
        self.proc = serve(binary, f"sqlite://{self.path}", port, os.path.join(work, f"{name}.log"))

    def measure(self, scenario: str, seconds: int, round_: int) -> dict:
        mode, counted, expected = SCENARIOS[scenario]
        checkpoint(self.path)
        env = dict(os.environ, BENCH_MODE=mode, BENCH_PREFIX=f"R{round_}")
        s0 = cpu_seconds([self.proc.pid])
        run = wrk(self.port, dict(env, BENCH_WRK_SECONDS=str(seconds)), expected, THREADS)
        s1 = cpu_seconds([self.proc.pid])
        return {"rps": int(run["statuses"].get(counted, 0)) / run["seconds"], "p99": run["p99"],
                "server_us": (s1 - s0) / run["requests"] * 1e6, "bad": run["bad"]}

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def ceiling(binary: str, work: str, seconds: int, per_commit: int) -> float:
    """Canonical holds per second on holdfast's SQLite schema, at FULL,
    `per_commit` holds to a transaction."""
    path = os.path.join(work, f"ceiling-{per_commit}.db")
    seed(binary, path, ["C"], 200_000)
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA journal_mode = WAL")
    c.execute("PRAGMA synchronous = FULL")
    c.execute("PRAGMA foreign_keys = ON")
    fingerprint = "f" * 64
    held, n = 0, 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        c.execute("BEGIN IMMEDIATE")
        for _ in range(per_commit):
            n += 1
            asset, res, at = f"C-0-{n}", f"res_C{n:025d}", now()
            updated = c.execute(
                "UPDATE assets SET status = 'HELD', hold_expires_at = ?, current_reservation_id = ?,"
                " version = version + 1, last_event_sequence = last_event_sequence + 1,"
                " updated_at = ? WHERE id = ? AND status = 'AVAILABLE'"
                " RETURNING last_event_sequence", (at, res, at, asset)).fetchone()
            c.execute("INSERT INTO reservations (id, asset_id, buyer_id, status, expires_at,"
                      " created_at, client) VALUES (?, ?, ?, 'HELD', ?, ?, '-')",
                      (res, asset, f"b-{asset}", at, at))
            c.execute("INSERT INTO events (id, asset_id, sequence, type, data, created_at, client)"
                      " VALUES (?, ?, ?, 'reservation.held', ?, ?, '-')",
                      (f"evt_C{n:024d}H", asset, updated[0], HOLD_BODY, at))
            c.execute("INSERT INTO idempotency_keys (client, key, fingerprint, status_code, body,"
                      " location, reservation_id, created_at) VALUES ('-', ?, ?, 201, ?, ?, ?, ?)",
                      (f"h-C{n}", fingerprint, HOLD_BODY, f"/v1/reservations/{res}", res, at))
        c.execute("COMMIT")
        held += per_commit
    rate = held / (time.perf_counter() - started)
    c.close()
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", help="the git revision to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--base-bin", help="BASE's release binary, already built")
    parser.add_argument("--head-bin", help="the working tree's release binary, already built")
    args = parser.parse_args()
    need_wrk()
    started = time.time()
    base_bin, head_bin, _, head_name = builds(args)
    with tempfile.TemporaryDirectory() as work:
        sides = [Side("base", base_bin, 18421, work, args.rounds, args.seconds)]
        try:
            sides.append(Side("head", head_bin, 18422, work, args.rounds, args.seconds))
            load = os.getloadavg()
            results = {(s, side.name): [] for s in SCENARIOS for side in sides}
            for r in range(args.rounds):
                for scenario in SCENARIOS:
                    for side in (sides if r % 2 == 0 else sides[::-1]):
                        m = side.measure(scenario, args.seconds, r)
                        results[(scenario, side.name)].append(m)
                        print(f"round {r + 1} {scenario:11} {side.name}: {m['rps']:.0f}/s, "
                              f"p99 {m['p99']:.1f} ms, server {m['server_us']:.1f} µs",
                              file=sys.stderr)
        finally:
            for side in sides:
                side.stop()
        ceilings = {k: ceiling(head_bin, work, args.seconds, k) for k in (1, 64)}
        print(f"ceiling: {ceilings[1]:.0f} holds/s one per commit, {ceilings[64]:.0f} "
              "64 per commit", file=sys.stderr)
    median = statistics.median
    lines = [
        f"## SQLite writes side by side with {args.base} (`bench/sqlite_writes.py`)",
        "",
        f"Run on {time.strftime('%Y-%m-%d')}: {os.cpu_count()} CPUs, {platform.platform()}; "
        f"{args.base} and {head_name} served at once, each on an SQLite file of its own "
        f"(`synchronous = FULL`, the default); {args.rounds} rounds, each scenario "
        f"{args.seconds} s on one then the other, the order swapped every round (wrk, 64 "
        f"connections); load average {load[0]:.2f} at the start; took "
        f"{time.time() - started:.0f} s. Medians of the rounds: holds (201) per second for "
        "`spread-hold`, sales (200) per second for `hold-commit`.",
        "",
        f"| scenario | {args.base} per second | {head_name} per second | ratio (rounds) | "
        f"p99 ms | server µs/req | {head_name} / SQLite ceiling | unexpected answers |",
        "|---|---:|---:|---|---|---|---|---:|",
    ]
    for scenario in SCENARIOS:
        b, h = results[(scenario, "base")], results[(scenario, "head")]
        ratios = [x["rps"] / y["rps"] for x, y in zip(h, b)]
        vs_ceiling = (f"{median([x['rps'] for x in h]) / ceilings[1]:.2f} / "
                      f"{median([x['rps'] for x in h]) / ceilings[64]:.2f}"
                      if scenario == "spread-hold" else "–")
        lines.append(
            f"| {scenario} | {median([x['rps'] for x in b]):.0f} | {median([x['rps'] for x in h]):.0f} "
            f"| {median(ratios):.2f} ({' / '.join(f'{x:.2f}' for x in ratios)}) "
            f"| {median([x['p99'] for x in b]):.1f} → {median([x['p99'] for x in h]):.1f} "
            f"| {median([x['server_us'] for x in b]):.0f} → {median([x['server_us'] for x in h]):.0f} "
            f"| {vs_ceiling} | {sum(x['bad'] for x in b + h)} |")
    lines += [
        "",
        f"SQLite ceiling of the hold, at the same durability (the canonical transaction of "
        f"`bench/canonical_hold.sql` on holdfast's SQLite schema, from Python's sqlite3 on one "
        f"connection): {ceilings[1]:,.0f} holds/s one hold per commit, {ceilings[64]:,.0f} "
        f"holds/s 64 holds per commit. The ratio column is the service's spread-hold against "
        f"each.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    bad = sum(x["bad"] for runs in results.values() for x in runs)
    if bad:
        raise SystemExit(f"{bad} unexpected answers (out of assets, or failed writes): "
                         "RESULTS.md left as it was")
    sections.replace(os.path.join(ROOT, "bench/RESULTS.md"), "sqlite-writes", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
