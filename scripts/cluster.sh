#!/usr/bin/env bash
# Starts or stops a local pscore job for manual runs (tests start the binaries themselves).
#   scripts/cluster.sh start --workers=W --servers=S [--dir=DIR] [--port=P] [--http_port=H] [--tls]
#   scripts/cluster.sh add --role=server|worker --dir=DIR [--node_id=ID] [--tls]   (join a running job, e.g. scale-out)
#   scripts/cluster.sh stop --dir=DIR
# Each process logs to DIR/<name>.log; DIR/pids lists "pid name"; DIR/scheduler.port holds the port.
# --tls: every process gets a certificate naming it from DIR/pki (scripts/tls_certs.sh, also
# one for "admin"): pscore-admin --tls_cert=DIR/pki/admin.crt --tls_key=DIR/pki/admin.key --tls_ca=DIR/pki/ca.crt
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
cmd=${1:-}
shift || true
workers=2 servers=2 dir="" port=0 role="" node_id="" http_port=-1 tls=0
for arg in "$@"; do
  case $arg in
    --workers=*) workers=${arg#*=} ;;
    --servers=*) servers=${arg#*=} ;;
    --dir=*) dir=${arg#*=} ;;
    --port=*) port=${arg#*=} ;;
    --http_port=*) http_port=${arg#*=} ;;
    --role=*) role=${arg#*=} ;;
    --node_id=*) node_id=${arg#*=} ;;
    --tls) tls=1 ;;
    *) echo "cluster.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done
[ -n "$dir" ] || dir=/tmp/pscore-job
JOB_DIR=$dir
export JOB_DIR
. "$root/scripts/lib.sh"
common=(--heartbeat_interval_ms=500 --heartbeat_timeout_ms=5000 --auto_finish=false)
# The TLS flags of process NAME (none without --tls); its certificate is made on first use.
tls_flags() {
  [ "$tls" = 1 ] || return 0
  "$root/scripts/tls_certs.sh" "$dir/pki" "$1" >/dev/null
  echo "--tls_cert=$dir/pki/$1.crt --tls_key=$dir/pki/$1.key --tls_ca=$dir/pki/ca.crt"
}
case $cmd in
  start)
    mkdir -p "$dir"
    rm -f "$dir/pids" "$dir/scheduler.port"
    [ "$tls" = 1 ] && "$root/scripts/tls_certs.sh" "$dir/pki" admin >/dev/null
    # shellcheck disable=SC2046  # tls_flags prints separate flags
    start_proc scheduler "$build/pscore-node" $(tls_flags scheduler) --role=scheduler --recoverable_roles=worker,server --worker_num="$workers" --server_num="$servers" \
      --scheduler_port="$port" --http_port="$http_port" --port_file="$dir/scheduler.port" "${common[@]}"
    wait_file "$dir/scheduler.port" 10
    p=$(cat "$dir/scheduler.port")
    for i in $(seq 0 $((servers - 1))); do
      # shellcheck disable=SC2046
      start_proc "server$i" "$build/pscore-node" $(tls_flags "server$i") --role=server --node_id="server$i" --scheduler_port="$p" "${common[@]}"
    done
    for i in $(seq 0 $((workers - 1))); do
      # shellcheck disable=SC2046
      start_proc "worker$i" "$build/pscore-node" $(tls_flags "worker$i") --role=worker --node_id="worker$i" --scheduler_port="$p" "${common[@]}"
    done
    echo "job started: scheduler port $p, logs in $dir"
    ;;
  add)
    [ -n "$role" ] || { echo "cluster.sh add: --role is required" >&2; exit 2; }
    p=$(cat "$dir/scheduler.port")
    [ -n "$node_id" ] || node_id="$role-$RANDOM"
    # shellcheck disable=SC2046
    start_proc "$node_id" "$build/pscore-node" $(tls_flags "$node_id") --role="$role" --node_id="$node_id" --scheduler_port="$p" "${common[@]}"
    echo "$role $node_id joined the job on port $p"
    ;;
  stop)
    stop_all
    rm -f "$dir/pids"
    echo "job in $dir stopped"
    ;;
  *)
    sed -n '2,7p' "$0"
    exit 2
    ;;
esac
