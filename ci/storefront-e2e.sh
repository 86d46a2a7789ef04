#!/usr/bin/env bash
# Storefront check (examples/storefront): seeds four plates under a fresh
# prefix with the admin key, starts the storefront (payment provider + BFF)
# on ports 18321-18329 against BASE_URL, and drives it in headless Chromium
# with two buyers: a race for one plate (one wins, the other queues at 1 and
# is handed the plate when the winner releases), a second tab's own hold, a
# sale, and a late payment that comes back refunded. Saves
# $SCREENSHOT_DIR/storefront.png (default target/ under the repository root).
# Stops everything it started.
#
#   usage: ci/storefront-e2e.sh BASE_URL ADMIN_TOKEN STOREFRONT_TOKEN PAYMENTS_TOKEN
#
# The holdfast at BASE_URL must allow hold_seconds of HOLD_SECONDS (default
# 15), e.g. HOLDFAST_HOLD_SECONDS_MIN=1. Uses Debian's chromium (installed
# when /usr/bin/chromium is missing) driven by playwright-core.
set -euo pipefail

if [ "$#" -ne 4 ] || [ -z "$1" ] || [ -z "$2" ] || [ -z "$3" ] || [ -z "$4" ]; then
  echo "usage: $0 BASE_URL ADMIN_TOKEN STOREFRONT_TOKEN PAYMENTS_TOKEN" >&2
  exit 2
fi
base_url="${1%/}"
admin_token="$2"
storefront_token="$3"
payments_token="$4"
hold_seconds="${HOLD_SECONDS:-15}"

root="$(cd "$(dirname "$0")/.." && pwd)"
screenshot_dir="${SCREENSHOT_DIR:-$root/target}"
case "$screenshot_dir" in /*) ;; *) screenshot_dir="$PWD/$screenshot_dir" ;; esac
app="$root/examples/storefront"
started=$SECONDS

if [ ! -x /usr/bin/chromium ]; then
  echo "storefront-e2e: installing Debian's chromium"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
fi

cd "$app"
echo "storefront-e2e: npm ci"
npm ci --no-audit --no-fund --loglevel=error
echo "storefront-e2e: generating the client from openapi/holdfast.json and type-checking"
rm -rf generated
npx --no -- openapi-typescript ../../openapi/holdfast.json --output generated/holdfast.d.ts >/dev/null
npx --no -- tsc --noEmit

# Two free ports in 18321-18329: the BFF's and the payment provider's.
free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
ports=()
for port in $(seq 18321 18329); do
  if free "$port"; then ports+=("$port"); fi
  [ "${#ports[@]}" -lt 2 ] || break
done
if [ "${#ports[@]}" -lt 2 ]; then
  echo "storefront-e2e: fewer than two free ports in 18321-18329" >&2
  exit 1
fi

prefix="Z$(tr -dc 'A-HJ-NP-Z2-9' </dev/urandom | head -c 5 || true)"
echo "storefront-e2e: seeding ${prefix}1..${prefix}4 at ${base_url}"
items=""
for i in 1 2 3 4; do
  items+="${items:+,}{\"id\": \"${prefix}${i}\", \"name\": \"Plate ${prefix} ${i}\","
  items+=" \"price\": {\"amount\": $((i * 125000000)), \"currency\": \"IDR\"}, \"attributes\": {\"region\": \"Z\"}}"
done
work="$(mktemp -d)"
storefront_pid=""
stop() {
  if [ -n "$storefront_pid" ]; then
    kill "$storefront_pid" 2>/dev/null || true
    wait "$storefront_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap stop EXIT

seeded="$(curl -sS -o "$work/seed.json" -w '%{http_code}' -X POST "${base_url}/v1/assets/batch" \
  -H "Authorization: Bearer ${admin_token}" -H 'Content-Type: application/json' \
  -H "Idempotency-Key: storefront-e2e-${prefix}" -d "{\"items\": [${items}]}")" || seeded="no answer"
if [ "$seeded" != "200" ]; then
  echo "storefront-e2e: seeding answered ${seeded}: $(cat "$work/seed.json" 2>/dev/null)" >&2
  exit 1
fi

log="$work/storefront.log"
echo "storefront-e2e: starting the storefront on ${ports[0]} (payment provider ${ports[1]})"
HOLDFAST_URL="$base_url" HOLDFAST_STOREFRONT_TOKEN="$storefront_token" HOLDFAST_PAYMENTS_TOKEN="$payments_token" \
  PORT="${ports[0]}" PSP_PORT="${ports[1]}" STOREFRONT_HOLD_SECONDS="$hold_seconds" \
  ./start.sh >"$log" 2>&1 &
storefront_pid=$!
deadline=$((SECONDS + 60))
until grep -q '^storefront: open ' "$log"; do
  if ! kill -0 "$storefront_pid" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; then
    echo "storefront-e2e: the storefront did not start:" >&2
    cat "$log" >&2
    exit 1
  fi
  sleep 0.2
done

echo "storefront-e2e: two buyers in headless Chromium"
status=0
STOREFRONT_URL="http://127.0.0.1:${ports[0]}" PLATE_PREFIX="$prefix" HOLD_SECONDS="$hold_seconds" \
  SCREENSHOT_DIR="$screenshot_dir" node --import tsx test/e2e.ts || status=$?
if [ "$status" -ne 0 ]; then
  echo "storefront-e2e: the storefront's log:" >&2
  cat "$log" >&2
  exit "$status"
fi
echo "storefront-e2e: PASSED in $((SECONDS - started)) s (screenshot ${screenshot_dir}/storefront.png)"
