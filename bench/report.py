"""Writes bench/RESULTS.md from the raw results of bench/run.sh.

Every figure is the median of the runs; each ratio is taken within a run
(a scenario against the ceilings measured in that same run), and the
ratios of the runs are shown beside their median. A scenario that beats
its ceiling in any run is a broken measurement: a ceiling must bound what
it measures. Exits 1 when a scenario answered anything it should not have,
or a ceiling's transactions failed."""
import datetime
import os
import platform
import re
import statistics
import subprocess
import sys

results_path, seconds, runs_asked, wall = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

# data[run][name]: what was measured for one scenario or ceiling in one run.
data = {}
indexes = {}  # table -> [(index, predicate or None)]
rss = {}  # backend -> {run: kib}
soak_rss = {}  # backend -> [(t, kib)]
load = {}  # start/end -> the 1, 5 and 15 min load averages
for line in open(results_path):
    line = line.rstrip("\n")
    m = re.match(r"machine loadavg_(\w+) (.*)", line)
    if m:
        load[m.group(1)] = m.group(2)
        continue
    m = re.match(r"schema INDEX (\S+) (\S+) (.*)", line)
    if m:
        indexes.setdefault(m.group(1), []).append((m.group(2), None if m.group(3) == "-" else m.group(3)))
        continue
    m = re.match(r"soak (\S+) rss_at (\d+) (\d+)", line)
    if m:
        soak_rss.setdefault(m.group(1), []).append((int(m.group(2)), int(m.group(3))))
        continue
    m = re.match(r"(\S+) (\S+) rss_kib (\d+)", line)
    if m:
        rss.setdefault(m.group(2), {})[m.group(1)] = int(m.group(3))
        continue
    m = re.match(r"(\S+) (.+?) (RESULT|STATUSES|STATEMENTS|XACTS|OTHER|WAL|TABLE|WALDUMP|CPU)\b ?(.*)", line)
    if not m:
        continue
    run, name, kind, rest = m.groups()
    d = data.setdefault(run, {}).setdefault(name, {})
    if kind == "RESULT":
        kv = dict(x.split("=") for x in rest.split())
        d.update(requests=int(kv["requests"]), secs=float(kv["seconds"]), p50=int(kv["p50"]),
                 p99=int(kv["p99"]), errors=int(kv["errors"]))
        d["rps"] = d["requests"] / d["secs"] if d["secs"] else 0.0
    elif kind == "STATUSES":
        d["statuses"] = {k: int(v) for k, v in (x.split("=") for x in rest.split())}
    elif kind in ("STATEMENTS", "XACTS", "OTHER"):
        d[kind.lower()] = int(rest)
    elif kind == "WAL":
        d["wal"] = {k: int(v) for k, v in (x.split("=") for x in rest.split())}
    elif kind == "WALDUMP":
        d["waldump"] = {k: int(v) for k, v in (x.split("=") for x in rest.split())}
    elif kind == "CPU":
        d["cpu"] = {k: int(v) for k, v in (x.split("=") for x in rest.split())}
    elif kind == "TABLE":
        table, *kv = rest.split()
        d.setdefault("tables", {})[table] = {k: int(v) for k, v in (x.split("=") for x in kv)}

runs = sorted((r for r in data if r != "soak"), key=int)
soak = data.get("soak", {})

expected = {"ceiling": {"409"}, "ceiling-get": {"409"}, "hot-held": {"409"}, "hot-sold": {"409"},
            "spread-hold": {"201"}, "hold-commit": {"201", "200"}, "replay": {"200"}, "soak": {"201"}}


def unexpected(d, scenario):
    bad = d.get("errors", 0)
    if scenario in expected:
        bad += sum(v for k, v in d.get("statuses", {}).items() if k not in expected[scenario])
    return bad


def per_run(name, f):
    """f(data of name in run, run) for each run that has it; None when f gives None."""
    values = []
    for r in runs:
        d = data[r].get(name)
        if d and "rps" in d:
            v = f(d, r)
            if v is not None:
                values.append(v)
    return values


def med(values):
    return statistics.median(values) if values else None


def ms(us):
    return "–" if us is None else f"{us / 1000:.2f}"


def num(x, fmt="{:.0f}"):
    return "–" if x is None else fmt.format(x)


def spread(values, fmt="{:.2f}"):
    return " / ".join(fmt.format(v) for v in values)


def ops(name, d):
    """Operations of a write: sales for hold-commit (its 200s), holds for
    spread-hold (its 201s), passes of the script for pgbench."""
    if name.endswith("hold-commit") and "statuses" in d:
        return d["statuses"].get("200", 0)
    if name.endswith("spread-hold") and "statuses" in d:
        return d["statuses"].get("201", 0)
    return d["requests"]


def ops_rate(name, d):
    return ops(name, d) / d["secs"] if d["secs"] else 0.0


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"


unexpected_total = 0
broken = []  # (scenario, ceiling label, runs)
lines = []
cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip()
mem = sh("awk '/MemTotal/ {printf \"%.0f GiB\", $2/1048576}' /proc/meminfo")
pg = sh("psql -X -h 127.0.0.1 -U postgres -d postgres -Atc 'SHOW server_version' 2>/dev/null")
lines += [
    "# Benchmark results",
    "",
    f"Run by `bench/run.sh` on {datetime.date.today()}: {os.cpu_count()} CPUs ({cpu}), {mem}, "
    f"{platform.system()} {platform.release()}, PostgreSQL {pg}; server, database and load generator share the machine. "
    f"{len(runs)} runs (of {runs_asked} asked), each measuring its own ceilings; every figure is the median of the runs, "
    "every ratio the median of the runs' own ratios (a scenario against the ceiling of its run), the runs' ratios shown "
    f"beside it. {seconds} s per scenario after a warm-up, 64 connections (wrk) or 64 clients (pgbench). "
    f"The whole benchmark took {wall // 60} min {wall % 60} s"
    + (f"; load average {load['start']} when the measuring began, {load.get('end', '?')} at its end (1, 5, 15 min)"
       if "start" in load else "") + ". Latencies in ms.",
    "",
    "## Ceilings",
    "",
    "The HTTP ceiling is a minimal actix-web handler reading the body and answering one of a 409's size, driven with "
    "the very requests of hot-held (a POST with a JSON body and a new Idempotency-Key each); the GET figure is for "
    "reference. The SQL ceilings are the design's transactions (`bench/canonical_hold.sql`, "
    "`bench/canonical_hold_commit.sql`) run by pgbench with prepared statements at 64 clients on a database migrated by "
    "`holdfast migrate`, each transaction sent in one round trip (a pipeline); one hold-and-commit is a pair of "
    "transactions, one sale. The last row is not a ceiling: it is the service's own hold statements "
    "(`examples/hold_sql`) run by pgbench in the service's round trips, a diagnosis of what they cost without the "
    "service.",
    "",
    "| ceiling | per second (median) | runs | p50 | p99 | errors | statements per operation |",
    "|---|---:|---|---:|---:|---:|---:|",
]
ceilings = [("ceiling", "HTTP ceiling (POST, hot-held's requests)", "req/s"),
            ("ceiling-get", "HTTP ceiling, GET (reference)", "req/s"),
            ("sql-hold", "SQL ceiling: canonical hold", "holds/s"),
            ("sql-hold-commit", "SQL ceiling: canonical hold and commit", "sales/s"),
            ("sql-service-hold", "diagnosis, not a ceiling: the service's hold statements", "holds/s")]
for name, label, unit in ceilings:
    rates = per_run(name, lambda d, r: d["rps"])
    if not rates:
        continue
    bad = sum(unexpected(data[r][name], name) for r in runs if name in data[r])
    unexpected_total += bad
    stmts = med(per_run(name, lambda d, r: d["statements"] / d["requests"] if d.get("statements") and d["requests"] else None))
    lines.append(f"| {label} | {med(rates):.0f} {unit} | {spread(rates, '{:.0f}')} | "
                 f"{ms(med(per_run(name, lambda d, r: d['p50'])))} | {ms(med(per_run(name, lambda d, r: d['p99'])))} | "
                 f"{bad} | {num(stmts, '{:.0f}')} |")
lines.append("")

# (scenario, its ceiling, label of the ceiling, throughput target or None)
plan = [("hot-held", "ceiling", "HTTP", 0.60), ("hot-sold", "ceiling", "HTTP", 0.60),
        ("replay", "ceiling", "HTTP", None), ("spread-hold", "sql-hold", "canonical hold", 0.70),
        ("hold-commit", "sql-hold-commit", "canonical hold and commit", 0.60)]
targets = []  # (what, measured, verdict)


def ratio_runs(name, ceiling, rate):
    out = []
    for r in runs:
        d, c = data[r].get(name), data[r].get(ceiling)
        if d and c and "rps" in d and "rps" in c and c["rps"]:
            out.append((r, rate(d) / rate(c)))
    return out


def p99_runs(name, ceiling):
    out = []
    for r in runs:
        d, c = data[r].get(name), data[r].get(ceiling)
        if d and c and d.get("p99") and c.get("p99"):
            out.append(d["p99"] / c["p99"])
    return out


lines += [
    "## PostgreSQL",
    "",
    "`hold-commit` is measured in sales per second (its 200s), against the canonical hold-and-commit's pairs per "
    "second, and its p99 (of single requests) against the p99 of a pair. A ratio above 1.00 in any run is a broken "
    "measurement: the ceiling does not bound the scenario.",
    "",
    "| scenario | req/s | p50 | p99 | unexpected answers | ceiling | ratio to ceiling (median) | runs | target | "
    "p99 / ceiling p99 | statements per request | transactions per request |",
    "|---|---:|---:|---:|---:|---|---:|---|---|---:|---:|---:|",
]
for scenario, ceiling, label, target in plan:
    name = f"postgres {scenario}"
    rates = per_run(name, lambda d, r: d["rps"])
    if not rates:
        continue
    bad = sum(unexpected(data[r][name], scenario) for r in runs if name in data[r])
    unexpected_total += bad
    if scenario == "hold-commit":
        rate = lambda d: ops_rate("hold-commit", d) if "statuses" in d else d["rps"]
        shown = f"{med(rates):.0f} ({med(per_run(name, lambda d, r: ops_rate(name, d))):.0f} sales/s)"
    else:
        rate = lambda d: d["rps"]
        shown = f"{med(rates):.0f}"
    rr = ratio_runs(name, ceiling, rate)
    ratio = med([v for _, v in rr])
    beaten = [r for r, v in rr if v > 1.0]
    p99r = med(p99_runs(name, ceiling))
    ratio_cell = num(ratio, "{:.2f}")
    if beaten:
        broken.append((f"{scenario} (PostgreSQL)", label, beaten))
        ratio_cell += " **broken measurement**"
        verdict = "broken measurement"
    elif target is not None and ratio is not None:
        verdict = "met" if ratio >= target else "not met"
    else:
        verdict = ""
    goal = f"≥ {target:.2f}: {verdict}" if target is not None else (verdict or "–")
    if target is not None:
        what = "sales/s" if scenario == "hold-commit" else "req/s"
        targets.append((f"{scenario} {what} ≥ {target:.2f} × {label} ceiling", f"{ratio_cell} ({spread([v for _, v in rr])})", verdict))
    count = lambda d: max(d["requests"], 1)
    st = med(per_run(name, lambda d, r: d["statements"] / count(d) if "statements" in d else None))
    xa = med(per_run(name, lambda d, r: d["xacts"] / count(d) if "xacts" in d else None))
    lines.append(f"| {scenario} | {shown} | {ms(med(per_run(name, lambda d, r: d['p50'])))} | "
                 f"{ms(med(per_run(name, lambda d, r: d['p99'])))} | {bad} | {label} | {ratio_cell} | "
                 f"{spread([v for _, v in rr])} | {goal} | {num(p99r, '{:.1f}')} | {num(st, '{:.2f}')} | {num(xa, '{:.2f}')} |")
    if p99r is not None:
        targets.append((f"{scenario} p99 ≤ 3 × {label} ceiling's p99", f"{p99r:.1f} ({spread(p99_runs(name, ceiling), '{:.1f}')})",
                        "met" if p99r <= 3 else "not met"))
lines.append("")

# The writes with the default pool, beside the pool sized like the clients.
default_pool = [(sc, c, l) for sc, c, l, _ in plan
                if sc in ("spread-hold", "hold-commit") and per_run(f"postgres-default-pool {sc}", lambda d, r: d["rps"])]
if default_pool:
    lines += [
        "### The writes with the default pool",
        "",
        "The scenarios above run with `HOLDFAST_DB_POOL_SIZE=64`, as many database connections as pgbench's clients "
        "in the SQL ceilings. These run the same writes with the default pool of 16 connections, on a fresh copy of "
        "the same database in the same run: a commit waits for the disk, so fewer transactions in flight means fewer "
        "commits sharing each flush. Ratios against the ceilings of the same run.",
        "",
        "| scenario | pool of 64: per second | default pool (16): per second | default / 64 (runs) | "
        "default pool: ratio to ceiling (runs) | p99 default pool | unexpected answers |",
        "|---|---:|---:|---|---|---:|---:|",
    ]
    for scenario, ceiling, label in default_pool:
        full, small = f"postgres {scenario}", f"postgres-default-pool {scenario}"
        rate = (lambda d: ops_rate(scenario, d)) if scenario == "hold-commit" else (lambda d: d["rps"])
        rr = [rate(data[r][small]) / rate(data[r][full]) for r in runs
              if "rps" in data[r].get(small, {}) and data[r].get(full, {}).get("rps")]
        cr = [v for _, v in ratio_runs(small, ceiling, rate)]
        bad = sum(unexpected(data[r][small], scenario) for r in runs if small in data[r])
        unexpected_total += bad
        unit = " sales/s" if scenario == "hold-commit" else " holds/s"
        lines.append(
            f"| {scenario} | {num(med(per_run(full, lambda d, r: rate(d))))}{unit} | "
            f"{num(med(per_run(small, lambda d, r: rate(d))))}{unit} | {num(med(rr), '{:.2f}')} ({spread(rr)}) | "
            f"{num(med(cr), '{:.2f}')} ({spread(cr)}) of {label} | {ms(med(per_run(small, lambda d, r: d['p99'])))} | {bad} |")
    lines.append("")

# Where the cost is: the writes on PostgreSQL, per operation.
writes = [("sql-hold", "canonical hold (SQL ceiling)", "hold"),
          ("postgres spread-hold", "spread-hold (service)", "hold (201)"),
          ("sql-hold-commit", "canonical hold and commit (SQL ceiling)", "sale (pair)"),
          ("postgres hold-commit", "hold-commit (service)", "sale (200; its hold included)"),
          ("sql-service-hold", "the service's hold statements by pgbench (diagnosis)", "hold")]


def per_op(name, f):
    return med(per_run(name, lambda d, r: f(d) / ops(name, d) if ops(name, d) and f(d) is not None else None))


def n_indexes(table):
    return len(indexes.get(table, []))


def entries(t, table):
    """Index entries a table's writes maintain by the rule: an insert and a
    non-HOT update each every index of the table (partial ones included,
    so an upper bound), a HOT update none."""
    return (t.get("ins", 0) + t.get("upd", 0) - t.get("hot", 0)) * n_indexes(table)


if any(w in data.get(r, {}) for r in runs for w, _, _ in writes):
    has_dump = any("waldump" in data[r].get(w, {}) for r in runs for w, _, _ in writes)
    lines += [
        "## Where the cost is (PostgreSQL writes, per operation)",
        "",
        "WAL from `pg_stat_wal`, reset before each measured run and read after it: it counts the whole cluster. "
        + ("This database's own WAL is also counted in the WAL itself with `pg_waldump` (its relations' records and "
           "its transactions' commits, with their full-page images), whatever else the cluster ran meanwhile. "
           if has_dump else "")
        + "Full-page images follow the checkpoint taken before each warm-up, the same for every write. Statements "
        "as sent (the server's own count, or the script's commands), transactions from `pg_stat_database`.",
        "",
        "| write | per | per second | WAL bytes | WAL records | full-page images |"
        + (" this database's WAL: bytes, records, full-page images |" if has_dump else "")
        + " statements | transactions |",
        "|---|---|---:|---:|---:|---:|" + ("---|" if has_dump else "") + "---:|---:|",
    ]
    rows_table = [
        "Rows from `pg_stat_user_tables`. Index entries by the rule: an insert and a non-HOT update maintain every "
        "index of their table, a HOT update none (partial indexes counted as maintained, so an upper bound)"
        + ("; the B-tree leaf entries actually written, from the WAL." if has_dump else "."),
        "",
        "| write | per | rows inserted | rows updated | of which HOT | index entries (rule) |"
        + (" B-tree leaf entries written |" if has_dump else ""),
        "|---|---|---:|---:|---:|---:|" + ("---:|" if has_dump else ""),
    ]
    for name, label, per in writes:
        if not per_run(name, lambda d, r: d.get("wal")):
            continue
        wal = lambda k: per_op(name, lambda d: d.get("wal", {}).get(k))
        dump = lambda k: per_op(name, lambda d: d.get("waldump", {}).get(k))
        tables = lambda d, k: sum(t.get(k, 0) for t in d.get("tables", {}).values())
        row = (f"| {label} | {per} | {med(per_run(name, lambda d, r: ops_rate(name, d))):.0f} | {num(wal('bytes'))} | "
               f"{num(wal('records'), '{:.1f}')} | {num(wal('fpi'), '{:.2f}')} |")
        if has_dump:
            row += f" {num(dump('bytes'))}, {num(dump('records'), '{:.1f}')}, {num(dump('fpi'), '{:.2f}')} |"
        row += (f" {num(per_op(name, lambda d: d.get('statements')), '{:.1f}')} |"
                f" {num(per_op(name, lambda d: d.get('xacts')), '{:.2f}')} |")
        lines.append(row)
        row = (f"| {label} | {per} | {num(per_op(name, lambda d: tables(d, 'ins')), '{:.2f}')} | "
               f"{num(per_op(name, lambda d: tables(d, 'upd')), '{:.2f}')} | {num(per_op(name, lambda d: tables(d, 'hot')), '{:.2f}')} | "
               f"{num(per_op(name, lambda d: sum(entries(t, tb) for tb, t in d.get('tables', {}).items())), '{:.1f}')} |")
        if has_dump:
            row += f" {num(dump('btree_leaf'), '{:.1f}')} |"
        rows_table.append(row)
    lines += [""] + rows_table
    noisy = [(label, r, data[r][name]["other"]) for name, label, _ in writes for r in runs
             if data[r].get(name, {}).get("other", 0) > 0]
    if noisy:
        lines += ["", "`pg_stat_wal` counts the whole cluster: while these writes were measured, other databases "
                  "committed transactions too (" + "; ".join(f"{label}, run {r}: {n}" for label, r, n in noisy) +
                  "), whose WAL the figures above include. The rows, statements, transactions and B-tree entries "
                  "are this database's alone."]
    else:
        lines += ["", "No other database committed a transaction while these writes were measured: the cluster-wide "
                  "WAL figures are theirs alone."]
    lines += ["", "The indexes of each table the writes touch (`pg_indexes`; partial ones with their condition):", "",
              "| table | indexes |", "|---|---|"]
    touched = sorted({tb for r in runs for w, _, _ in writes for tb in data[r].get(w, {}).get("tables", {})})
    for table in touched:
        names = ", ".join(f"`{i}`" + (f" (where {p})" if p else "") for i, p in indexes.get(table, []))
        lines.append(f"| {table} | {names} |")
    lines.append("")
    for name, label, per in writes:
        per_table = {}
        for r in runs:
            for table, t in data[r].get(name, {}).get("tables", {}).items():
                per_table.setdefault(table, None)
        if not per_table:
            continue
        lines += [f"**{label}**, per {per}:", "",
                  "| table | indexes | inserted | updated | of which HOT | index entries (rule) |",
                  "|---|---:|---:|---:|---:|---:|"]
        for table in sorted(per_table):
            f = lambda k: per_op(name, lambda d: d.get("tables", {}).get(table, {}).get(k, 0))
            e = per_op(name, lambda d: entries(d.get("tables", {}).get(table, {}), table))
            lines.append(f"| {table} | {n_indexes(table)} | {f('ins'):.2f} | {f('upd'):.2f} | {f('hot'):.2f} | {e:.1f} |")
        lines.append("")

# PostgreSQL through PgBouncer, beside the direct connection of the same run;
# the CPU each request costs; two instances behind the pooler.
def cpu_per(name, part, per):
    """Median CPU µs of `part` (server, postgres, pooler) per operation."""
    return med(per_run(name, lambda d, r: d["cpu"][f"{part}_ms"] * 1000 / max(per(d), 1) if "cpu" in d else None))


pooled = [sc for sc in ("hot-held", "spread-hold", "hold-commit") if per_run(f"postgres-pgbouncer {sc}", lambda d, r: d["rps"])]
if pooled:
    lines += [
        "## PostgreSQL through PgBouncer",
        "",
        "The same service through PgBouncer 1.18 in transaction pooling mode (`deploy/pgbouncer.ini`) with "
        "`HOLDFAST_DB_PREPARED_STATEMENTS=false`, on a fresh copy of the same database, beside the direct connection of "
        "the same run; the ratio is the pooled rate over the direct one, run by run. PgBouncer shares the two cores "
        "with everything else, so its own CPU is part of what the ratio shows.",
        "",
        "| scenario | direct req/s | through PgBouncer req/s | pooled / direct (runs) | p99 direct | p99 pooled | "
        "unexpected answers | statements per request (direct, pooled) | transactions per request (direct, pooled) |",
        "|---|---:|---:|---|---:|---:|---:|---|---|",
    ]
    for scenario in pooled:
        direct, pool = f"postgres {scenario}", f"postgres-pgbouncer {scenario}"
        rate = (lambda d: ops_rate(scenario, d)) if scenario == "hold-commit" else (lambda d: d["rps"])
        rr = [rate(data[r][pool]) / rate(data[r][direct]) for r in runs
              if "rps" in data[r].get(pool, {}) and data[r].get(direct, {}).get("rps")]
        bad = sum(unexpected(data[r][pool], scenario) for r in runs if pool in data[r])
        unexpected_total += bad
        count = lambda d: max(d["requests"], 1)
        st = [num(med(per_run(n, lambda d, r: d["statements"] / count(d) if "statements" in d else None)), "{:.2f}") for n in (direct, pool)]
        xa = [num(med(per_run(n, lambda d, r: d["xacts"] / count(d) if "xacts" in d else None)), "{:.2f}") for n in (direct, pool)]
        unit = " sales/s" if scenario == "hold-commit" else ""
        lines.append(
            f"| {scenario} | {num(med(per_run(direct, lambda d, r: rate(d))))}{unit} | {num(med(per_run(pool, lambda d, r: rate(d))))}{unit} | "
            f"{num(med(rr), '{:.2f}')} ({spread(rr)}) | {ms(med(per_run(direct, lambda d, r: d['p99'])))} | "
            f"{ms(med(per_run(pool, lambda d, r: d['p99'])))} | {bad} | {st[0]}, {st[1]} | {xa[0]}, {xa[1]} |")
    lines.append("")

cost_rows = []
for name, label, per_label in [
        ("postgres hot-held", "hot-held, direct", "request"),
        ("postgres-pgbouncer hot-held", "hot-held, through PgBouncer", "request"),
        ("postgres spread-hold", "spread-hold, direct", "hold (201)"),
        ("postgres-pgbouncer spread-hold", "spread-hold, through PgBouncer", "hold (201)"),
        ("postgres hold-commit", "hold-commit, direct", "sale (its hold included)"),
        ("postgres-pgbouncer hold-commit", "hold-commit, through PgBouncer", "sale (its hold included)"),
        ("postgres-two hot-held", "hot-held, two instances through PgBouncer", "request"),
        ("postgres-two spread-hold", "spread-hold, two instances through PgBouncer", "hold (201)")]:
    if not per_run(name, lambda d, r: d.get("cpu")):
        continue
    per = lambda d, n=name: ops(n, d) if not n.endswith("hold-commit") else ops_rate(n, d) * d["secs"]
    server, database, pooler = (cpu_per(name, part, per) for part in ("server", "postgres", "pooler"))
    rate = med(per_run(name, lambda d, r, n=name: ops_rate(n, d)))
    capacity = 1e6 / database if database else None
    cost_rows.append(f"| {label} | {per_label} | {num(rate)} | {num(server)} | {num(database)} | {num(pooler)} | "
                     f"{num(capacity)} | {num(1e6 / server if server else None)} |")
if cost_rows:
    lines += [
        "## The cost of a request, and how many instances a primary carries",
        "",
        "CPU time over each measured run, from `/proc` (user and system): of the holdfast server(s), of every "
        "PostgreSQL process (the backends doing the statements, the WAL writer, the checkpointer), and of PgBouncer, "
        "divided by the operations done. The last two columns turn it into what one core does each second: the "
        "operations one core of the database carries (PostgreSQL's CPU alone), and one core of holdfast instances. On "
        "this machine the load generator takes a share of the same two cores, so the absolute rates above are lower "
        "than what those cores would carry alone; the costs per operation are what the sizing in "
        "`bench/README.md` rests on.",
        "",
        "| scenario | per | per second (median) | holdfast CPU µs | PostgreSQL CPU µs | PgBouncer CPU µs | "
        "per database core per second | per holdfast core per second |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ] + cost_rows + [""]

two = [sc for sc in ("hot-held", "spread-hold") if per_run(f"postgres-two {sc}", lambda d, r: d["rps"])]
if two:
    lines += [
        "Two instances through PgBouncer, the 64 connections split between them (last run only). On two shared cores "
        "this is **CPU-bound**: the instances, PostgreSQL, PgBouncer and the load generator compete for the same cores, "
        "so a second instance cannot add throughput here; it shows that the pair serves correctly under load and what "
        "the contention costs, not capacity.",
        "",
        "| scenario | two instances req/s | one instance through PgBouncer req/s (same run) | two / one | unexpected answers |",
        "|---|---:|---:|---:|---:|",
    ]
    last = runs[-1]
    for scenario in two:
        d2, d1 = data[last].get(f"postgres-two {scenario}", {}), data[last].get(f"postgres-pgbouncer {scenario}", {})
        rate = (lambda d: ops_rate(scenario, d)) if scenario == "spread-hold" else (lambda d: d.get("rps", 0))
        bad = unexpected(d2, scenario)
        unexpected_total += bad
        one = rate(d1) if d1 else None
        lines.append(f"| {scenario} | {num(rate(d2))} | {num(one)} | {num(rate(d2) / one if one else None, '{:.2f}')} | {bad} |")
    lines.append("")

# SQLite, both durabilities.
sqlite_rows = []
for scenario, _, _, _ in plan:
    full, normal = f"sqlite {scenario}", f"sqlite-normal {scenario}"
    if not per_run(full, lambda d, r: d["rps"]) and not per_run(normal, lambda d, r: d["rps"]):
        continue
    cells = []
    for name in (full, normal):
        bad = sum(unexpected(data[r][name], scenario) for r in runs if name in data[r])
        unexpected_total += bad
        cells.append((num(med(per_run(name, lambda d, r: d["rps"]))), ms(med(per_run(name, lambda d, r: d["p50"]))),
                      ms(med(per_run(name, lambda d, r: d["p99"]))), bad))
    fn = [data[r][full]["rps"] / data[r][normal]["rps"] for r in runs
          if "rps" in data[r].get(full, {}) and data[r].get(normal, {}).get("rps")]
    write = scenario in ("spread-hold", "hold-commit")
    http = [v for _, v in ratio_runs(full, "ceiling", lambda d: d["rps"])] if not write else []
    st = med(per_run(full, lambda d, r: d["statements"] / max(d["requests"], 1) if "statements" in d else None))
    sqlite_rows.append(
        f"| {scenario} | {cells[0][0]} | {cells[0][1]} | {cells[0][2]} | {cells[1][0]} | {cells[1][1]} | {cells[1][2]} | "
        f"{cells[0][3] + cells[1][3]} | "
        + (f"{med(fn):.2f} ({spread(fn)})" if write and fn else (f"{med(fn):.2f}" if fn else "–")) + " | "
        + (f"{med(http):.2f} ({spread(http)})" if http else "–") + f" | {num(st, '{:.2f}')} |")
if sqlite_rows:
    lines += [
        "## SQLite: synchronous = FULL (the default) and NORMAL",
        "",
        "The same scenarios on the SQLite-backed server, with its default durability (`PRAGMA synchronous = FULL`: a "
        "commit is on disk before its answer) and with `HOLDFAST_SQLITE_SYNCHRONOUS=normal`, each on a fresh copy of "
        "the same seeded file. No target: the SQL ceilings are PostgreSQL's.",
        "",
        "| scenario | FULL req/s | FULL p50 | FULL p99 | NORMAL req/s | NORMAL p50 | NORMAL p99 | unexpected answers | "
        "FULL / NORMAL (runs) | FULL / HTTP ceiling (runs) | statements per request (FULL) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ] + sqlite_rows + [""]

# Memory.
lines += ["## Memory", ""]
for backend in ("postgres", "sqlite", "sqlite-normal"):
    if backend not in rss:
        continue
    values = [rss[backend][r] for r in runs if r in rss[backend]]
    peak = max(values)
    met = peak <= 64 * 1024
    targets.append((f"peak RSS of the {backend}-backed server ≤ 64 MiB", f"{peak / 1024:.1f} MiB ({spread([v / 1024 for v in values], '{:.1f}')})",
                    "met" if met else "not met"))
    lines.append(f"Peak RSS of the {backend}-backed server: {peak / 1024:.1f} MiB, the highest of the runs "
                 f"({spread([v / 1024 for v in values], '{:.1f}')} MiB; the last run's includes the soak).")
lines.append("")
if soak_rss:
    lines += ["Memory over a long run, in the last run: spread holds on fresh assets, resident memory sampled every 5 s "
              "(no growth: the last sample within 5 % of the one at 10 s).", "",
              "| backend | duration | req/s | unexpected answers | RSS at 10 s | RSS at the end | growth | verdict |",
              "|---|---:|---:|---:|---:|---:|---:|---|"]
    for backend, samples in soak_rss.items():
        d = soak.get(f"{backend} soak", {})
        first = dict(samples).get(10, samples[0][1])
        last_t, last = samples[-1]
        growth = (last - first) / first
        bad = unexpected(d, "soak") if d else 1
        unexpected_total += bad
        met = growth <= 0.05
        targets.append((f"no memory growth over the soak ({backend})", f"{growth * 100:+.1f} %", "met" if met else "not met"))
        lines.append(f"| {backend} | {last_t} s | {d.get('rps', 0):.0f} | {bad} | {first / 1024:.1f} MiB | {last / 1024:.1f} MiB | "
                     f"{growth * 100:+.1f} % | {'met' if met else 'not met'} |")
    lines.append("")

lines += ["## Targets", "", "| target | measured: median (runs) | verdict |", "|---|---|---|"]
lines += [f"| {what} | {measured} | {verdict} |" for what, measured, verdict in targets]
lines.append("")
if broken:
    for scenario, label, beaten in broken:
        lines += [f"**Broken measurement**: {scenario} beat the {label} ceiling in run{'s' if len(beaten) > 1 else ''} "
                  f"{', '.join(beaten)}: that ceiling does not bound what it measures, and its ratio is no target met.", ""]
else:
    lines += ["No scenario beat its ceiling in any run: every ceiling bounded what it measures.", ""]
lines.append("Unexpected answers (a 5xx, a 201 on the hot asset, …) and failed ceiling transactions fail the run: "
             f"{unexpected_total} in this run.")
print("\n".join(lines))
sys.exit(1 if unexpected_total else 0)
