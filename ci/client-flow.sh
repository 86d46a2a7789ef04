#!/usr/bin/env bash
# Generated typed client check: build a TypeScript client from the committed
# OpenAPI document, type-check the reservation flow against it, then run the
# flow against a live holdfast.
#
#   usage: ci/client-flow.sh BASE_URL      e.g. ci/client-flow.sh http://127.0.0.1:8080
#
# Needs node (>= 20) and npm, and the npm registry for `npm ci`.
set -euo pipefail

if [ "$#" -ne 1 ] || [ -z "$1" ]; then
  echo "usage: $0 BASE_URL   (e.g. $0 http://127.0.0.1:8080)" >&2
  exit 2
fi
base_url="${1%/}"

cd "$(dirname "$0")/client"

echo "client-flow: npm ci"
npm ci --no-audit --no-fund

echo "client-flow: generating generated/holdfast.d.ts from openapi/holdfast.json"
rm -rf generated
mkdir -p generated
npx --no -- openapi-typescript ../../openapi/holdfast.json --output ./generated/holdfast.d.ts

echo "client-flow: type-checking flow.ts against the generated types"
npx --no -- tsc --noEmit

echo "client-flow: running the flow against ${base_url}"
HOLDFAST_URL="$base_url" npx --no -- tsx flow.ts

echo "client-flow: PASSED (client generated from openapi/holdfast.json, type-checked, flow green against ${base_url})"
