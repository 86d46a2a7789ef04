"""Writes bench/RESULTS.md from the raw results of bench/run.sh; exits 1 when
a scenario answered anything it should not have."""
import datetime
import os
import platform
import re
import subprocess
import sys

results_path, seconds = sys.argv[1], sys.argv[2]
rows, statuses, rss, xacts, totals, stmts, soak_rss = {}, {}, {}, {}, {}, {}, {}
for line in open(results_path):
    m = re.match(r"(.+?) RESULT requests=(\d+) seconds=([\d.]+) p50=(\d+) p99=(\d+) errors=(\d+)", line)
    if m:
        name = m.group(1)
        requests, secs = int(m.group(2)), float(m.group(3))
        rows[name] = dict(rps=requests / secs, p50=int(m.group(4)), p99=int(m.group(5)), errors=int(m.group(6)))
        totals[name] = requests
        continue
    m = re.match(r"(.+?) STATUSES(.*)", line)
    if m:
        statuses[m.group(1)] = dict(kv.split("=") for kv in m.group(2).split())
        continue
    m = re.match(r"(.+?) XACTS (-?\d+)", line)
    if m:
        xacts[m.group(1)] = int(m.group(2))
        continue
    m = re.match(r"(.+?) STATEMENTS (-?\d+)", line)
    if m:
        stmts[m.group(1)] = int(m.group(2))
        continue
    m = re.match(r"(\w+) soak rss_at (\d+) (\d+)", line)
    if m:
        soak_rss.setdefault(m.group(1), []).append((int(m.group(2)), int(m.group(3))))
        continue
    m = re.match(r"(\w+) rss_kib (\d+)", line)
    if m:
        rss[m.group(1)] = int(m.group(2))

expected = {"ceiling": {"409"}, "ceiling-get": {"409"}, "hot-held": {"409"}, "hot-sold": {"409"}, "spread-hold": {"201"},
            "hold-commit": {"201", "200"}, "replay": {"200"}, "soak": {"201"}}
# (scenario, ceiling it is compared with, target ratio for PostgreSQL)
plan = [("hot-held", "ceiling", 0.30), ("hot-sold", "ceiling", 0.30), ("replay", "ceiling", 0.30),
        ("spread-hold", "sql-ceiling", 0.70), ("hold-commit", "ceiling", None)]

unexpected_total = 0
def unexpected(name, scenario):
    got = statuses.get(name, {})
    return sum(int(v) for k, v in got.items() if k not in expected[scenario])

def ms(us):
    return f"{us / 1000:.2f}"

def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"

lines = []
cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip()
mem = sh("awk '/MemTotal/ {printf \"%.0f GiB\", $2/1048576}' /proc/meminfo")
pg = sh("psql -h 127.0.0.1 -U postgres -Atc 'SHOW server_version' 2>/dev/null")
lines += [
    "# Benchmark results",
    "",
    f"Run by `bench/run.sh` on {datetime.date.today()}: {os.cpu_count()} CPUs ({cpu}), {mem}, "
    f"{platform.system()} {platform.release()}, PostgreSQL {pg}; server, database and load generator share the machine.",
    f"wrk, 64 connections, {seconds} s per scenario after a warm-up; the HTTP ceiling is a minimal actix-web "
    "handler that reads the body and answers one of a 409's size, driven with the very requests of hot-held "
    "(POST, a JSON body, a new Idempotency-Key each; the same GET-only figure is shown for reference); the SQL ceiling is pgbench (64 clients) running the service's own "
    "hold statements (snapshot read, then buyer lock and hold in one transaction). Latencies in ms.",
    "",
    "| scenario | backend | req/s | p50 | p99 | unexpected answers | ratio to ceiling | target (PostgreSQL) | p99 / ceiling p99 | statements per request | transactions per request |",
    "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|",
]
labels = {"ceiling": "HTTP ceiling", "ceiling-get": "HTTP ceiling, GET (reference)", "sql-ceiling": "SQL ceiling (hold)"}
for name, label in labels.items():
    if name in rows:
        r = rows[name]
        bad = r["errors"] if name == "sql-ceiling" else unexpected(name, name) + r["errors"]
        unexpected_total += bad
        ratio = r["rps"] / rows["ceiling"]["rps"] if name == "ceiling-get" and "ceiling" in rows else 1.0
        lines.append(f"| {label} | – | {r['rps']:.0f} | {ms(r['p50'])} | {ms(r['p99'])} | {bad} | {ratio:.2f} | | 1.0 | | |")
verdicts = []
for backend in ("postgres", "sqlite"):
    for scenario, ceiling, target in plan:
        name = f"{backend} {scenario}"
        if name not in rows:
            continue
        r, c = rows[name], rows.get(ceiling)
        bad = unexpected(name, scenario) + r["errors"]
        unexpected_total += bad
        ratio = r["rps"] / c["rps"] if c else float("nan")
        p99_ratio = r["p99"] / c["p99"] if c and c["p99"] else float("nan")
        goal = ""
        if backend == "postgres" and target is not None:
            met = ratio >= target and p99_ratio <= 5
            goal = f"≥ {target:.2f} × {'SQL' if ceiling == 'sql-ceiling' else 'HTTP'}: {'met' if met else 'missed'}"
            verdicts.append((scenario, met))
        # Statements counted by the server's driver, transactions by PostgreSQL,
        # both over the measured run alone.
        count = max(totals.get(name, 1), 1)
        per_stmt = f"{stmts[name] / count:.2f}" if name in stmts else ""
        per_xact = f"{xacts[name] / count:.2f}" if backend == "postgres" and name in xacts else ""
        lines.append(f"| {scenario} | {backend} | {r['rps']:.0f} | {ms(r['p50'])} | {ms(r['p99'])} | {bad} | "
                     f"{ratio:.2f} | {goal} | {p99_ratio:.1f} | {per_stmt} | {per_xact} |")
lines.append("")
for backend, kib in rss.items():
    lines.append(f"Peak RSS of the {backend}-backed server: {kib / 1024:.1f} MiB (target ≤ 64 MiB: {'met' if kib <= 65536 else 'missed'}).")
lines.append("")
if soak_rss:
    lines += ["Memory over a long run: spread holds on fresh assets, resident memory sampled every 5 s "
              "(no growth: the last sample within 5 % of the one at 10 s).", "",
              "| backend | duration | req/s | unexpected answers | RSS at 10 s | RSS at the end | growth | verdict |",
              "|---|---:|---:|---:|---:|---:|---:|---|"]
    for backend, samples in soak_rss.items():
        name = f"{backend} soak"
        first = dict(samples).get(10, samples[0][1])
        last_t, last = samples[-1]
        growth = (last - first) / first
        bad = unexpected(name, "soak") + rows.get(name, {}).get("errors", 0)
        unexpected_total += bad
        rps = rows.get(name, {}).get("rps", 0)
        met = growth <= 0.05
        if backend == "postgres":
            verdicts.append(("no growth", met))
        lines.append(f"| {backend} | {last_t} s | {rps:.0f} | {bad} | {first / 1024:.1f} MiB | {last / 1024:.1f} MiB | "
                     f"{growth * 100:+.1f} % | {'met' if met else 'missed'} |")
    lines.append("")
lines.append("Unexpected answers (a 5xx, a 201 on the hot asset, …) fail the run: "
             f"{unexpected_total} in this run.")
print("\n".join(lines))
sys.exit(1 if unexpected_total else 0)
