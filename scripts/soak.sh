#!/usr/bin/env bash
# Bounded soak of a local job: scripts/soak.sh [minutes] (default 5).
# A scheduler (--state_dir, --replicas=SOAK_REPLICAS, default 1), 2 servers and 2
# soak_driver workers pushing +1 to 64 keys and counting acknowledged pushes. Until the
# time is up, one fault at a time, at random:
#   - SIGKILL a worker and restart it with the same --node_id;
#   - SIGKILL a server and restart it with the same --node_id and --data_dir (its
#     parameter journal: every acknowledged push must survive; --journal_compact_mb=1, so
#     background compactions run all the time and the kills land amid them);
#   - with replicas >= 2, lose a server's host: SIGKILL it, delete its --data_dir and
#     restart it empty (it is rebuilt from the other replica: docs/reliability.md, Resync);
#   - a scale-out to 3 servers (pscore-admin, a new server s2) and back (scale-in: s2
#     hands its keys over and leaves);
#   - once, SIGKILL the scheduler and restart it on the same port with its --state_dir.
# Two faults happen in every run, whatever the seed and length: the first fault is a server
# SIGKILL (with replicas >= 2 a host loss), and the scheduler restart comes at the first
# fault round after half time (or, if no round started in the second half, right after the
# time is up). After each fault the soak waits until the cluster is READY, no node is timed
# out and no server resyncing, so a range always has a complete copy when the next comes.
# At the end the drivers stop, worker w0
# pulls every key and checks acknowledged <= value <= sent; the job is stopped.
# Exit 0 only if no acknowledged update was lost (nor duplicated), the job recovered from
# every fault, and both the server SIGKILL (a host loss with replicas >= 2) and the
# scheduler restart happened.
# BUILD_DIR (default build) selects the build tree; SOAK_SEED the RNG.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
minutes=${1:-5}
build=${BUILD_DIR:-$root/build}
case $build in /*) ;; *) build=$root/$build ;; esac
if [ -f "$build/build.ninja" ]; then
  ninja -C "$build" -j1 pscore-node pscore-admin soak_driver_bench >/dev/null
else
  "$root/scripts/build.sh" "$build" >/dev/null
fi
node=$build/pscore-node admin=$build/pscore-admin driver=$build/soak_driver_bench
dir=$(mktemp -d "${TMPDIR:-/tmp}/pscore-soak-XXXXXX")
RANDOM=${SOAK_SEED:-$$}
replicas=${SOAK_REPLICAS:-1}
timing=(--heartbeat_interval_ms=200 --heartbeat_timeout_ms=3000 --connect_timeout_ms=30000)
declare -A pid=()
faults=0 recoveries=0 scale_ops=0 failures=0 worker_kills=0 server_kills=0 host_losses=0 scheduler_restarts=0

log() { echo "soak [$(date +%T)] $*"; }
cleanup() {
  for p in "${pid[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

wait_file() {
  local deadline=$((SECONDS + $2))
  while [ ! -s "$1" ]; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.05
  done
}
start_scheduler() {
  rm -f "$dir/sched.port"
  "$node" --role=scheduler --recoverable_roles=worker,server --scheduler_port="${port:-0}" --worker_num=2 --server_num=2 \
    --replicas="$replicas" --state_dir="$dir/state" \
    --scale_timeout_ms=30000 --port_file="$dir/sched.port" "${timing[@]}" >>"$dir/scheduler.log" 2>&1 &
  pid[scheduler]=$!
  wait_file "$dir/sched.port" 15 || { log "scheduler did not start"; exit 1; }
  port=$(cat "$dir/sched.port")
}
start_server() {
  "$node" --role=server --node_id="$1" --scheduler_port="$port" --auto_finish=false --data_dir="$dir/$1.data" --journal_compact_mb=1 "${timing[@]}" \
    >>"$dir/$1.log" 2>&1 &
  pid[$1]=$!
}
start_worker() {
  local extra=()
  [ "$1" = w0 ] && extra=(--check --peers=w0,w1)
  "$driver" --scheduler_port="$port" --node_id="$1" --dir="$dir" --heartbeat_interval_ms=200 \
    --connect_timeout_ms=30000 "${extra[@]}" >>"$dir/$1.log" 2>&1 &
  pid[$1]=$!
}
adm() { "$admin" --scheduler_port="$port" --timeout_ms=5000 "$@"; }
# Waits (bounded) until every node is alive and the cluster READY; counts a recovery.
wait_ready() {
  local deadline=$((SECONDS + ${1:-60}))
  while [ $SECONDS -lt $deadline ]; do
    if adm status 2>/dev/null | grep -q "cluster CLUSTER_READY" &&
      ! adm nodes 2>/dev/null | grep -q "TIMED_OUT" &&
      ! adm nodes --json 2>/dev/null | grep -q '"resyncing":true'; then
      return 0
    fi
    sleep 0.2
  done
  log "FAILED: the cluster did not return to READY; status: $(adm status 2>&1 | tr '\n' ' ')"
  failures=$((failures + 1))
  return 1
}
acked() { cat "$dir"/w*.acked 2>/dev/null | wc -c; }

log "dir $dir, $minutes minute(s)"
start_scheduler
start_server s0
start_server s1
start_worker w0
start_worker w1
wait_ready 30 || exit 1
log "READY on port $port"
end=$((SECONDS + minutes * 60))
sched_at=$((SECONDS + minutes * 30))  # the scheduler restart happens half way

# SIGKILL member $1, restart it with start_$2 after up to a second, wait for READY; with
# a third argument "host", its data directory is deleted first (the host is lost).
kill_member() {
  local m=$1 role=$2 host=${3:-}
  log "fault: SIGKILL $m${host:+ and delete its data} (pushes acked so far: $(acked))"
  kill -KILL "${pid[$m]}"
  wait "${pid[$m]}" 2>/dev/null || true
  [ -z "$host" ] || rm -rf "$dir/$m.data"
  sleep 0.$((RANDOM % 10))
  "start_$role" "$m"
  faults=$((faults + 1))
  if wait_ready 60; then
    recoveries=$((recoveries + 1))
    log "recovered: $m restarted"
  fi
}
kill_server() {
  if [ "$replicas" -ge 2 ] && { [ $server_kills -eq 0 ] || [ $((RANDOM % 2)) -eq 0 ]; }; then
    kill_member "s$((RANDOM % 2))" server host
    host_losses=$((host_losses + 1))
  else
    kill_member "s$((RANDOM % 2))" server
  fi
  server_kills=$((server_kills + 1))
}
restart_scheduler() {
  log "fault: SIGKILL scheduler (pushes acked so far: $(acked))"
  kill -KILL "${pid[scheduler]}"
  wait "${pid[scheduler]}" 2>/dev/null || true
  sleep 1
  start_scheduler
  faults=$((faults + 1)) scheduler_restarts=$((scheduler_restarts + 1))
  if wait_ready 60; then
    recoveries=$((recoveries + 1))
    log "recovered: scheduler restarted from its state file"
  fi
}

# Past the end, the loop only runs the guaranteed faults still missing.
while [ $SECONDS -lt $end ] || [ $server_kills -eq 0 ] || [ $scheduler_restarts -eq 0 ]; do
  sleep $((2 + RANDOM % 4))
  if [ $server_kills -eq 0 ]; then
    kill_server
    continue
  fi
  if [ $scheduler_restarts -eq 0 ] && [ $SECONDS -ge $sched_at ]; then
    restart_scheduler
    continue
  fi
  [ $SECONDS -lt $end ] || continue
  case $((RANDOM % 4)) in
    3) kill_server ;;
    0 | 1)
      kill_member "w$((RANDOM % 2))" worker
      worker_kills=$((worker_kills + 1))
      ;;
    2)
      log "scale-out to 3 servers"
      adm scale-out --servers=3 --wait_timeout_ms=60000 >>"$dir/admin.log" 2>&1 &
      apid=$!
      # s2 starts once the scale-out has begun, as an operator orders the two steps (started
      # before, it would be refused, the server quota full, and register again until then).
      scale_deadline=$((SECONDS + 30))
      until adm status 2>/dev/null | grep -q "cluster CLUSTER_SCALE_OUT" || ! kill -0 "$apid" 2>/dev/null ||
        [ $SECONDS -ge $scale_deadline ]; do
        sleep 0.05
      done
      start_server s2
      if wait "$apid"; then
        scale_ops=$((scale_ops + 1))
        log "scale-in to 2 servers"
        if adm scale-in --servers=2 --wait_timeout_ms=60000 >>"$dir/admin.log" 2>&1; then
          scale_ops=$((scale_ops + 1))
          wait "${pid[s2]}" 2>/dev/null || true
          unset 'pid[s2]'
        else
          log "FAILED: scale-in: $(tail -2 "$dir/admin.log" | tr '\n' ' ')"
          failures=$((failures + 1))
        fi
      else
        log "FAILED: scale-out: $(tail -2 "$dir/admin.log" | tr '\n' ' ')"
        failures=$((failures + 1))
        kill -KILL "${pid[s2]}" 2>/dev/null || true
      fi
      wait_ready 60 || true
      ;;
  esac
done

log "stopping the drivers; w0 checks the parameters"
touch "$dir/stop"
code=0
if wait "${pid[w0]}"; then :; else code=$?; fi
wait "${pid[w1]}" 2>/dev/null || true
check=$(grep "soak check:" "$dir/w0.log" | tail -1 || true)
adm stop >/dev/null 2>&1 || true
for p in "${pid[@]}"; do
  for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
done
lost=$(sed -n 's/.*lost updates \([0-9]*\).*/\1/p' <<<"$check")
echo "== soak summary ($minutes min, dir $dir)"
echo "operations: $(acked) pushes acknowledged ($(cat "$dir"/w*.sent | wc -c) sent), $scale_ops scale operations"
echo "faults injected: $faults ($worker_kills worker SIGKILLs, $server_kills server SIGKILLs of which $host_losses host losses, $scheduler_restarts scheduler SIGKILL+restart; replicas $replicas)"
echo "recoveries: $recoveries of $faults; other failures: $failures"
echo "${check:-soak check: no result (w0 exit $code)}"
echo "lost updates = ${lost:-unknown}"
if [ "$server_kills" -lt 1 ] || [ "$scheduler_restarts" -ne 1 ] || { [ "$replicas" -ge 2 ] && [ "$host_losses" -lt 1 ]; }; then
  echo "missing fault: $server_kills server SIGKILLs (need >= 1), $host_losses host losses (need >= 1 with replicas >= 2), $scheduler_restarts scheduler restarts (need 1)"
  failures=$((failures + 1))
fi
if [ "$code" -ne 0 ] || [ "${lost:-x}" != 0 ] || [ "$recoveries" -ne "$faults" ] || [ "$failures" -ne 0 ]; then
  echo "SOAK FAILED (logs kept in $dir)"
  exit 1
fi
rm -rf "$dir"
echo "SOAK PASSED"
