#!/usr/bin/env bash
# Generated clients against a live holdfast: each folder here with a run.sh
# generates a client from openapi/holdfast.json, type-checks its flow against
# it and runs the flow (see NAME/run.sh).
#
#   usage: ci/clients/run.sh BASE_URL [NAME...]   e.g. ci/clients/run.sh http://127.0.0.1:8080 orval
#   env:   HOLDFAST_TOKEN  an admin API key's token, when the service has keys
#
# Without NAMEs, every folder that has a run.sh, in name order. Each runs even
# when an earlier one failed; the script fails if any did.
set -euo pipefail

if [ "$#" -lt 1 ] || [ -z "$1" ]; then
  echo "usage: $0 BASE_URL [NAME...]   (e.g. $0 http://127.0.0.1:8080 openapi-fetch)" >&2
  exit 2
fi
base_url="${1%/}"
shift
cd "$(dirname "$0")"

names=("$@")
if [ "${#names[@]}" -eq 0 ]; then
  for runner in */run.sh; do
    [ -f "$runner" ] && names+=("${runner%/run.sh}")
  done
fi
if [ "${#names[@]}" -eq 0 ]; then
  echo "clients: no ci/clients/*/run.sh found" >&2
  exit 2
fi

passed=()
failed=()
for name in "${names[@]}"; do
  printf '\n== clients: %s\n' "$name"
  if [ "$name" != "${name##*/}" ] || [ ! -f "$name/run.sh" ]; then
    echo "clients: no ci/clients/$name/run.sh" >&2
    failed+=("$name")
    continue
  fi
  started=$SECONDS
  if [ -x "$name/run.sh" ]; then runner=("./$name/run.sh"); else runner=(bash "$name/run.sh"); fi
  if "${runner[@]}" "$base_url"; then
    echo "clients: $name passed in $((SECONDS - started)) s"
    passed+=("$name")
  else
    echo "clients: $name FAILED after $((SECONDS - started)) s" >&2
    failed+=("$name")
  fi
done

echo
echo "clients: passed: ${passed[*]:-none}; failed: ${failed[*]:-none} (against ${base_url})"
[ "${#failed[@]}" -eq 0 ]
