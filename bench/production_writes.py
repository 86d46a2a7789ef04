"""The scenarios of bench/run.sh on a production-size PostgreSQL database
beside a fresh one, one build, in one run.

The large database is bench/production.py's (bench/production.sql:
2,000,000 assets with 90 days of history, 3,000,000 reservations, 6,500,000
events, 1,000,000 payments, 300,000 stored answers), built once and kept as
`holdfast_production_large` (`--reuse` takes it as an earlier run left it),
then analysed; each run measures on a copy of it, so that runs start alike.
The fresh one is a newly migrated database with 10,000 assets. On each,
besides, the scenarios' own assets (bench/compare.py's `Side`: the hot,
sold and replayed assets, and each round's assets for the writes). Both
services serve at once; `hot-held`, `hot-sold`, `replay`, `spread-hold` and
`hold-commit` alternate between the two, the order swapped every round
(wrk at 64 connections). Written to bench/RESULTS.md (section
`production-writes`): medians of the rounds, and the ratio large / fresh
round by round.

    python3 bench/production_writes.py [--rounds 3] [--seconds 8] [--reuse] [--keep]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import production  # noqa: E402
import sections  # noqa: E402
from compare import COUNTED, SCENARIOS, Side, hot_share  # noqa: E402
from service import need_wrk, psql  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LARGE = "holdfast_production_large"
COPY = "holdfast_production_writes"
# The largest shortfall of the large database's rate from the fresh one's.
WITHIN = 0.10


def say(text: str) -> None:
    print(f"[production-writes {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--reuse", action="store_true",
                        help=f"take {LARGE} as an earlier run left it")
    parser.add_argument("--keep", action="store_true", help=f"keep {LARGE}")
    args = parser.parse_args()
    need_wrk()
    started = time.time()
    subprocess.run(["cargo", "build", "-q", "--release", "--bin", "holdfast"], cwd=ROOT,
                   check=True)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    binary = os.path.join(target, "release", "holdfast")
    if not args.reuse:
        took = production.build(binary, LARGE, production.SIZES["large"])
        say(f"{LARGE}: built in {took:.0f} s")
        production.analyze(LARGE)
    subprocess.run([binary, "migrate"], check=True, capture_output=True,
                   env=dict(os.environ, HOLDFAST_DATABASE_URL=production.url(LARGE)))
    psql(f"DROP DATABASE IF EXISTS {COPY} WITH (FORCE)")
    psql(f"CREATE DATABASE {COPY} TEMPLATE {LARGE} STRATEGY FILE_COPY")
    size = psql(f"SELECT pg_size_pretty(pg_database_size('{COPY}'))")
    say(f"{COPY}: a copy of {LARGE} ({size})")
    scenarios = list(SCENARIOS)
    results = {(s, n): [] for s in scenarios for n in ("fresh", "large")}
    with tempfile.TemporaryDirectory() as work:
        sides = [Side("fresh", binary, 18431, work, 10_000, args.rounds, args.seconds)]
        try:
            sides.append(Side("large", binary, 18432, work, 0, args.rounds, args.seconds,
                              db=COPY))
            load = os.getloadavg()
            for r in range(args.rounds):
                for scenario in scenarios:
                    for side in (sides if r % 2 == 0 else sides[::-1]):
                        m = side.measure(scenario, args.seconds, r)
                        results[(scenario, side.name)].append(m)
                        say(f"round {r + 1} {scenario:11} {side.name}: {m['rps']:.0f}/s, "
                            f"server {m['server_us']:.1f} µs, PostgreSQL {m['pg_us']:.1f} µs")
        finally:
            for side in sides:
                side.stop()
    psql(f"DROP DATABASE IF EXISTS {COPY} WITH (FORCE)")
    if not args.keep:
        psql(f"DROP DATABASE IF EXISTS {LARGE} WITH (FORCE)")
    median = statistics.median
    lines = [
        "## The scenarios at production size (`bench/production_writes.py`)",
        "",
        f"Run on {time.strftime('%Y-%m-%d')}: {os.cpu_count()} CPUs, {platform.platform()}; one "
        f"build, two databases served at once: a copy of bench/production.py's large database "
        f"(2,000,000 assets with 90 days of history, {size}) and a fresh one (10,000 assets), "
        f"each with the scenarios' own assets; {args.rounds} rounds, each scenario "
        f"{args.seconds} s on one then the other, the order swapped every round (wrk, 64 "
        f"connections, a pool of 32 each); load average {load[0]:.2f} at the start; took "
        f"{time.time() - started:.0f} s. Medians of the rounds; holds (201) per second for "
        "`spread-hold`, sales (200) per second for `hold-commit`, else requests per second. "
        f"Target: the large database within {WITHIN:.0%} of the fresh one.",
        "",
        "| scenario | fresh per second | large per second | large / fresh (rounds) | "
        "server µs/req | PostgreSQL µs/req | asset updates in place (HOT) | unexpected answers "
        "| verdict |",
        "|---|---:|---:|---|---|---|---|---:|---|",
    ]
    for scenario in scenarios:
        f, g = results[(scenario, "fresh")], results[(scenario, "large")]
        ratios = [y["rps"] / x["rps"] for x, y in zip(f, g)]
        ratio = median(ratios)
        lines.append(
            f"| {scenario} | {median([x['rps'] for x in f]):.0f} "
            f"| {median([x['rps'] for x in g]):.0f} "
            f"| {ratio:.2f} ({' / '.join(f'{x:.2f}' for x in ratios)}) "
            f"| {median([x['server_us'] for x in f]):.1f} → "
            f"{median([x['server_us'] for x in g]):.1f} "
            f"| {median([x['pg_us'] for x in f]):.1f} → {median([x['pg_us'] for x in g]):.1f} "
            f"| {hot_share(f)} → {hot_share(g)} | {sum(x['bad'] for x in f + g)} "
            f"| {'met' if ratio >= 1 - WITHIN else 'not met'} |")
    lines += ["", "Writes counted: " + ", ".join(f"{s} {c}" for s, c in COUNTED.items()) + "."]
    text = "\n".join(lines) + "\n"
    print(text)
    sections.replace(os.path.join(ROOT, "bench/RESULTS.md"), "production-writes", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
