#!/usr/bin/env bash
# The holdfast benchmark: one command, both backends, ceilings measured in
# the same run with the same load generator. Writes bench/RESULTS.md.
#
#   bench/run.sh                 # 20 s per scenario after a 3 s warm-up
#   BENCH_SECONDS=60 bench/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
seconds=${BENCH_SECONDS:-20}
warmup=${BENCH_WARMUP:-3}
connections=64
threads=2
work=$(mktemp -d)
pids=()
pg_dbs=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for db in "${pg_dbs[@]}"; do
    psql -q -h 127.0.0.1 -U postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
say() { printf '== %s\n' "$*" >&2; }

if ! command -v wrk >/dev/null; then
  say "installing wrk"
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
fi
pgbench=$(command -v pgbench || ls /usr/lib/postgresql/*/bin/pgbench | head -n 1)

say "building (release)"
cargo build -q --release --bin holdfast --example http_ceiling --example hold_sql
target=${CARGO_TARGET_DIR:-target}/release
bin=$target/holdfast

wait_ready() { # url: until it answers (any status)
  for _ in $(seq 1 200); do curl -s -o /dev/null "$1" && return 0; sleep 0.05; done
  echo "not ready: $1" >&2; return 1
}

# PostgreSQL's own count of transactions in the benchmark database.
xacts() {
  if [[ -n "${pg_db:-}" && "$1" == postgres ]]; then
    psql -h 127.0.0.1 -U postgres -Atc "SELECT pg_stat_force_next_flush(); SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = '$pg_db'" | tail -n 1
  else
    echo 0
  fi
}

# Statements the server has sent to its database (its own driver's count).
statements() { curl -s "http://127.0.0.1:$1/metrics" | awk '/^holdfast_db_statements_total / {print int($2)}'; }

# load NAME PORT MODE [env…]: warm-up, then the measured run; prints RESULT
# and STATUSES, and the database statements and transactions of the
# measured run alone.
load() {
  local name=$1 port=$2 mode=$3; shift 3
  env BENCH_MODE="$mode" BENCH_PREFIX=W "$@" wrk -t$threads -c$connections -d${warmup}s -s bench/load.lua "http://127.0.0.1:$port" >/dev/null
  local s0 x0 s1 x1
  s0=$(statements "$port"); x0=$(xacts "${name%% *}")
  env BENCH_MODE="$mode" BENCH_PREFIX=M "$@" wrk -t$threads -c$connections -d${seconds}s -s bench/load.lua "http://127.0.0.1:$port" \
    >"$work/$name.out"
  s1=$(statements "$port")
  grep -E '^(RESULT|STATUSES)' "$work/$name.out" | sed "s/^/$name /"
  if [[ -n "$s0" ]]; then
    sleep 1.5 # PostgreSQL's backends flush their statistics at most once a second
    x1=$(xacts "${name%% *}")
    echo "$name STATEMENTS $((s1 - s0))"
    echo "$name XACTS $((x1 - x0))"
  fi
}

peak_rss_kib() { awk '/VmHWM/ {print $2}' "/proc/$1/status"; }

results=$work/results.txt
: >"$results"

say "HTTP ceiling: minimal actix-web handler"
"$target/examples/http_ceiling" 127.0.0.1:18300 & pids+=($!)
wait_ready http://127.0.0.1:18300/
# The ceiling gets the very requests of hot-held (POST, a JSON body, a new
# Idempotency-Key each), so that the generator's and the HTTP stack's share
# is the same on both sides; a bare GET is measured beside it, for reference.
load ceiling 18300 hot BENCH_ASSET=HOT >>"$results"
load ceiling-get 18300 ceiling >>"$results"

# Assets <prefix>-<thread>-<n> for the spread (W, M) and hold-commit (HW, HM)
# scenarios: warm-up and measured runs never meet the same asset.
per_thread=${BENCH_ASSETS_PER_THREAD:-120000}
seed_sql() {
  for p in W M HW HM S; do
    echo "INSERT INTO assets (id, name, created_at, updated_at)
          SELECT '$p-' || t || '-' || n, 'lot', now(), now()
          FROM generate_series(0, $((threads - 1))) t, generate_series(1, $per_thread) n;"
  done
}

serve() { # name port url
  HOLDFAST_DATABASE_URL=$3 HOLDFAST_BIND=127.0.0.1:$2 HOLDFAST_JANITOR_INTERVAL_SECONDS=0 RUST_LOG=warn \
    "$bin" serve >"$work/$1.log" 2>&1 &
  pids+=($!)
  server_pid=$!
  wait_ready "http://127.0.0.1:$2/readyz"
}

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

# run BACKEND PORT SCENARIO MODE [env…]
run() {
  local backend=$1 port=$2 scenario=$3 mode=$4; shift 4
  if [[ "$backend" == postgres ]]; then
    psql -q -h 127.0.0.1 -U postgres "$pg_db" -c "VACUUM ANALYZE" -c "CHECKPOINT" >/dev/null
  fi
  load "$backend $scenario" "$port" "$mode" "$@" >>"$results"
}

# soak BACKEND PORT: spread holds for BENCH_SOAK_SECONDS (60) on fresh
# assets, the server's resident memory sampled every 5 s.
soak() {
  local backend=$1 port=$2 soak_seconds=${BENCH_SOAK_SECONDS:-60}
  say "$backend: ${soak_seconds} s soak"
  BENCH_MODE=spread BENCH_PREFIX=S wrk -t$threads -c$connections -d${soak_seconds}s -s bench/load.lua \
    "http://127.0.0.1:$port" >"$work/$backend-soak.out" &
  local wrk_pid=$!
  for t in $(seq 5 5 "$soak_seconds"); do
    sleep 5
    echo "$backend soak rss_at $t $(awk '/VmRSS/ {print $2}' "/proc/$server_pid/status")" >>"$results"
  done
  wait "$wrk_pid"
  grep -E '^(RESULT|STATUSES)' "$work/$backend-soak.out" | sed "s/^/$backend soak /" >>"$results"
}

# The reading scenarios first, then the writing ones; PostgreSQL is vacuumed
# before each, so that no scenario pays for the cleanup of another's writes.
scenarios() { # backend port
  run "$1" "$2" hot-held hot BENCH_ASSET=HOT
  run "$1" "$2" hot-sold hot BENCH_ASSET=SOLD
  run "$1" "$2" replay replay BENCH_ASSET=REPLAY
  run "$1" "$2" spread-hold spread
  run "$1" "$2" hold-commit hold-commit
}

say "PostgreSQL"
pg_db=holdfast_bench_$$
pg_dbs+=("$pg_db")
psql -q -h 127.0.0.1 -U postgres -c "CREATE DATABASE $pg_db" >/dev/null
pg_url=postgres://postgres@127.0.0.1:5432/$pg_db
serve postgres 18301 "$pg_url"
seed_sql | psql -q -h 127.0.0.1 -U postgres "$pg_db" >/dev/null
psql -q -h 127.0.0.1 -U postgres "$pg_db" -c "VACUUM ANALYZE" >/dev/null
prepare 18301
scenarios postgres 18301
soak postgres 18301
echo "postgres rss_kib $(peak_rss_kib "$server_pid")" >>"$results"
kill "$server_pid"

say "SQL ceiling: pgbench running the service's hold statements"
sql_db=holdfast_bench_sql_$$
pg_dbs+=("$sql_db")
psql -q -h 127.0.0.1 -U postgres -c "CREATE DATABASE $sql_db" >/dev/null
HOLDFAST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/$sql_db "$bin" migrate >/dev/null
psql -q -h 127.0.0.1 -U postgres "$sql_db" >/dev/null <<SQL
INSERT INTO assets (id, name, created_at, updated_at)
SELECT 'P-' || c || '-' || n, 'lot', now(), now()
  FROM generate_series(0, $((connections - 1))) c, generate_series(1, 4000) n;
VACUUM ANALYZE;
SQL
"$target/examples/hold_sql" | python3 bench/pgbench_script.py >"$work/hold.sql"
(cd "$work" && "$pgbench" -n -h 127.0.0.1 -U postgres -c $connections -j $threads -T "$seconds" -D n=0 \
  -f hold.sql --log --log-prefix=pgb "$sql_db" >pgbench.out 2>&1)
python3 - "$work" >>"$results" <<'PY'
import glob, re, sys
work = sys.argv[1]
out = open(f"{work}/pgbench.out").read()
tps = float(re.search(r"tps = ([0-9.]+)", out).group(1))
lat = sorted(int(line.split()[2]) for f in glob.glob(f"{work}/pgb.*") for line in open(f))
p50, p99 = lat[len(lat) // 2], lat[int(len(lat) * 0.99)]
failed = re.search(r"number of failed transactions: (\d+)", out)
print(f"sql-ceiling RESULT requests={len(lat)} seconds={len(lat) / tps:.3f} p50={p50} p99={p99} errors={failed.group(1) if failed else 0}")
PY

say "SQLite"
serve sqlite 18302 "sqlite://$work/bench.db"
python3 - "$work/bench.db" "$threads" "$per_thread" <<'PY'
import datetime, sqlite3, sys
db, threads, per_thread = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
c = sqlite3.connect(db, timeout=30)
c.executemany("INSERT INTO assets (id, name, created_at, updated_at) VALUES (?, 'lot', ?, ?)",
              ((f"{p}-{t}-{n}", now, now) for p in ("W", "M", "HW", "HM", "S") for t in range(threads) for n in range(1, per_thread + 1)))
c.commit()
PY
prepare 18302
scenarios sqlite 18302
soak sqlite 18302
echo "sqlite rss_kib $(peak_rss_kib "$server_pid")" >>"$results"

python3 bench/report.py "$results" "$seconds" >bench/RESULTS.md
cat bench/RESULTS.md
