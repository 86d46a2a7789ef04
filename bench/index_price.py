"""What each index, constraint and sequence on the hold's write path costs
on PostgreSQL: the design's canonical hold (bench/canonical_hold.sql, one
round trip, pgbench with prepared statements, 64 clients) on holdfast's
schema (`holdfast migrate`) and on copies of it that each lack one item,
each copy's run between two runs of the full schema (a shared host's speed
drifts over minutes), the copies' order reversed every round. The ratio of
each copy's rate to the mean of the two beside it is the price of what it
lacks; the last copies lack every item at once, then the assets' other
indexes and the trigger too, and the minimal schema of schema_price.py
lacks everything holdfast adds. Written to
bench/RESULTS.md (section `index-price`).

    python3 bench/index_price.py [--seconds 5] [--rounds 3] [--script hold-commit]

The copies only measure: holdfast needs each item (bench/README.md, "The
indexes a write pays for", says for what).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import schema_price  # noqa: E402
import sections  # noqa: E402
from service import psql  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNIQUE_SEQUENCE = "ALTER TABLE events DROP CONSTRAINT events_asset_sequence_key"
NO_IDENTITY = ["ALTER TABLE events ALTER COLUMN position DROP IDENTITY",
               "ALTER TABLE events ALTER COLUMN position SET DEFAULT 0"]
# Each copy: what it lacks, and the statements that take it away.
WITHOUT = {
    "events_asset_sequence_key (asset, sequence), unique": [UNIQUE_SEQUENCE],
    "the same, not unique": [UNIQUE_SEQUENCE, "CREATE INDEX events_asset_sequence_idx "
                             "ON events (asset_id, sequence)"],
    "events_feed_idx (txid, position)": ["DROP INDEX events_feed_idx"],
    "events_pending_idx (position) where undelivered": ["DROP INDEX events_pending_idx"],
    "events.position's identity (a sequence)": NO_IDENTITY,
    "idempotency_keys_created_at_idx (created)": ["DROP INDEX idempotency_keys_created_at_idx"],
    "reservations_buyer_idx (buyer, id)": ["DROP INDEX reservations_buyer_idx"],
    "reservations_asset_id_idx (asset, created)": ["DROP INDEX reservations_asset_id_idx"],
    "reservations_one_held_per_asset (asset) where HELD": [
        "DROP INDEX reservations_one_held_per_asset"],
    "the counts' update trigger (not fired by a hold)": [
        "DROP TRIGGER assets_counted_on_update ON assets"],
    "assets.shelf generated (a plain column in its place)": [
        "ALTER TABLE assets ALTER COLUMN shelf DROP EXPRESSION",
        "ALTER TABLE assets ALTER COLUMN shelf SET DEFAULT 'ON_SALE'"],
}
EVERY_ITEM = [UNIQUE_SEQUENCE, "DROP INDEX events_feed_idx", "DROP INDEX events_pending_idx",
              *NO_IDENTITY, "DROP INDEX idempotency_keys_created_at_idx",
              "DROP INDEX reservations_buyer_idx", "DROP INDEX reservations_asset_id_idx",
              "DROP INDEX reservations_one_held_per_asset"]
WITHOUT["every item above"] = EVERY_ITEM
WITHOUT["those, the assets' other indexes and the counts' trigger"] = [
    *EVERY_ITEM, "DROP INDEX assets_id_bytes_idx", "DROP INDEX assets_price_idx",
    "DROP INDEX assets_shelf_idx", "DROP TRIGGER assets_counted_on_update ON assets"]
# Not a copy: the least schema the transaction needs, for scale.
MINIMAL = "everything: the minimal schema (bench/minimal_schema.sql)"
WITHOUT[MINIMAL] = []


# The assets each script holds: C-<id> and K-<id> (see the scripts).
SCRIPT_PREFIX = {"hold": "C", "hold-commit": "K"}
WRITTEN = ("assets", "reservations", "events", "idempotency_keys", "payments")


def seed(db: str, prefix: str, slots: int) -> None:
    """The script's assets, and no autovacuum on the written tables: with a
    dozen databases on one server, one copy's vacuum would otherwise run
    during another's measurement."""
    psql(f"INSERT INTO assets (id, name, created_at, updated_at) "
         f"SELECT '{prefix}-' || (n * 100 + c), 'lot', now(), now() "
         f"FROM generate_series(0, {schema_price.CLIENTS - 1}) c, "
         f"generate_series(1, {slots}) n ORDER BY c, n", db)
    for table in WRITTEN:
        psql(f"ALTER TABLE {table} SET (autovacuum_enabled = off)", db)
    psql("VACUUM ANALYZE", db)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--script", choices=sorted(schema_price.SCRIPTS), default="hold")
    parser.add_argument("--bin", help="holdfast binary (default: cargo build --release)")
    parser.add_argument("--tps-max", type=int, default=6000,
                        help="room for this many transactions a second per run")
    args = parser.parse_args()
    binary = schema_price.release_binary(args.bin)
    started, load = time.monotonic(), os.getloadavg()[0]
    per_run = (args.seconds + 2) * args.tps_max // schema_price.CLIENTS + 50
    names = ["holdfast's schema", *WITHOUT]
    full = names[0]
    dbs = {name: f"holdfast_bench_index_{i}_{os.getpid()}" for i, name in enumerate(names)}
    # Runs per database: the full schema's run before and after each copy's.
    planned = {name: args.rounds + 1 for name in WITHOUT}
    planned[full] = args.rounds * (len(WITHOUT) + 1) + 1
    used = {name: 0 for name in names}
    runs: dict[str, list] = {name: [] for name in WITHOUT}
    ratios: dict[str, list] = {name: [] for name in WITHOUT}
    fulls: list = []

    def run(name: str, seconds: int) -> tuple[float, int, int]:
        result = schema_price.pgbench(dbs[name], schema_price.SCRIPTS[args.script], seconds,
                                      used[name] * per_run)
        used[name] += 1
        return result

    try:
        for name, db in dbs.items():
            schema_price.create(db, name == MINIMAL, binary)
            for statement in WITHOUT.get(name, []):
                psql(statement, db)
            print(f"seeding: {name}", file=sys.stderr)
            seed(db, SCRIPT_PREFIX[args.script], per_run * planned[name])
        for name in names:
            # Each copy's pages read once, as the rounds will find them.
            run(name, 2)
        # The host's speed drifts over minutes: each copy is measured between
        # two runs of the full schema and judged against their mean.
        for r in range(args.rounds):
            before = run(full, args.seconds)
            fulls.append(before)
            for name in (list(WITHOUT) if r % 2 == 0 else list(WITHOUT)[::-1]):
                result = run(name, args.seconds)
                after = run(full, args.seconds)
                fulls.append(after)
                runs[name].append(result)
                ratios[name].append(result[0] / ((before[0] + after[0]) / 2))
                print(f"round {r + 1} {name}: {result[0]:.0f} tx/s between {before[0]:.0f} "
                      f"and {after[0]:.0f}, {result[1]} B WAL", file=sys.stderr)
                before = after
    finally:
        for db in dbs.values():
            psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    out = [
        f"## What each item of the {args.script}'s write path costs (`bench/index_price.py`)",
        "",
        f"Run on {time.strftime('%Y-%m-%d')}: {os.cpu_count()} CPUs, {platform.platform()}; load "
        f"average {load:.2f} at the start; took {time.monotonic() - started:.0f} s. The canonical "
        f"{args.script} ({schema_price.SCRIPTS[args.script]}, one round trip, pgbench with "
        f"prepared statements and {schema_price.CLIENTS} clients for {args.seconds} s) on "
        f"holdfast's schema and on copies that each lack one item, without autovacuum, each "
        f"warmed by 2 s of the same, then {args.rounds} rounds, the order reversed every round, "
        "each copy's run between two of the full schema's; medians of the rounds. The ratio is "
        "the copy's rate against the mean of those two: what the item costs.",
        "",
        "| without | per second | against the full schema (rounds) | WAL per transaction |",
        "|---|---:|---|---:|",
        f"| (nothing: holdfast's schema) | {statistics.median(x[0] for x in fulls):,.0f} | 1.00 "
        f"| {statistics.median(x[1] for x in fulls):,.0f} B |",
    ]
    for name in WITHOUT:
        out.append(f"| {name} | {statistics.median(x[0] for x in runs[name]):,.0f} "
                   f"| {statistics.median(ratios[name]):.2f} "
                   f"({' / '.join(f'{x:.2f}' for x in ratios[name])}) "
                   f"| {statistics.median(x[1] for x in runs[name]):,.0f} B |")
    sections.replace(os.path.join(ROOT, "bench/RESULTS.md"), "index-price", "\n".join(out))
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
