#!/usr/bin/env bash
# Operator console check: headless Chromium signs in to /console (with the
# API key as the Basic password when one is given), watches assets held and
# committed through the API turn HELD with a running countdown and then SOLD
# without a reload, withdraws and reinstates assets from the page (a held one
# after confirming), explains ASSET_HELD and ASSET_SOLD, voids a sale, sets
# when a sale opens, checks the refunds panel, the timeline, the create form,
# keyboard reach and labels, and that no request leaves the holdfast host;
# saves target/console.png (1280x800) and target/console-phone.png (375x812)
# under the repository root (or SCREENSHOT_DIR).
#
#   usage: ci/console-e2e.sh BASE_URL [API_KEY]
#          e.g. ci/console-e2e.sh http://127.0.0.1:8080 hf_…   (an admin key)
#   HOLDFAST_OFFER_CLIENT names the storefront key the offer it makes is for
#   (default "-", open mode's one client).
#
# Give it a holdfast with a fresh database: the assets it creates must be on
# the board's first page. Uses Debian's chromium (installed here when
# /usr/bin/chromium is missing) driven by playwright-core; no browser download.
set -euo pipefail

if [ "$#" -lt 1 ] || [ "$#" -gt 2 ] || [ -z "$1" ]; then
  echo "usage: $0 BASE_URL [API_KEY]   (e.g. $0 http://127.0.0.1:8080 hf_…)" >&2
  exit 2
fi
base_url="${1%/}"
api_key="${2:-}"

if [ ! -x /usr/bin/chromium ]; then
  echo "console-e2e: installing Debian's chromium"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
fi

cd "$(dirname "$0")/browser"

echo "console-e2e: npm ci"
npm ci --no-audit --no-fund

echo "console-e2e: checking ${base_url}/console in headless Chromium"
HOLDFAST_URL="$base_url" HOLDFAST_TOKEN="$api_key" HOLDFAST_OFFER_CLIENT="${HOLDFAST_OFFER_CLIENT:--}" node console.mjs
