#!/usr/bin/env bash
# Thin wrapper: the bounded chaos run (ci/chaos.py), both backends by default.
#   ci/chaos.sh [--backend postgres|sqlite|both] [--seconds N] [--bin PATH]
set -euo pipefail
exec python3 "$(dirname "$0")/chaos.py" "$@"
