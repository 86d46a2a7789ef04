"""The scenarios of bench/run.sh for two builds side by side, in one run:
the service built from BASE (a git revision, in a worktree of its own) and
the working tree's, each on a fresh PostgreSQL database seeded alike
(BENCH_COMPARE_ASSETS assets, 300,000, besides each round's own assets for
the writes), both serving at once; `hot-held`, `hot-sold` and `replay`, and
with --writes `spread-hold` and `hold-commit` after a CHECKPOINT
(bench/load.lua, wrk at 64 connections), alternate between the two for
ROUNDS rounds.
Measured per request, besides the rate: the CPU time of the server's process
and of all PostgreSQL processes (from /proc, so nothing else should run
meanwhile), and the database's transactions. Written to bench/RESULTS.md
(section `compare`).

    python3 bench/compare.py 3073177 [--rounds 4] [--seconds 6] [--writes]
    python3 bench/compare.py 3073177 --base-bin B --head-bin H   # built already
"""

from __future__ import annotations

import argparse
import glob
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
from service import need_wrk, psql, serve, wrk  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PG = "postgres://postgres@127.0.0.1:5432"
SCENARIOS = {"hot-held": ("hot", "HOT"), "hot-sold": ("hot", "SOLD"), "replay": ("replay", "REPLAY"),
             "spread-hold": ("spread", None), "hold-commit": ("hold-commit", None)}
# What each scenario counts as done, and every answer it may give.
COUNTED = {"spread-hold": "201", "hold-commit": "200"}
EXPECTED = {"hot-held": {"409"}, "hot-sold": {"409"}, "replay": {"200"},
            "spread-hold": {"201"}, "hold-commit": {"201", "200"}}
# Assets each wrk thread may write in one run of a writing scenario.
PER_THREAD_SECOND = 5000
TICKS = os.sysconf("SC_CLK_TCK")


def build(base: str) -> tuple[str, str]:
    """Release binaries of BASE (built in a worktree, into a target directory
    of its own) and of the working tree."""
    worktree = os.path.join(ROOT, "target", "compare", base)
    if not os.path.isdir(worktree):
        subprocess.run(["git", "worktree", "add", "--detach", worktree, base], cwd=ROOT,
                       check=True, capture_output=True)
    base_target = os.path.join(ROOT, "target", "compare-build")
    head_target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    for tree, target in ((worktree, base_target), (ROOT, head_target)):
        print(f"building {tree} (release)", file=sys.stderr)
        subprocess.run(["cargo", "build", "-q", "--release", "--bin", "holdfast"], cwd=tree,
                       check=True, env=dict(os.environ, CARGO_TARGET_DIR=target))
    return (os.path.join(base_target, "release", "holdfast"),
            os.path.join(head_target, "release", "holdfast"))


def builds(args: argparse.Namespace) -> tuple[str, str, str, str]:
    """BASE's and the working tree's binaries (`--base-bin` and `--head-bin`
    when both are given, else built), HEAD's short hash, and the name of the
    working tree's build (the hash, "with changes" when the tree has some)."""
    if args.base_bin and args.head_bin:
        base_bin, head_bin = args.base_bin, args.head_bin
    else:
        base_bin, head_bin = build(args.base)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return base_bin, head_bin, head, head + (" with changes" if dirty else "")


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (FileNotFoundError, ProcessLookupError, IndexError):
            pass
    return total / TICKS


def postgres_pids() -> list[int]:
    pids = []
    for path in glob.glob("/proc/[0-9]*/comm"):
        try:
            with open(path) as f:
                if f.read().strip() == "postgres":
                    pids.append(int(path.split("/")[2]))
        except OSError:
            pass
    return pids


def commits(db: str) -> int:
    return int(psql(f"SELECT xact_commit FROM pg_stat_database WHERE datname = '{db}'"))


def wal_bytes() -> int:
    """WAL the cluster has written so far (pg_stat_wal)."""
    return int(float(psql("SELECT wal_bytes FROM pg_stat_wal")))


def asset_updates(db: str) -> tuple[int, int]:
    """(updates, HOT updates) of the assets table so far."""
    row = psql("SELECT n_tup_upd || ' ' || n_tup_hot_upd FROM pg_stat_user_tables "
               "WHERE relname = 'assets'", db)
    upd, hot = row.split()
    return int(upd), int(hot)


class Side:
    def __init__(self, name: str, binary: str, port: int, work: str, assets: int,
                 rounds: int, seconds: int, db: str | None = None):
        """On a fresh database of `assets` assets, dropped at the end; or on
        the database `db` as it is, kept."""
        self.name, self.port, self.owned = name, port, db is None
        self.db = db or f"holdfast_compare_{name}_{os.getpid()}"
        url = f"{PG}/{self.db}"
        if self.owned:
            psql(f"CREATE DATABASE {self.db}")
            subprocess.run([binary, "migrate"], env=dict(os.environ, HOLDFAST_DATABASE_URL=url),
                           check=True, capture_output=True)
            psql("INSERT INTO assets (id, name, created_at, updated_at) "
                 f"SELECT 'W-' || n, 'lot', now(), now() FROM generate_series(1, {assets}) n",
                 self.db)
        # Each round's writes on assets of their own: R<round>-<thread>-<n>
        # (spread-hold) and HR<round>-<thread>-<n> (hold-commit).
        per_thread = seconds * PER_THREAD_SECOND
        for r in range(rounds):
            for prefix in (f"R{r}", f"HR{r}"):
                psql("INSERT INTO assets (id, name, created_at, updated_at) "
                     f"SELECT '{prefix}-' || t || '-' || n, 'lot', now(), now() "
                     f"FROM generate_series(0, 1) t, generate_series(1, {per_thread}) n", self.db)
        self.proc = serve(binary, url, port, f"{work}/{name}.log", db_pool_size="32")
        self.api("/v1/assets", None, '{"id":"HOT","name":"hot"}')
        self.api("/v1/assets/HOT/reservations", "k-hot",
                 '{"buyer_id":"winner","hold_seconds":3600}')
        self.api("/v1/assets", None, '{"id":"SOLD","name":"sold"}')
        held = self.api("/v1/assets/SOLD/reservations", "k-sold", '{"buyer_id":"buyer"}')
        rid = re.search(r'"reservation_id":"([^"]+)"', held).group(1)
        self.api(f"/v1/reservations/{rid}/commit", "k-sold-commit",
                 '{"payment_reference":"pay-sold"}')
        self.api("/v1/assets", None, '{"id":"REPLAY","name":"replay"}')
        self.api("/v1/assets/REPLAY/reservations", "replay-key", '{"buyer_id":"replayer"}')
        psql("VACUUM ANALYZE", self.db)

    def api(self, path: str, key: str | None, body: str) -> str:
        args = ["curl", "-sf", "-X", "POST", "-H", "Content-Type: application/json", "-d", body]
        if key:
            args += ["-H", f"Idempotency-Key: {key}"]
        return subprocess.run(args + [f"http://127.0.0.1:{self.port}{path}"], check=True,
                              capture_output=True, text=True).stdout

    def measure(self, scenario: str, seconds: int, round_: int) -> dict:
        mode, asset = SCENARIOS[scenario]
        env = dict(os.environ, BENCH_MODE=mode, BENCH_PREFIX=f"R{round_}")
        if asset:
            env["BENCH_ASSET"] = asset
        else:
            # Statistics as autovacuum would have them by now (it re-analyses
            # a large table rarely): the writes of earlier rounds left many
            # holds, and a plan made for none would measure the planner.
            psql("ANALYZE", self.db)
            psql("CHECKPOINT")
        pg = postgres_pids()
        x0, p0, s0 = commits(self.db), cpu_seconds(pg), cpu_seconds([self.proc.pid])
        u0, w0 = asset_updates(self.db), wal_bytes()
        run = wrk(self.port, dict(env, BENCH_WRK_SECONDS=str(seconds)), EXPECTED[scenario])
        p1, s1 = cpu_seconds(pg), cpu_seconds([self.proc.pid])
        time.sleep(1.5)  # the statistics of the last transactions arrive
        x1 = commits(self.db)
        u1, w1 = asset_updates(self.db), wal_bytes()
        n, took, bad = run["requests"], run["seconds"], run["bad"]
        done = int(run["statuses"].get(COUNTED[scenario], 0)) if scenario in COUNTED else n
        return {"rps": done / took,
                "pg_us": (p1 - p0) / n * 1e6, "server_us": (s1 - s0) / n * 1e6,
                "xacts": (x1 - x0) / n, "bad": bad, "wal": (w1 - w0) / max(done, 1),
                "hot": (u1[1] - u0[1], u1[0] - u0[0])}

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()
        if self.owned:
            psql(f"DROP DATABASE IF EXISTS {self.db} WITH (FORCE)")


def hot_share(rounds: list[dict]) -> str:
    hot, all_ = sum(x["hot"][0] for x in rounds), sum(x["hot"][1] for x in rounds)
    return f"{hot / all_:.0%}" if all_ else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", help="the git revision to compare with")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=int, default=6)
    parser.add_argument("--assets", type=int,
                        default=int(os.environ.get("BENCH_COMPARE_ASSETS", 300000)))
    parser.add_argument("--writes", action="store_true",
                        help="also spread-hold and hold-commit (each round on assets of its own)")
    parser.add_argument("--base-bin", help="BASE's release binary, already built")
    parser.add_argument("--head-bin", help="the working tree's release binary, already built")
    args = parser.parse_args()
    need_wrk()
    started = time.time()
    scenarios = [s for s in SCENARIOS if args.writes or s not in COUNTED]
    base_bin, head_bin, head, head_name = builds(args)
    with tempfile.TemporaryDirectory() as work:
        writing = args.rounds if args.writes else 0
        sides = [Side("base", base_bin, 18411, work, args.assets, writing, args.seconds)]
        try:
            sides.append(Side("head", head_bin, 18412, work, args.assets, writing,
                              args.seconds))
            load = os.getloadavg()
            results = {(s, side.name): [] for s in scenarios for side in sides}
            for r in range(args.rounds):
                for scenario in scenarios:
                    for side in sides:
                        m = side.measure(scenario, args.seconds, r)
                        results[(scenario, side.name)].append(m)
                        print(f"round {r + 1} {scenario:9} {side.name}: {m['rps']:.0f} req/s, "
                              f"server {m['server_us']:.1f} µs, PostgreSQL {m['pg_us']:.1f} µs",
                              file=sys.stderr)
        finally:
            for side in sides:
                side.stop()
    mean = lambda xs: statistics.mean(xs)  # noqa: E731
    lines = [
        f"## Side by side with {args.base} (`bench/compare.py`)",
        "",
        f"Run on {time.strftime('%Y-%m-%d')}: {os.cpu_count()} CPUs, {platform.platform()}; "
        f"{args.base} and {head_name} served at once, each on a fresh PostgreSQL database of "
        f"{args.assets:,} assets with a pool of 32 (both at once within the server's default of 100 connections); {args.rounds} rounds, each scenario "
        f"{args.seconds} s on one then the other (wrk, 64 connections); load average "
        f"{load[0]:.2f} at the start; took {time.time() - started:.0f} s. Means of the rounds; "
        "CPU per request from /proc (the server's process; all PostgreSQL processes).",
        "",
        *(["Rates: requests per second, but holds (201) per second for `spread-hold` and "
           "sales (200) per second for `hold-commit`.", ""] if args.writes else []),
        f"| scenario | {args.base} per second | {head} per second | ratio (rounds) | server µs/req | "
        "PostgreSQL µs/req | transactions/req | asset updates in place (HOT) | unexpected answers |",
        "|---|---:|---:|---|---|---|---|---|---:|",
    ]
    for scenario in scenarios:
        b, h = results[(scenario, "base")], results[(scenario, "head")]
        ratios = " / ".join(f"{x['rps'] / y['rps']:.2f}" for x, y in zip(h, b))
        lines.append(
            f"| {scenario} | {mean([x['rps'] for x in b]):.0f} | {mean([x['rps'] for x in h]):.0f} "
            f"| {mean([x['rps'] for x in h]) / mean([x['rps'] for x in b]):.2f} ({ratios}) "
            f"| {mean([x['server_us'] for x in b]):.1f} → {mean([x['server_us'] for x in h]):.1f} "
            f"| {mean([x['pg_us'] for x in b]):.1f} → {mean([x['pg_us'] for x in h]):.1f} "
            f"| {mean([x['xacts'] for x in b]):.3f} → {mean([x['xacts'] for x in h]):.3f} "
            f"| {hot_share(b)} → {hot_share(h)} "
            f"| {sum(x['bad'] for x in b + h)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    sections.replace(os.path.join(ROOT, "bench/RESULTS.md"), "compare", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
