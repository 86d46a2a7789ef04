#!/usr/bin/env bash
# @hey-api/openapi-ts (fetch client and SDK): generate the client from the
# committed OpenAPI document (openapi-ts.config.ts), type-check flow.ts
# against it (strict), then run the flow against a live holdfast.
#
#   usage: ci/clients/hey-api/run.sh BASE_URL
#   env:   HOLDFAST_TOKEN  an admin API key's token, when the service has keys
set -euo pipefail

if [ "$#" -ne 1 ] || [ -z "$1" ]; then
  echo "usage: $0 BASE_URL   (e.g. $0 http://127.0.0.1:8080)" >&2
  exit 2
fi
base_url="${1%/}"
cd "$(dirname "$0")"

echo "hey-api: npm ci"
npm ci --no-audit --no-fund

echo "hey-api: generating generated/ from openapi/holdfast.json"
rm -rf generated
npx --no -- openapi-ts --file openapi-ts.config.ts --no-log-file

echo "hey-api: type-checking flow.ts against the generated client"
npx --no -- tsc --noEmit

echo "hey-api: running the flow against ${base_url}"
HOLDFAST_URL="$base_url" npx --no -- tsx flow.ts
