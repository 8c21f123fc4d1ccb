#!/usr/bin/env bash
# Configures and builds pscore. Usage: scripts/build.sh [build-dir] [extra cmake args...]
# BUILD_TYPE (default RelWithDebInfo) and JOBS (default: all cores) may be set.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/build}
shift || true
"$root/scripts/setup.sh"
cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" "$@" >/dev/null
ninja -C "$dir" -j "${JOBS:-$(nproc)}"
