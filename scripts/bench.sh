#!/usr/bin/env bash
# Benchmark dispatcher: scripts/bench.sh <name> [args passed to the benchmark binary]
# Builds in build-bench (Release) when needed, then runs the named benchmark.
# Figures are printed one per line as `name value unit`; see docs/benchmarks.md.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${PSCORE_BENCH_BUILD:-$ROOT/build-bench}"
JOBS="${PSCORE_BENCH_JOBS:-1}"

usage() {
  echo "usage: $0 {transport|control|dataplane|coord|ranktable|scale} [args...]" >&2
  exit 1
}

# Configures build-bench in Release (once) and builds one target.
build() {
  local target="$1"
  if [[ ! -f "$BUILD/build.ninja" ]]; then
    cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  ninja -C "$BUILD" -j"$JOBS" "$target" >&2
}

not_yet() {
  echo "benchmark '$1': not yet implemented" >&2
  exit 2
}

[[ $# -ge 1 ]] || usage
name="$1"
shift

case "$name" in
  transport)
    build transport_bench
    exec "$BUILD/transport_bench" "$@"
    ;;
  control)  # per member count, without and with a CPU burner: READY time, heartbeat bytes, CPU per beat, peak RSS
    # --members=a,b,c (default 1000,2000,10000); other arguments go to every run. Each run
    # is its own process, so each peak RSS is that size's own.
    build control_bench
    members="1000,2000,10000"
    pass=()
    for a in "$@"; do
      case "$a" in
        --members=*) members="${a#--members=}" ;;
        *) pass+=("$a") ;;
      esac
    done
    rc=0
    for m in ${members//,/ }; do
      for burn in "" "--burner"; do
        "$BUILD/control_bench" --members="$m" $burn "${pass[@]}" || rc=1
      done
    done
    exit $rc
    ;;
  dataplane)  # push/pull throughput, pull latency, send rates vs blocking sockets
    build dataplane_bench
    exec "$BUILD/dataplane_bench" "$@"
    ;;
  coord)  # KV set+get pairs/s and MB/s, 64-node barrier release, error fan-out to 256 nodes
    build coord_bench
    exec "$BUILD/coord_bench" "$@"
    ;;
  ranktable)
    build ranktable_bench
    exec "$BUILD/ranktable_bench" "$@"
    ;;
  scale)  # admin command to READY for 2->4 and 4->8 servers at 64 MiB..1 GiB; migration vs Push rate
    build scale_bench
    exec "$BUILD/scale_bench" "$@"
    ;;
  *) usage ;;
esac
