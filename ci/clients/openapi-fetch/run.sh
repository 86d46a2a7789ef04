#!/usr/bin/env bash
# openapi-typescript + openapi-fetch: generate the types from the committed
# OpenAPI document, type-check flow.ts against them (strict), then run the
# flow against a live holdfast.
#
#   usage: ci/clients/openapi-fetch/run.sh BASE_URL
#   env:   HOLDFAST_TOKEN  an admin API key's token, when the service has keys
set -euo pipefail

if [ "$#" -ne 1 ] || [ -z "$1" ]; then
  echo "usage: $0 BASE_URL   (e.g. $0 http://127.0.0.1:8080)" >&2
  exit 2
fi
base_url="${1%/}"
cd "$(dirname "$0")"

echo "openapi-fetch: npm ci"
npm ci --no-audit --no-fund

echo "openapi-fetch: generating generated/holdfast.d.ts from openapi/holdfast.json"
rm -rf generated
mkdir -p generated
npx --no -- openapi-typescript ../../../openapi/holdfast.json --output ./generated/holdfast.d.ts

echo "openapi-fetch: type-checking flow.ts against the generated types"
npx --no -- tsc --noEmit

echo "openapi-fetch: running the flow against ${base_url}"
HOLDFAST_URL="$base_url" npx --no -- tsx flow.ts
