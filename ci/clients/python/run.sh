#!/usr/bin/env bash
# openapi-python-client: generate a Python client from the committed OpenAPI
# document, type-check flow.py against it (mypy --strict), then run the flow
# against a live holdfast.
#
#   usage: ci/clients/python/run.sh BASE_URL
#   env:   HOLDFAST_TOKEN  an admin API key's token, when the service has keys
#          PYTHON          the interpreter for the venv (default python3.11, else python3; 3.11 or later)
#
# The venv lives in target/clients-python-venv (made once, then only brought
# to requirements.txt); the client is written to generated/holdfast_client.
# A generator warning (a piece of the document it skipped) fails the run.
set -euo pipefail

if [ "$#" -ne 1 ] || [ -z "$1" ]; then
  echo "usage: $0 BASE_URL   (e.g. $0 http://127.0.0.1:8080)" >&2
  exit 2
fi
base_url="${1%/}"
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
venv="$repo/target/clients-python-venv"
document="$repo/openapi/holdfast.json"
cd "$here"

if [ ! -x "$venv/bin/python" ]; then
  python="${PYTHON:-}"
  if [ -z "$python" ]; then
    if command -v python3.11 >/dev/null 2>&1; then python=python3.11; else python=python3; fi
  fi
  if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "python: $python is $("$python" --version 2>&1); the generated client needs 3.11 or later (set PYTHON)" >&2
    exit 2
  fi
  echo "python: creating $venv with $("$python" --version 2>&1)"
  "$python" -m venv "$venv"
fi
echo "python: pip install -r requirements.txt"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --require-hashes -r requirements.txt

# The generator runs ruff (from the venv) over what it writes.
export PATH="$venv/bin:$PATH"

echo "python: generating generated/holdfast_client from openapi/holdfast.json ($(openapi-python-client --version))"
rm -rf generated
mkdir -p generated
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! openapi-python-client generate --path "$document" --output-path generated/holdfast_client \
  --meta none --fail-on-warning >"$log" 2>&1; then
  cat "$log" >&2
  echo "python: openapi-python-client failed on openapi/holdfast.json (see above)" >&2
  exit 1
fi
cat "$log"
rm -rf generated/holdfast_client/.ruff_cache

echo "python: mypy --strict flow.py"
MYPYPATH="$here/generated" mypy --strict --cache-dir "$venv/mypy-cache" flow.py

echo "python: running the flow against ${base_url}"
PYTHONPATH="$here/generated" PYTHONDONTWRITEBYTECODE=1 python flow.py "$base_url"
