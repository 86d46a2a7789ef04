#!/usr/bin/env bash
# Docs page check: headless Chromium opens /docs, every operation of
# /openapi.json must be on the page, no request may leave the holdfast host,
# and a full-page screenshot is saved (SCREENSHOT, default target/docs.png
# under the repository root).
#
#   usage: ci/docs-screenshot.sh BASE_URL      e.g. ci/docs-screenshot.sh http://127.0.0.1:8080
#
# Uses Debian's chromium (installed here when /usr/bin/chromium is missing)
# driven by playwright-core; no browser download.
set -euo pipefail

if [ "$#" -ne 1 ] || [ -z "$1" ]; then
  echo "usage: $0 BASE_URL   (e.g. $0 http://127.0.0.1:8080)" >&2
  exit 2
fi
base_url="${1%/}"

if [ ! -x /usr/bin/chromium ]; then
  echo "docs-screenshot: installing Debian's chromium"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
fi

cd "$(dirname "$0")/browser"

echo "docs-screenshot: npm ci"
npm ci --no-audit --no-fund

echo "docs-screenshot: checking ${base_url}/docs in headless Chromium"
HOLDFAST_URL="$base_url" node docs.mjs
