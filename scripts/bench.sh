#!/usr/bin/env bash
# Benchmark dispatcher: scripts/bench.sh <name> [args passed to the benchmark binary]
# Builds in build-bench (Release) when needed, then runs the named benchmark.
# Figures are printed one per line as `name value unit`; see docs/benchmarks.md.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${PSCORE_BENCH_BUILD:-$ROOT/build-bench}"
JOBS="${PSCORE_BENCH_JOBS:-1}"

usage() {
  echo "usage: $0 {transport|control|dataplane|coord|ranktable|scale|sparse|restart|failover|python|smoke} [args...]" >&2
  exit 1
}

# Configures build-bench in Release (once) and builds one target.
build() {
  local target="$1"
  if [[ ! -f "$BUILD/build.ninja" ]]; then
    cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  # shellcheck disable=SC2086  # several targets may be given, space-separated
  ninja -C "$BUILD" -j"$JOBS" $target >&2
}

not_yet() {
  echo "benchmark '$1': not yet implemented" >&2
  exit 2
}

# Every benchmark binary once at tiny sizes: each must exit 0 and print its figures (CI runs
# this so no benchmark rots). PSCORE_BENCH_BUILD picks the build directory (CI: build-ci).
smoke() {
  local benches=(transport_bench control_bench dataplane_bench coord_bench ranktable_bench scale_bench sparse_bench
    soak_driver_bench sched_restart_bench failover_bench)
  build "${benches[*]} pscore-node"
  local failed=0 t0
  run_one() {  # name, then the command; its stdout must hold at least one figure line
    local name="$1" out rc=0
    shift
    t0=$SECONDS
    out=$("$@" 2>"$tmp/$name.err") || rc=$?
    printf '%s\n' "$out"
    if [[ $rc -ne 0 ]] || ! grep -Eq '^[A-Za-z_0-9.]+ +-?[0-9]' <<<"$out"; then
      echo "smoke $name: FAILED (exit $rc, or no figure printed); stderr:" >&2
      tail -20 "$tmp/$name.err" >&2
      failed=1
    fi
    echo "== smoke $name took $((SECONDS - t0)) s"
  }
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/pscore-bench-smoke-XXXXXX")
  run_one transport "$BUILD/transport_bench" smoke
  run_one transport-tls "$BUILD/transport_bench" tls-smoke
  run_one control "$BUILD/control_bench" --members=50 --seconds=1
  PSCORE_BENCH_ROUNDS=1 run_one dataplane "$BUILD/dataplane_bench" smoke
  PSCORE_BENCH_ROUNDS=1 run_one dataplane-tls "$BUILD/dataplane_bench" tls-smoke
  run_one coord "$BUILD/coord_bench" all --clients=2 --client_loops=1 --duration_s=0.3 --rounds=5 \
    --fanout_nodes=8 --fanout_reps=2
  run_one ranktable "$BUILD/ranktable_bench" smoke
  run_one scale "$BUILD/scale_bench" smoke
  run_one sparse "$BUILD/sparse_bench" smoke
  run_one restart "$BUILD/sched_restart_bench" --runs=1
  run_one failover "$BUILD/failover_bench" --runs=1
  run_one soak_driver soak_smoke
  build _pscore
  PYTHONPATH="$BUILD/python" run_one python /usr/bin/python3 "$ROOT/python/bench/bench_python.py" --smoke
  rm -rf "$tmp"
  return $failed
}

# A scheduler, one server and one soak_driver with --check for about a second; prints the
# driver's check line as a figure. Every process is stopped by its pid.
soak_smoke() {
  local node="$BUILD/pscore-node" dir="$tmp/soak" sched srv drv rc=0 i
  mkdir -p "$dir"
  "$node" --role=scheduler --scheduler_port=0 --worker_num=1 --server_num=1 --port_file="$dir/port" \
    --heartbeat_interval_ms=200 >"$dir/scheduler.log" 2>&1 &
  sched=$!
  for ((i = 0; i < 200; i++)); do [[ -s "$dir/port" ]] && break; sleep 0.05; done
  if [[ ! -s "$dir/port" ]]; then kill -KILL $sched; wait $sched 2>/dev/null; return 1; fi
  "$node" --role=server --node_id=s0 --scheduler_port="$(cat "$dir/port")" --auto_finish=false \
    --heartbeat_interval_ms=200 >"$dir/s0.log" 2>&1 &
  srv=$!
  "$BUILD/soak_driver_bench" --scheduler_port="$(cat "$dir/port")" --node_id=w0 --dir="$dir" --check --peers=w0 \
    --connect_timeout_ms=20000 >"$dir/w0.out" 2>"$dir/w0.log" &
  drv=$!
  for ((i = 0; i < 400; i++)); do [[ -s "$dir/w0.acked" ]] && break; sleep 0.05; done
  sleep 1
  touch "$dir/stop"
  for ((i = 0; i < 600; i++)); do kill -0 $drv 2>/dev/null || break; sleep 0.05; done
  kill -KILL $drv 2>/dev/null || true
  wait $drv || rc=$?
  kill -KILL $srv $sched 2>/dev/null || true
  wait $srv $sched 2>/dev/null || true
  # "soak check: keys 64, pushes acknowledged N, ..." as one figure line.
  sed -n 's/^soak check: keys [0-9]*, pushes acknowledged \([0-9]*\),.*/soak_pushes_acknowledged \1 count/p' "$dir/w0.out"
  cat "$dir/w0.out" >&2
  [[ $rc -eq 0 ]] || tail -5 "$dir/w0.log" "$dir/s0.log" "$dir/scheduler.log" >&2
  return $rc
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
  dataplane)  # push/pull throughput, pull latency, send rates vs blocking sockets; --tls: TLS vs plaintext
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
  sparse)  # the store alone (ns per key), then 10 M keys x 1 float and 1 M keys x 64 floats per call: push (new, present), pull vs memcpy
    build sparse_bench
    exec "$BUILD/sparse_bench" "$@"
    ;;
  python)  # the Python binding vs the C++ API: push/pull MB/s, 64 B pull p50, MLP samples/s (docs/python.md)
    build _pscore
    PYTHONPATH="$BUILD/python" exec /usr/bin/python3 "$ROOT/python/bench/bench_python.py" "$@"
    ;;
  restart)  # scheduler SIGKILL (restarted from --state_dir) to the first completed barrier: median
    build "sched_restart_bench pscore-node"
    exec "$BUILD/sched_restart_bench" "$@"
    ;;
  failover)  # replicas=2: primary SIGKILL / SIGSTOP (real processes) to the promoted replica's first ack: median
    build "failover_bench pscore-node"
    exec "$BUILD/failover_bench" "$@"
    ;;
  smoke)
    smoke
    ;;
  *) usage ;;
esac
