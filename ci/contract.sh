#!/usr/bin/env bash
# The OpenAPI document as a contract, checked against the running service:
# lint the document, fuzz both backends with schemathesis, drive the service
# with clients of four generators, render /docs in Chromium, and
# run the operator console and the example storefront end to end in Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
work=$(mktemp -d)
pids=()
pooler_dir=$(mktemp -d)
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  ci/pgbouncer.sh stop "$pooler_dir"
  for db in ${pg_db:-} ${pooled_db:-}; do
    psql -q -h 127.0.0.1 -U postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
  done
  rm -rf "$work" "$pooler_dir"
}
trap cleanup EXIT

step() { printf '\n== %s\n' "$*"; }

step "tools"
venv=target/ci-venv
[[ -x $venv/bin/schemathesis ]] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check -r ci/requirements.txt
cargo build -q --bin holdfast
bin=${CARGO_TARGET_DIR:-target}/debug/holdfast

step "lint openapi/holdfast.json"
"$venv/bin/openapi-spec-validator" openapi/holdfast.json

# The service runs as in production, with an API key: an admin's, so that
# every operation can be exercised, and missing credentials are refused.
key=$("$bin" keys new --name contract --role admin)
token=$(sed -n 's/^ *\(hf_[A-Za-z0-9_-]*\)$/\1/p' <<<"$key")
entry=$(sed -n 's/^ *\(contract:admin:[0-9a-f]*\)$/\1/p' <<<"$key")
export HOLDFAST_TOKEN=$token
# A storefront key too, for the console's offer (an offer names the
# storefront that sells it).
shop_key=$("$bin" keys new --name plates-web --role storefront)
shop_entry=$(sed -n 's/^ *\(plates-web:storefront:[0-9a-f]*\)$/\1/p' <<<"$shop_key")
shop_token=$(sed -n 's/^ *\(hf_[A-Za-z0-9_-]*\)$/\1/p' <<<"$shop_key")
# A payments key, for the example storefront's payment provider.
psp_key=$("$bin" keys new --name psp --role payments)
psp_entry=$(sed -n 's/^ *\(psp:payments:[0-9a-f]*\)$/\1/p' <<<"$psp_key")
psp_token=$(sed -n 's/^ *\(hf_[A-Za-z0-9_-]*\)$/\1/p' <<<"$psp_key")

# serve NAME PORT DATABASE_URL: starts holdfast and waits until it is ready.
serve() {
  HOLDFAST_DATABASE_URL=$3 HOLDFAST_BIND=127.0.0.1:$2 HOLDFAST_HOLD_SECONDS_MIN=1 HOLDFAST_API_KEYS=${keys:-$entry} \
    RUST_LOG=warn "$bin" serve >"$work/$1.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$2/readyz" >/dev/null && return 0
    sleep 0.1
  done
  echo "holdfast ($1) did not become ready:"; cat "$work/$1.log"; return 1
}

sqlite_port=18181
pg_port=18182
serve sqlite "$sqlite_port" "sqlite://$work/holdfast.db"
pg_db="holdfast_contract_$$"
psql -q -h 127.0.0.1 -U postgres -c "CREATE DATABASE $pg_db" >/dev/null
serve postgres "$pg_port" "postgres://postgres@127.0.0.1:5432/$pg_db"

# Two instances through PgBouncer in transaction mode (deploy/pgbouncer.ini),
# on one database: the first migrates through the pooler, the second through
# the database itself.
step "two instances behind PgBouncer (transaction pooling)"
pooler=$(ci/pgbouncer.sh start "$pooler_dir" 18190)
pooled_db="holdfast_contract_pooled_$$"
psql -q -h 127.0.0.1 -U postgres -c "CREATE DATABASE $pooled_db" >/dev/null
pooled_a=18184
pooled_b=18185
HOLDFAST_DB_PREPARED_STATEMENTS=false serve pooled-a "$pooled_a" "$pooler/$pooled_db"
HOLDFAST_DB_PREPARED_STATEMENTS=false \
  HOLDFAST_MIGRATION_DATABASE_URL="postgres://postgres@127.0.0.1:5432/$pooled_db" \
  serve pooled-b "$pooled_b" "$pooler/$pooled_db"

checks=not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance,negative_data_rejection,missing_required_header,unsupported_method
for target in "sqlite:$sqlite_port" "postgres:$pg_port" "postgres-pgbouncer:$pooled_a"; do
  backend=${target%%:*}
  port=${target##*:}
  step "schemathesis on $backend"
  (cd "$work" && "$root/$venv/bin/schemathesis" run "http://127.0.0.1:$port/openapi.json" \
    --url "http://127.0.0.1:$port" --header "Authorization: Bearer $token" --checks "$checks" --max-examples "${SCHEMATHESIS_EXAMPLES:-100}" \
    --seed "${SCHEMATHESIS_SEED:-20261129}" --report junit --report-dir "$root/target/schemathesis-$backend")
done

step "generated clients (ci/clients: each generator's flow)"
ci/clients/run.sh "http://127.0.0.1:$sqlite_port"

step "generated client flow, the second instance behind PgBouncer"
ci/clients/run.sh "http://127.0.0.1:$pooled_b" openapi-fetch

step "docs page in headless Chromium"
SCREENSHOT="$root/target/docs.png" ci/docs-screenshot.sh "http://127.0.0.1:$sqlite_port"

# A fresh database, so that the check's assets are on the board's first page;
# the browser signs in with the admin key, as an operator would.
step "operator console in headless Chromium"
console_port=18183
keys="$entry,$shop_entry" serve console "$console_port" "sqlite://$work/console.db"
SCREENSHOT_DIR="$root/target" HOLDFAST_OFFER_CLIENT=plates-web \
  ci/console-e2e.sh "http://127.0.0.1:$console_port" "$token"

# An instance with the three kinds of key: a tour of the API as each role,
# every answer validated against the document; then the example storefront
# (examples/storefront), two buyers in two browser contexts.
storefront_port=18186
keys="$entry,$shop_entry,$psp_entry" serve storefront "$storefront_port" "sqlite://$work/storefront.db"
step "every answer of a tour of the API against the document"
"$venv/bin/python" ci/answers.py "http://127.0.0.1:$storefront_port" "$token" "$shop_token" "$psp_token"

step "example storefront in headless Chromium"
SCREENSHOT_DIR="$root/target" \
  ci/storefront-e2e.sh "http://127.0.0.1:$storefront_port" "$token" "$shop_token" "$psp_token"

step "contract checks passed"
