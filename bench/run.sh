#!/usr/bin/env bash
# The holdfast benchmark: one command, both backends, the ceilings measured
# in each run with the same load generator and concurrency. Runs everything
# BENCH_RUNS times and writes the medians to bench/RESULTS.md.
#
#   bench/run.sh                                  # 3 runs, 12 s per scenario after a 3 s warm-up
#   BENCH_RUNS=1 BENCH_SECONDS=5 bench/run.sh     # a quick look
#
# Each run, in order: the HTTP ceiling; the SQL ceilings (pgbench running
# bench/canonical_hold.sql and bench/canonical_hold_commit.sql) and the
# diagnosis run of the service's own hold statements, on a fresh copy of a
# database migrated by `holdfast migrate`; the PostgreSQL-backed service on
# another fresh copy, with as many database connections as pgbench has
# clients, then its writes again with the default pool; the SQLite-backed
# service with synchronous = FULL (the default), then NORMAL, each on a
# fresh copy of a seeded file. The last run ends each default server with a
# soak of BENCH_SOAK_SECONDS (60).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${BENCH_SECONDS:-12}
warmup=${BENCH_WARMUP:-3}
runs=${BENCH_RUNS:-3}
soak_seconds=${BENCH_SOAK_SECONDS:-60}
connections=64
threads=2
started=$(date +%s)
work=$(mktemp -d)
ceiling_pid=""
server_pid=""
pg_dbs=()
cleanup() {
  for pid in $ceiling_pid $server_pid ${extra_pids:-}; do kill "$pid" 2>/dev/null || true; done
  exec 9>&- # the WAL slot's session, if open, ends with its input
  for db in "${pg_dbs[@]}"; do
    psql -X -q -h 127.0.0.1 -U postgres -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
say() { printf '== %s\n' "$*" >&2; }
sql() { # db statement…: prints the rows, fields separated by spaces
  local db=$1; shift
  local args=()
  for statement in "$@"; do args+=(-c "$statement"); done
  psql -X -q -At -F ' ' -v ON_ERROR_STOP=1 -h 127.0.0.1 -U postgres -d "$db" "${args[@]}"
}

if ! command -v wrk >/dev/null; then
  say "installing wrk"
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
fi
pgbench=$(command -v pgbench || ls /usr/lib/postgresql/*/bin/pgbench | head -n 1)
pg_waldump=$(command -v pg_waldump || ls /usr/lib/postgresql/*/bin/pg_waldump 2>/dev/null | head -n 1 || true)

say "building (release)"
cargo build -q --release --bin holdfast --example http_ceiling --example hold_sql
target=${CARGO_TARGET_DIR:-target}/release
bin=$target/holdfast

# PostgreSQL's WAL directory, when this user may read it: then the WAL of
# each measured write run is also counted record by record (pg_waldump).
pg_wal_dir=$(sql postgres "SHOW data_directory" 2>/dev/null)/pg_wal
if [[ -z "$pg_waldump" || ! -r "$pg_wal_dir" ]]; then pg_wal_dir=""; fi

wait_ready() { # url: until it answers (any status)
  for _ in $(seq 1 200); do curl -s -o /dev/null "$1" && return 0; sleep 0.05; done
  echo "not ready: $1" >&2; return 1
}

# Statements the server has sent to its database (its own driver's count).
statements() { curl -s "http://127.0.0.1:$1/metrics" | awk '/^holdfast_db_statements_total / {print int($2)}'; }

# The counters of one PostgreSQL database read before and after a measured
# run: its transactions, the rows each table had inserted, updated and
# HOT-updated, and (cluster-wide, reset before the run) the WAL written.
# Backends flush their statistics at most once a second; one that goes
# idle with statistics pending flushes them within 10 s (PostgreSQL's
# PGSTAT_IDLE_INTERVAL), or when it exits. Around the service's writes the
# marks wait 11 s (BENCH_STATS_WAIT), so that the warm-up's rows land
# before the first mark and the run's own before the second; pgbench's
# backends exit, and a reading run's few writes need no such wait.
#
# For a write, when this user may read the WAL, the run's WAL is also read
# record by record (pg_waldump) and this database's part of it counted: its
# relations' records and its transactions' commits, the full-page images
# among them, and the B-tree leaf entries written. A temporary replication
# slot keeps that WAL until it is read, whatever checkpoints others take
# meanwhile; the slot goes with its session.
slots=0
slot=""
stats_wait=1.5
pg_mark() { # db [write]
  sleep "$stats_wait"
  slot=""
  if [[ -n "$pg_wal_dir" && "${2:-}" == write ]]; then
    slots=$((slots + 1))
    slot=holdfast_bench_$$_$slots
    # The slot's session stays idle (no snapshot, so nothing it holds back
    # from pruning) until its input closes.
    rm -f "$work/slot"; mkfifo "$work/slot"
    psql -X -q -h 127.0.0.1 -U postgres -d "$1" <"$work/slot" >/dev/null 2>&1 &
    slot_psql=$!
    exec 9>"$work/slot"
    echo "SELECT pg_create_physical_replication_slot('$slot', true, true);" >&9
    for _ in $(seq 1 100); do
      [[ -n $(sql "$1" "SELECT 1 FROM pg_replication_slots WHERE slot_name = '$slot'") ]] && break
      sleep 0.05
    done
  fi
  sql "$1" "SELECT pg_stat_reset_shared('wal')" >/dev/null
  sql "$1" "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables" >"$work/tables0"
  mark_xacts=$(sql "$1" "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()")
  mark_other=$(sql "$1" "SELECT coalesce(sum(xact_commit + xact_rollback), 0) FROM pg_stat_database WHERE datname IS DISTINCT FROM current_database()")
  mark_lsn=$(sql "$1" "SELECT pg_current_wal_insert_lsn()")
}
pg_delta() { # db name: the counters since pg_mark, as result lines
  local db=$1 name=$2
  sleep "$stats_wait"
  local x1 lsn1 other oid
  lsn1=$(sql "$db" "SELECT pg_current_wal_insert_lsn()")
  x1=$(sql "$db" "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()")
  echo "$name XACTS $((x1 - mark_xacts))"
  other=$(sql "$db" "SELECT coalesce(sum(xact_commit + xact_rollback), 0) FROM pg_stat_database WHERE datname IS DISTINCT FROM current_database()")
  echo "$name OTHER $((other - mark_other))"
  sql "$db" "SELECT wal_records, wal_fpi, wal_bytes FROM pg_stat_wal" | awk -v n="$name" '{print n " WAL records=" $1 " fpi=" $2 " bytes=" $3}'
  sql "$db" "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables" >"$work/tables1"
  awk -v n="$name" 'NR == FNR {i[$1] = $2; u[$1] = $3; h[$1] = $4; next}
    {di = $2 - i[$1]; du = $3 - u[$1]; dh = $4 - h[$1]
     if (di || du || dh) print n " TABLE " $1 " ins=" di " upd=" du " hot=" dh}' "$work/tables0" "$work/tables1"
  if [[ -n "$slot" ]]; then
    oid=$(sql "$db" "SELECT oid FROM pg_database WHERE datname = current_database()")
    local counted
    if counted=$("$pg_waldump" -p "$pg_wal_dir" -s "$mark_lsn" -e "$lsn1" 2>"$work/wal.err" |
      awk -v n="$name" -v rel=" rel [0-9]+/$oid/" '
        { tx = 0; if (match($0, /tx: +[0-9]+/)) tx = substr($0, RSTART + 4, RLENGTH - 4) + 0
          ours = ($0 ~ rel); if (ours && tx) mine[tx] = 1
          if ($2 == "Transaction" && (tx in mine)) ours = 1 }
        ours { records++; fpi += gsub(/ FPW/, "&")
          if (match($0, /\(rec\/tot\): +[0-9]+\/ +[0-9]+/)) { s = substr($0, RSTART, RLENGTH); sub(/.*\/ +/, "", s); bytes += s }
          if ($2 == "Btree" && $0 ~ /desc: (INSERT_LEAF|INSERT_POST|SPLIT_L|SPLIT_R) /) leaf++ }
        END { print n " WALDUMP records=" records + 0 " fpi=" fpi + 0 " bytes=" bytes + 0 " btree_leaf=" leaf + 0 }'); then
      echo "$counted"
    else
      echo "pg_waldump: $(head -n 1 "$work/wal.err")" >&2
    fi
    exec 9>&-
    wait "$slot_psql" || true
    slot=""
  fi
}

# CPU of a measured run: the server (or ceiling) process, PostgreSQL and
# PgBouncer, in milliseconds.
hz=$(getconf CLK_TCK)
cpu_line() { # label "server postgres pooler" (before) "…" (after)
  read -r a0 b0 p0 <<<"$2"
  read -r a1 b1 p1 <<<"$3"
  echo "$1 CPU server_ms=$(( (a1 - a0) * 1000 / hz )) postgres_ms=$(( (b1 - b0) * 1000 / hz )) pooler_ms=$(( (p1 - p0) * 1000 / hz ))"
}

# load RUN NAME PORT MODE DB [env…]: warm-up, then the measured run; prints
# RESULT and STATUSES, the database statements (the server's count) and,
# on PostgreSQL (DB not empty), its counters over the measured run alone.
load() {
  local run=$1 name=$2 port=$3 mode=$4 db=$5; shift 5
  local kind=read
  if [[ $mode == spread || $mode == hold-commit ]]; then kind=write; fi
  env BENCH_MODE="$mode" BENCH_PREFIX=W "$@" wrk -t$threads -c$connections -d${warmup}s -s bench/load.lua "http://127.0.0.1:$port" >/dev/null
  stats_wait=1.5
  if [[ $kind == write ]]; then stats_wait=${BENCH_STATS_WAIT:-11}; fi
  if [[ -n "$db" ]]; then pg_mark "$db" "$kind"; fi
  local s0 s1 c0 c1
  s0=$(statements "$port")
  c0="$(cpu_ticks ${measured_pids:-$server_pid}) $(cpu_ticks_of postgres) $(cpu_ticks_of pgbouncer)"
  env BENCH_MODE="$mode" BENCH_PREFIX=M "$@" wrk -t$threads -c$connections -d${seconds}s -s bench/load.lua "http://127.0.0.1:$port" \
    >"$work/out"
  c1="$(cpu_ticks ${measured_pids:-$server_pid}) $(cpu_ticks_of postgres) $(cpu_ticks_of pgbouncer)"
  s1=$(statements "$port")
  grep -E '^(RESULT|STATUSES)' "$work/out" | sed "s/^/$run $name /"
  if [[ -n "$s0" ]]; then echo "$run $name STATEMENTS $((s1 - s0))"; fi
  cpu_line "$run $name" "$c0" "$c1"
  if [[ -n "$db" ]]; then pg_delta "$db" "$run $name"; fi
}

# split_load RUN NAME MODE [env…]: like load, with the connections split
# between the two instances on 18304 and 18305 (one wrk each, at the same
# time), the requests of both summed.
split_load() {
  local run=$1 name=$2 mode=$3; shift 3
  local half=$((connections / 2)) c0 c1 port wrks=()
  for port in 18304 18305; do
    env BENCH_MODE="$mode" BENCH_PREFIX=W BENCH_THREAD_OFFSET=$((port - 18304)) "$@" \
      wrk -t1 -c$half -d${warmup}s -s bench/load.lua "http://127.0.0.1:$port" >/dev/null &
    wrks+=($!)
  done
  wait "${wrks[@]}"
  wrks=()
  c0="$(cpu_ticks $measured_pids) $(cpu_ticks_of postgres) $(cpu_ticks_of pgbouncer)"
  for port in 18304 18305; do
    env BENCH_MODE="$mode" BENCH_PREFIX=M BENCH_THREAD_OFFSET=$((port - 18304)) "$@" \
      wrk -t1 -c$half -d${seconds}s -s bench/load.lua "http://127.0.0.1:$port" >"$work/out-$port" &
    wrks+=($!)
  done
  wait "${wrks[@]}"
  c1="$(cpu_ticks $measured_pids) $(cpu_ticks_of postgres) $(cpu_ticks_of pgbouncer)"
  python3 - "$run $name" "$work/out-18304" "$work/out-18305" <<'PY'
import re, sys
name, outs = sys.argv[1], sys.argv[2:]
requests = secs = errors = 0
p50 = p99 = 0
statuses = {}
for path in outs:
    for line in open(path):
        if line.startswith("RESULT"):
            kv = dict(x.split("=") for x in line.split()[1:])
            requests += int(kv["requests"]); secs = max(secs, float(kv["seconds"])); errors += int(kv["errors"])
            p50 = max(p50, int(kv["p50"])); p99 = max(p99, int(kv["p99"]))
        elif line.startswith("STATUSES"):
            for x in line.split()[1:]:
                k, v = x.split("="); statuses[k] = statuses.get(k, 0) + int(v)
print(f"{name} RESULT requests={requests} seconds={secs:.3f} p50={p50} p99={p99} errors={errors}")
print(f"{name} STATUSES " + " ".join(f"{k}={v}" for k, v in statuses.items()))
PY
  cpu_line "$run $name" "$c0" "$c1"
}

peak_rss_kib() { awk '/VmHWM/ {print $2}' "/proc/$1/status"; }

# CPU time (clock ticks, user + system) of processes: those with the given
# pids, or every process whose command is the given name (postgres: the
# server and all its backends; pgbouncer).
cpu_ticks() { # pid…
  local total=0 pid
  for pid in "$@"; do
    [[ -r /proc/$pid/stat ]] && total=$((total + $(awk '{sub(/^.*\) /, ""); print $12 + $13}' "/proc/$pid/stat")))
  done
  echo "$total"
}
cpu_ticks_of() { # command name
  cpu_ticks $(pgrep -x "$1" || true)
}

results=$work/results.txt
: >"$results"
# The machine's load when the measuring starts: anything else running
# shares the cores with the benchmark.
echo "machine loadavg_start $(cut -d ' ' -f 1-3 /proc/loadavg)" >>"$results"

say "HTTP ceiling: minimal actix-web handler"
"$target/examples/http_ceiling" 127.0.0.1:18300 &
ceiling_pid=$!
wait_ready http://127.0.0.1:18300/

# --- Databases, migrated by holdfast itself and seeded once; each run works
# on fresh copies of them.

# Assets <prefix>-<thread>-<n> for the spread (W, M), hold-commit (HW, HM)
# and soak (S) scenarios: warm-up and measured runs never meet the same asset.
# The soak gets room for 5 000 holds a second per thread over its length on
# PostgreSQL, 20 000 on SQLite (which held more than 10 000 a second on an
# AMD host): a soak that ran out of assets would measure 404s.
per_thread=${BENCH_ASSETS_PER_THREAD:-120000}
soak_per_thread=$((soak_seconds * 5000))
soak_sqlite_per_thread=$((soak_seconds * 20000))
seed_sql() {
  for p in W M HW HM S; do
    local n=$per_thread
    [[ $p == S ]] && n=$soak_per_thread
    echo "INSERT INTO assets (id, name, created_at, updated_at)
          SELECT '$p-' || t || '-' || n, 'lot', now(), now()
          FROM generate_series(0, $((threads - 1))) t, generate_series(1, $n) n ORDER BY t, n;"
  done
}
# The pgbench clients' assets <prefix>-<id>, id = n * 100 + client: C for
# the canonical hold, K for the canonical hold and commit, P for the
# diagnosis. Each client's count n starts at 0 for the warm-up and at
# $sql_warm_slots for the measured run; room for BENCH_SQL_TPS_MAX (24000)
# transactions a second. A quiet host ran the canonical hold above 10,000 a
# second: a warm-up past its room would hand the measured run ids it used.
sql_rate=$(( (${BENCH_SQL_TPS_MAX:-24000} + connections - 1) / connections ))
sql_warm_slots=$((warmup * sql_rate + 50))
sql_per_client=$((sql_warm_slots + seconds * sql_rate + 50))
seed_sql_ceiling() {
  for p in C K P; do
    echo "INSERT INTO assets (id, name, created_at, updated_at)
          SELECT '$p-' || (n * 100 + c), 'lot', now(), now()
          FROM generate_series(0, $((connections - 1))) c, generate_series(1, $sql_per_client) n ORDER BY c, n;"
  done
}
new_pg_db() { # name [template]
  pg_dbs+=("$1")
  if [[ -n "${2:-}" ]]; then
    sql postgres "CREATE DATABASE $1 TEMPLATE $2 STRATEGY FILE_COPY"
  else
    sql postgres "CREATE DATABASE $1"
  fi
}
drop_pg_db() { sql postgres "DROP DATABASE IF EXISTS $1 WITH (FORCE)"; }
pg_url() { echo "postgres://postgres@127.0.0.1:5432/$1"; }

say "seeding the PostgreSQL databases"
svc_tpl=holdfast_bench_svc_$$
new_pg_db "$svc_tpl"
HOLDFAST_DATABASE_URL=$(pg_url "$svc_tpl") "$bin" migrate >/dev/null
seed_sql | psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -U postgres -d "$svc_tpl" >/dev/null
sql "$svc_tpl" "VACUUM ANALYZE"
sql_tpl=holdfast_bench_sql_$$
new_pg_db "$sql_tpl"
HOLDFAST_DATABASE_URL=$(pg_url "$sql_tpl") "$bin" migrate >/dev/null
seed_sql_ceiling | psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -U postgres -d "$sql_tpl" >/dev/null
sql "$sql_tpl" "VACUUM ANALYZE"
# The indexes of each table, for the report.
sql "$sql_tpl" "SELECT tablename, indexname, coalesce(substring(indexdef from ' WHERE (.*)\$'), '-')
                  FROM pg_indexes WHERE schemaname = 'public' ORDER BY tablename, indexname" |
  sed 's/^/schema INDEX /' >>"$results"

say "seeding the SQLite database"
sqlite_tpl=$work/template.db
HOLDFAST_DATABASE_URL="sqlite://$sqlite_tpl" "$bin" migrate >/dev/null
python3 - "$sqlite_tpl" "$threads" "$per_thread" "$soak_sqlite_per_thread" <<'PY'
import datetime, sqlite3, sys
db, threads, per_thread, soak_per_thread = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
c = sqlite3.connect(db, timeout=30)
c.executemany("INSERT INTO assets (id, name, created_at, updated_at) VALUES (?, 'lot', ?, ?)",
              ((f"{p}-{t}-{n}", now, now) for p in ("W", "M", "HW", "HM", "S") for t in range(threads)
               for n in range(1, (soak_per_thread if p == "S" else per_thread) + 1)))
c.commit()
c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
c.close()
PY

# The answers the canonical transactions store (and their events carry):
# the service's 201 of a hold and 200 of a commit, bound as parameters as
# the service binds them.
hold_body='{"reservation_id":"res_01KB2Q5W7M3N8P4R6T9V0X1Y2Z","asset_id":"M-0-12345","buyer_id":"b-M-0-12345","status":"HELD","expires_at":"2026-12-01T10:10:00.123456Z","created_at":"2026-12-01T10:00:00.123456Z","committed_at":null,"released_at":null,"payment_reference":null,"voided_at":null,"refunds":[]}'
commit_body='{"reservation_id":"res_01KB2Q5W7M3N8P4R6T9V0X1Y2Z","asset_id":"HM-0-12345","buyer_id":"b-HM-0-12345","status":"COMMITTED","expires_at":"2026-12-01T10:10:00.123456Z","created_at":"2026-12-01T10:00:00.123456Z","committed_at":"2026-12-01T10:00:00.234567Z","released_at":null,"payment_reference":"pay-res_01KB2Q5W7M3N8P4R6T9V0X1Y2Z","voided_at":null,"refunds":[]}'
fingerprint=$(printf '%064d' 0 | tr 0 f)
"$target/examples/hold_sql" | python3 bench/pgbench_script.py >"$work/service_hold.sql"

# pgb RUN NAME SCRIPT DB: a warm-up, then the measured run, of one pgbench
# script at the HTTP scenarios' concurrency, with prepared statements.
pgb() {
  local run=$1 name=$2 script=$3 db=$4
  sql "$db" "VACUUM ANALYZE" "CHECKPOINT"
  local common=(-n -h 127.0.0.1 -U postgres -M prepared -c $connections -j $threads
    -D "hold_body=$hold_body" -D "commit_body=$commit_body" -D "fingerprint=$fingerprint" -f "$script")
  "$pgbench" "${common[@]}" -T "$warmup" -D n=0 "$db" >"$work/pgbench-warm.out" 2>&1 || {
    cat "$work/pgbench-warm.out" >&2; echo "$run $name RESULT requests=0 seconds=1 p50=0 p99=0 errors=1"; return 0; }
  local warmed
  warmed=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$work/pgbench-warm.out")
  if (( ${warmed:-0} > (sql_warm_slots - 50) * connections )); then
    echo "$name: the warm-up ran $warmed transactions, past the room of $(( (sql_warm_slots - 50) * connections )) it has; raise BENCH_SQL_TPS_MAX" >&2
    echo "$run $name RESULT requests=0 seconds=1 p50=0 p99=0 errors=1"; return 0
  fi
  stats_wait=1.5
  pg_mark "$db" write
  rm -f "$work"/pgb.*
  local rc=0
  "$pgbench" "${common[@]}" -T "$seconds" -D n=$sql_warm_slots --log --log-prefix="$work/pgb" "$db" \
    >"$work/pgbench.out" 2>&1 || rc=$?
  [[ $rc == 0 ]] || grep -E 'abort|error' "$work/pgbench.out" | head -n 3 >&2
  # The SQL commands of one pass of the script (BEGIN and COMMIT included).
  local per_pass
  per_pass=$(grep -cE '^[^-\\].*(;|\\gset)[[:space:]]*$' "$script")
  python3 - "$work" "$run $name" "$rc" "$per_pass" <<'PY'
import glob, re, sys
work, name, rc, per_pass = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
out = open(f"{work}/pgbench.out").read()
tps = re.search(r"tps = ([0-9.]+)", out)
lat = sorted(int(line.split()[2]) for f in glob.glob(f"{work}/pgb.*") for line in open(f))
failed = re.search(r"number of failed transactions: (\d+)", out)
errors = (int(failed.group(1)) if failed else 0) + len(re.findall(r"client \d+ aborted", out)) + (rc != 0)
if tps and lat:
    secs = len(lat) / float(tps.group(1))
    print(f"{name} RESULT requests={len(lat)} seconds={secs:.3f} p50={lat[len(lat) // 2]} p99={lat[int(len(lat) * 0.99)]} errors={errors}")
    print(f"{name} STATEMENTS {len(lat) * per_pass}")
else:
    print(f"{name} RESULT requests=0 seconds=1 p50=0 p99=0 errors={max(errors, 1)}")
PY
  pg_delta "$db" "$run $name"
}

# serve NAME PORT URL [env…]: starts a server, its pid in server_pid.
serve() {
  local name=$1 port=$2 url=$3; shift 3
  env HOLDFAST_DATABASE_URL="$url" HOLDFAST_BIND=127.0.0.1:$port HOLDFAST_JANITOR_INTERVAL_SECONDS=0 RUST_LOG=warn "$@" \
    "$bin" serve >"$work/$name.log" 2>&1 &
  server_pid=$!
  wait_ready "http://127.0.0.1:$port/readyz"
}
stop() { kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=""; }

api() { # port method path key body
  curl -sf -X "$2" "http://127.0.0.1:$1$3" -H 'Content-Type: application/json' ${4:+-H "Idempotency-Key: $4"} -d "$5"
}

prepare() { # port: the hot HELD asset, the SOLD one, the replayed hold
  api "$1" POST /v1/assets "" '{"id":"HOT","name":"hot"}' >/dev/null
  api "$1" POST /v1/assets/HOT/reservations k-hot '{"buyer_id":"winner","hold_seconds":3600}' >/dev/null
  api "$1" POST /v1/assets "" '{"id":"SOLD","name":"sold"}' >/dev/null
  local rid
  rid=$(api "$1" POST /v1/assets/SOLD/reservations k-sold '{"buyer_id":"buyer"}' | sed 's/.*"reservation_id":"\([^"]*\)".*/\1/')
  api "$1" POST "/v1/reservations/$rid/commit" k-sold-commit '{"payment_reference":"pay-sold"}' >/dev/null
  api "$1" POST /v1/assets "" '{"id":"REPLAY","name":"replay"}' >/dev/null
  api "$1" POST /v1/assets/REPLAY/reservations replay-key '{"buyer_id":"replayer"}' >/dev/null
}

# scenario RUN BACKEND PORT DB SCENARIO MODE [env…]: PostgreSQL (DB set) is
# vacuumed and checkpointed before each, so that no scenario pays for the
# cleanup of another's writes.
scenario() {
  local run=$1 backend=$2 port=$3 db=$4 name=$5 mode=$6; shift 6
  if [[ -n "$db" ]]; then sql "$db" "VACUUM ANALYZE" "CHECKPOINT"; fi
  load "$run" "$backend $name" "$port" "$mode" "$db" "$@" >>"$results"
}

# The reading scenarios first, then the writing ones.
scenarios() { # run backend port db
  scenario "$@" hot-held hot BENCH_ASSET=HOT
  scenario "$@" hot-sold hot BENCH_ASSET=SOLD
  scenario "$@" replay replay BENCH_ASSET=REPLAY
  scenario "$@" spread-hold spread
  scenario "$@" hold-commit hold-commit
}

# soak BACKEND PORT: spread holds for BENCH_SOAK_SECONDS on fresh assets,
# the server's resident memory sampled every 5 s.
soak() {
  local backend=$1 port=$2
  say "$backend: ${soak_seconds} s soak"
  BENCH_MODE=spread BENCH_PREFIX=S wrk -t$threads -c$connections -d${soak_seconds}s -s bench/load.lua \
    "http://127.0.0.1:$port" >"$work/soak.out" &
  local wrk_pid=$!
  for t in $(seq 5 5 "$soak_seconds"); do
    sleep 5
    echo "soak $backend rss_at $t $(awk '/VmRSS/ {print $2}' "/proc/$server_pid/status")" >>"$results"
  done
  wait "$wrk_pid"
  grep -E '^(RESULT|STATUSES)' "$work/soak.out" | sed "s/^/soak $backend soak /" >>"$results"
}

say "PgBouncer (deploy/pgbouncer.ini, transaction pooling)"
pooler_dir=$(mktemp -d)
pooler=$(ci/pgbouncer.sh start "$pooler_dir" 18390)
trap 'ci/pgbouncer.sh stop "$pooler_dir"; rm -rf "$pooler_dir"; cleanup' EXIT

for run in $(seq 1 "$runs"); do
  say "run $run of $runs: HTTP ceiling"
  # The ceiling gets the very requests of hot-held (POST, a JSON body, a new
  # Idempotency-Key each), so that the generator's and the HTTP stack's
  # share is the same on both sides; a bare GET is measured beside it.
  measured_pids=$ceiling_pid load "$run" ceiling 18300 hot "" BENCH_ASSET=HOT >>"$results"
  measured_pids=$ceiling_pid load "$run" ceiling-get 18300 ceiling "" >>"$results"

  say "run $run of $runs: SQL ceilings (pgbench, canonical transactions), and the service's statements (diagnosis)"
  db=holdfast_bench_sql_$$_$run
  new_pg_db "$db" "$sql_tpl"
  pgb "$run" sql-hold bench/canonical_hold.sql "$db" >>"$results"
  pgb "$run" sql-hold-commit bench/canonical_hold_commit.sql "$db" >>"$results"
  pgb "$run" sql-service-hold "$work/service_hold.sql" "$db" >>"$results"
  drop_pg_db "$db"

  say "run $run of $runs: PostgreSQL"
  db=holdfast_bench_svc_$$_$run
  new_pg_db "$db" "$svc_tpl"
  # As many database connections as the SQL ceilings' pgbench clients, so
  # that both sides commit with the same concurrency.
  serve postgres 18301 "$(pg_url "$db")" HOLDFAST_DB_POOL_SIZE=$connections
  prepare 18301
  scenarios "$run" postgres 18301 "$db"
  if [[ $run == "$runs" ]]; then soak postgres 18301; fi
  echo "$run postgres rss_kib $(peak_rss_kib "$server_pid")" >>"$results"
  stop
  drop_pg_db "$db"

  # The writes again with the default pool (HOLDFAST_DB_POOL_SIZE=16): what
  # fewer connections than clients cost when every commit waits for the disk.
  say "run $run of $runs: PostgreSQL, the default pool"
  db=holdfast_bench_dflt_$$_$run
  new_pg_db "$db" "$svc_tpl"
  serve postgres-default-pool 18306 "$(pg_url "$db")"
  scenario "$run" postgres-default-pool 18306 "$db" spread-hold spread
  scenario "$run" postgres-default-pool 18306 "$db" hold-commit hold-commit
  stop
  drop_pg_db "$db"

  # The same service through PgBouncer in transaction mode
  # (deploy/pgbouncer.ini), prepared statements off, beside the direct
  # connection of this run: what the pooler costs.
  say "run $run of $runs: PostgreSQL through PgBouncer (transaction pooling)"
  db=holdfast_bench_pool_$$_$run
  new_pg_db "$db" "$svc_tpl"
  serve postgres-pgbouncer 18303 "$pooler/$db" HOLDFAST_DB_PREPARED_STATEMENTS=false
  prepare 18303
  scenario "$run" postgres-pgbouncer 18303 "$db" hot-held hot BENCH_ASSET=HOT
  scenario "$run" postgres-pgbouncer 18303 "$db" spread-hold spread
  scenario "$run" postgres-pgbouncer 18303 "$db" hold-commit hold-commit
  stop
  drop_pg_db "$db"

  # Two instances behind the pooler, the load split between them: on two
  # shared cores this measures CPU contention, not capacity (bench/README.md
  # derives capacity from the cost per request instead).
  if [[ $run == "$runs" ]]; then
    say "run $run of $runs: two instances behind PgBouncer (CPU-bound on this machine)"
    db=holdfast_bench_two_$$_$run
    new_pg_db "$db" "$svc_tpl"
    serve postgres-two-a 18304 "$pooler/$db" HOLDFAST_DB_PREPARED_STATEMENTS=false
    first_pid=$server_pid
    serve postgres-two-b 18305 "$pooler/$db" HOLDFAST_DB_PREPARED_STATEMENTS=false
    two_pids="$first_pid $server_pid"
    extra_pids=$first_pid
    prepare 18304
    for pair in "hot-held hot BENCH_ASSET=HOT" "spread-hold spread"; do
      read -r name mode extra <<<"$pair"
      sql "$db" "VACUUM ANALYZE" "CHECKPOINT"
      measured_pids=$two_pids split_load "$run" "postgres-two $name" "$mode" $extra >>"$results"
    done
    for pid in $two_pids; do kill "$pid"; wait "$pid" 2>/dev/null || true; done
    server_pid=""
    drop_pg_db "$db"
  fi

  for sync in full normal; do
    backend=sqlite; [[ $sync == normal ]] && backend=sqlite-normal
    say "run $run of $runs: SQLite, synchronous = ${sync^^}"
    cp "$sqlite_tpl" "$work/run.db"
    serve "$backend" 18302 "sqlite://$work/run.db" HOLDFAST_SQLITE_SYNCHRONOUS=$sync
    prepare 18302
    scenarios "$run" "$backend" 18302 ""
    if [[ $run == "$runs" && $sync == full ]]; then soak sqlite 18302; fi
    echo "$run $backend rss_kib $(peak_rss_kib "$server_pid")" >>"$results"
    stop
    rm -f "$work"/run.db*
  done
done

echo "machine loadavg_end $(cut -d ' ' -f 1-3 /proc/loadavg)" >>"$results"
if [[ -n "${BENCH_RAW:-}" ]]; then cp "$results" "$BENCH_RAW"; fi
# The other benchmarks' sections (bench/waitlist.py, bench/catalogue.py) stay.
cp bench/RESULTS.md "$work/RESULTS.before" 2>/dev/null || true
python3 bench/report.py "$results" "$seconds" "$runs" $(( $(date +%s) - started )) >bench/RESULTS.md || status=$?
python3 bench/sections.py carry "$work/RESULTS.before" >>bench/RESULTS.md
cat bench/RESULTS.md
exit "${status:-0}"
