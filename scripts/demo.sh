#!/usr/bin/env bash
# The main job: installs missing packages, builds, and trains real PyTorch models through
# pscore across separate processes (1 scheduler, 2 servers, 2 workers; python/examples):
#   1. an MLP on scikit-learn's handwritten digits by synchronous data-parallel SGD, a
#      line per epoch, to >= 95% test accuracy;
#   2. a click-through-rate model whose pscore.torch.Embedding has 1,048,576 rows on the
#      servers, on generated data, a line per epoch (log loss, AUC).
# Exit 0 when both reached their bound. Python is Debian's /usr/bin/python3.
# --scale-out-at=STEP: the digits job adds a server after that training step (worker 0
# asks; this script starts the server once the scale-out began); --scale-in-at=STEP: it
# removes one (the highest rank leaves). Synchronous training ends with the weights of the
# run without it.
# Usage: scripts/demo.sh [--epochs=N] [--workers=N] [--servers=N] [--scale-out-at=STEP] [--scale-in-at=STEP]
#
# scripts/demo.sh --cpp: the C++ job (pscore-train): logistic regression with synchronous
# SGD over Push/Pull, a progress line per step and the final loss/accuracy against the
# generating weights. Exit 0 when it converged.
# Usage: scripts/demo.sh --cpp [--steps=N] [--workers=N] [--servers=N] [--scale-out-at=STEP]
#        [--scale-in-at=STEP] [--tls]
# --tls (C++ job only): every process gets a certificate naming it (scripts/tls_certs.sh)
# and every link, the HTTP port included, runs TLS 1.3 with mutual authentication.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
steps=60 workers=2 servers=2 scale_out_at=-1 scale_in_at=-1 cpp=0 epochs="" tls=0
for arg in "$@"; do
  case $arg in
    --cpp) cpp=1 ;;
    --tls) tls=1 ;;
    --steps=*) steps=${arg#*=} ;;
    --epochs=*) epochs=${arg#*=} ;;
    --workers=*) workers=${arg#*=} ;;
    --servers=*) servers=${arg#*=} ;;
    --scale-out-at=*) scale_out_at=${arg#*=} ;;
    --scale-in-at=*) scale_in_at=${arg#*=} ;;
    *) echo "demo.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done
if [ $tls -eq 1 ] && [ $cpp -eq 0 ]; then
  echo "demo.sh: --tls is for the C++ job (--cpp); the Python package takes no TLS options" >&2
  exit 2
fi
build=${BUILD_DIR:-$root/build}
if [ -z "${SKIP_BUILD:-}" ]; then
  echo "== building (first run installs packages and takes a few minutes)"
  "$root/scripts/build.sh" "$build"
fi
JOB_DIR=$(mktemp -d /tmp/pscore-demo.XXXXXX)
export JOB_DIR
. "$root/scripts/lib.sh"
trap stop_all EXIT
if [ $cpp -eq 0 ]; then
  PY=/usr/bin/python3
  [ -f "$build/python/pscore/__init__.py" ] || { echo "demo.sh: no Python package in $build (python3-pybind11 and python3-numpy missing?)" >&2; exit 1; }
  export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
  # run_job NAME SCRIPT ARGS...: one job of its own scheduler, servers and workers.
  run_job() {
    local name=$1 script=$2
    shift 2
    echo "== $name: 1 scheduler, $servers servers, $workers workers (logs in $JOB_DIR)"
    start_proc "$name-scheduler" "$PY" -m pscore.run scheduler --workers="$workers" --servers="$servers" \
      --port-file="$JOB_DIR/$name.port"
    wait_file "$JOB_DIR/$name.port" 30
    local port
    port=$(cat "$JOB_DIR/$name.port")
    for i in $(seq 0 $((servers - 1))); do
      start_proc "$name-server$i" "$PY" -m pscore.run server --scheduler-port="$port" --node-id="server$i"
    done
    local pids=()
    for i in $(seq 0 $((workers - 1))); do
      start_proc "$name-worker$i" "$PY" "$root/python/examples/$script" --scheduler-port="$port" \
        --node-id="worker$i" "$@"
      pids+=("$(tail -n 1 "$JOB_DIR/pids" | cut -d' ' -f1)")
    done
    # A scale-out asked for by worker 0: start the new server once `pscore-admin status`
    # shows CLUSTER_SCALE_OUT (a server registering before is refused, quota full, and waits
    # only --join_timeout_ms for it).
    if [ "$name" = digits ] && [ "$scale_out_at" -ge 0 ]; then
      (
        while kill -0 "${pids[0]}" 2>/dev/null; do
          if "$build/pscore-admin" --scheduler_port="$port" --timeout_ms=2000 status 2>/dev/null |
            grep -q CLUSTER_SCALE_OUT; then
            echo "== scale-out started: adding server$servers"
            start_proc "$name-server$servers" "$PY" -m pscore.run server --scheduler-port="$port" \
              --node-id="server$servers"
            break
          fi
          sleep 0.1
        done
      ) &
    fi
    tail -n +1 -f "$JOB_DIR/$name-worker0.log" --pid="${pids[0]}" | grep --line-buffered "^worker" || true
    local rc=0
    for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
    for i in $(seq 1 $((workers - 1))); do grep -h "final" "$JOB_DIR/$name-worker$i.log" || true; done
    return $rc
  }
  rc=0
  scale=()
  [ "$scale_out_at" -lt 0 ] || scale+=(--scale-out-at="$scale_out_at")
  [ "$scale_in_at" -lt 0 ] || scale+=(--scale-in-at="$scale_in_at")
  run_job digits digits_mlp.py ${epochs:+--epochs=$epochs} "${scale[@]}" || rc=1
  run_job ctr ctr.py ${epochs:+--epochs=$epochs} || rc=1
  if [ $rc -eq 0 ]; then echo "== demo reached its bounds; jobs finished"; else echo "== demo FAILED (logs in $JOB_DIR)"; fi
  exit $rc
fi
common=(--heartbeat_interval_ms=200 --heartbeat_timeout_ms=3000)
# The TLS flags of process NAME (none without --tls); its certificate is made on first use.
tls_flags() {
  [ $tls -eq 1 ] || return 0
  "$root/scripts/tls_certs.sh" "$JOB_DIR/pki" "$1" >/dev/null
  echo "--tls_cert=$JOB_DIR/pki/$1.crt --tls_key=$JOB_DIR/pki/$1.key --tls_ca=$JOB_DIR/pki/ca.crt"
}
echo "== C++ job: 1 scheduler, $servers servers, $workers workers$([ $tls -eq 1 ] && echo ", TLS") (logs in $JOB_DIR)"
# shellcheck disable=SC2046  # tls_flags prints separate flags
# With --tls and --scale-out-at or --scale-in-at, worker0 asks for the scale with its own
# certificate: the scheduler lets it (admin commands need a CN of --tls_admin_cns,
# docs/security.md).
admin_cns=()
[ $tls -eq 1 ] && { [ "$scale_out_at" -ge 0 ] || [ "$scale_in_at" -ge 0 ]; } && admin_cns=(--tls_admin_cns=admin,worker0)
start_proc scheduler "$build/pscore-node" $(tls_flags scheduler) "${admin_cns[@]}" --role=scheduler --recoverable_roles=worker,server --worker_num="$workers" --server_num="$servers" \
  --scheduler_port=0 --port_file="$JOB_DIR/scheduler.port" "${common[@]}"
wait_file "$JOB_DIR/scheduler.port" 10
port=$(cat "$JOB_DIR/scheduler.port")
for i in $(seq 0 $((servers - 1))); do
  # shellcheck disable=SC2046
  start_proc "server$i" "$build/pscore-node" $(tls_flags "server$i") --role=server --node_id="server$i" --scheduler_port="$port" \
    --update_rule=sgd --learning_rate=2 "${common[@]}"
done
worker_pids=()
for i in $(seq 0 $((workers - 1))); do
  # shellcheck disable=SC2046
  start_proc "worker$i" "$build/pscore-train" $(tls_flags "worker$i") --node_id="worker$i" --scheduler_port="$port" --steps="$steps" \
    --scale_out_at="$scale_out_at" --scale_in_at="$scale_in_at" "${common[@]}"
  worker_pids+=("$(tail -n 1 "$JOB_DIR/pids" | cut -d' ' -f1)")
done
# --scale-out-at: worker 0 asks the scheduler for one more server after that step. A server
# that registers before the scale-out starts is refused (quota full) and waits only
# --join_timeout_ms for it, so start it once `pscore-admin status` shows CLUSTER_SCALE_OUT
# (polled while the workers run).
if [ "$scale_out_at" -ge 0 ]; then
  (
    while kill -0 "${worker_pids[0]}" 2>/dev/null; do
      # shellcheck disable=SC2046
      if "$build/pscore-admin" $(tls_flags admin) --scheduler_port="$port" --timeout_ms=2000 status 2>/dev/null |
        grep -q CLUSTER_SCALE_OUT; then
        echo "== scale-out started: adding server$servers"
        # shellcheck disable=SC2046
        start_proc "server$servers" "$build/pscore-node" $(tls_flags "server$servers") --role=server --node_id="server$servers" \
          --scheduler_port="$port" --update_rule=sgd --learning_rate=2 "${common[@]}"
        break
      fi
      sleep 0.1
    done
  ) &
fi
# Follow the first worker's progress while the job runs.
tail -n +1 -f "$JOB_DIR/worker0.log" --pid="${worker_pids[0]}" | grep --line-buffered -E "^worker|pscore-train" || true
rc=0
for pid in "${worker_pids[@]}"; do wait "$pid" || rc=1; done
for i in $(seq 1 $((workers - 1))); do grep -h "final" "$JOB_DIR/worker$i.log" || true; done
sched_pid=$(head -n 1 "$JOB_DIR/pids" | cut -d' ' -f1)
for _ in $(seq 1 100); do kill -0 "$sched_pid" 2>/dev/null || break; sleep 0.05; done
if [ $rc -eq 0 ]; then echo "== demo converged; job finished"; else echo "== demo FAILED (logs in $JOB_DIR)"; fi
exit $rc
