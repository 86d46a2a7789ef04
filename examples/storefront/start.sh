#!/usr/bin/env bash
# Starts the storefront against a running holdfast: the payment provider on
# 127.0.0.1:PSP_PORT, the BFF on HOST:PORT, and prints the page's URL. Each
# process is given its own key only. Ctrl-C (or SIGTERM) stops both.
#
#   HOLDFAST_URL=http://127.0.0.1:8080 HOLDFAST_STOREFRONT_TOKEN=hf_… \
#   HOLDFAST_PAYMENTS_TOKEN=hf_… PORT=8090 examples/storefront/start.sh
#
# Optional: HOST (default 127.0.0.1), PSP_PORT (default PORT+1),
# STOREFRONT_HOLD_SECONDS (a buyer's hold length; holdfast's default if unset).
set -euo pipefail

for name in HOLDFAST_URL HOLDFAST_STOREFRONT_TOKEN HOLDFAST_PAYMENTS_TOKEN; do
  if [ -z "${!name:-}" ]; then
    echo "start.sh: set $name (see examples/storefront/README.md)" >&2
    exit 2
  fi
done
export PORT="${PORT:-8090}" HOST="${HOST:-127.0.0.1}"
export PSP_PORT="${PSP_PORT:-$((PORT + 1))}"

cd "$(dirname "$0")"
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "storefront: npm ci"
  npm ci --no-audit --no-fund --loglevel=error
fi
if [ ! -f generated/holdfast.d.ts ] || [ ../../openapi/holdfast.json -nt generated/holdfast.d.ts ]; then
  echo "storefront: generating generated/holdfast.d.ts from openapi/holdfast.json"
  npx --no -- openapi-typescript ../../openapi/holdfast.json --output generated/holdfast.d.ts >/dev/null
fi

pids=()
stop() {
  [ "${#pids[@]}" -eq 0 ] || kill "${pids[@]}" 2>/dev/null || true
  wait || true
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

env -u HOLDFAST_STOREFRONT_TOKEN node --import tsx src/psp.ts &
pids+=($!)
env -u HOLDFAST_PAYMENTS_TOKEN PSP_URL="http://127.0.0.1:${PSP_PORT}" node --import tsx src/bff.ts &
pids+=($!)

listening() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }
connect_host="$HOST"
case "$HOST" in 0.0.0.0 | "::" | "[::]") connect_host=127.0.0.1 ;; esac
for _ in $(seq 1 300); do
  if listening 127.0.0.1 "$PSP_PORT" && listening "$connect_host" "$PORT"; then
    echo "storefront: open http://${connect_host}:${PORT}/  (payment provider on 127.0.0.1:${PSP_PORT}; Ctrl-C stops both)"
    wait -n "${pids[@]}" || status=$?
    exit "${status:-0}"
  fi
  for pid in "${pids[@]}"; do
    kill -0 "$pid" 2>/dev/null || { echo "storefront: a process exited while starting" >&2; exit 1; }
  done
  sleep 0.1
done
echo "storefront: not listening on ${PORT} and ${PSP_PORT} after 30 s" >&2
exit 1
