#!/usr/bin/env bash
# The README's test command: installs missing packages, builds, runs every test
# (without [slow]). Usage: scripts/test.sh [build-dir] [extra cmake args...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/build}
shift || true
"$root/scripts/build.sh" "$dir" "$@"
cd "$dir"
ctest --output-on-failure -j "${TEST_JOBS:-2}" --timeout 300
