#!/usr/bin/env bash
# The demo job under a real Slurm on this machine: starts a private munged, slurmctld and
# slurmd (localhost only; config, state, sockets and logs in a temp dir), submits
# deploy/slurm/pscore.sbatch (scheduler, 2 servers, 2 pscore-train workers as srun steps),
# scales it out with deploy/slurm/pscore-join.sbatch (a second allocation: pscore-admin
# scale-out, then a third server), and asserts the job's outcome: exit code 0 in Slurm's
# record, each trainer's final line, 3 servers at the end. Every daemon is stopped by pid;
# every wait has a deadline. Exit 0 on success. Needs root and slurm-wlm + munge
# (scripts/setup.sh installs them).
#   scripts/slurm_test.sh            (binaries from $BUILD_DIR, default build/)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${BUILD_DIR:-$root/build}" && pwd)
for b in slurmctld slurmd sbatch srun scontrol sinfo munged; do
  command -v "$b" >/dev/null || { echo "slurm_test: $b not found (apt-get install slurm-wlm munge)" >&2; exit 1; }
done
for b in pscore-node pscore-train pscore-admin; do
  [ -x "$build/$b" ] || { echo "slurm_test: $build/$b not built" >&2; exit 1; }
done
T=$(mktemp -d /tmp/pscore-slurm.XXXXXX)
chmod 755 "$T"
pids=()
cleanup() {
  local rc=$?
  # Jobs first (their steps are slurmd's children), then the daemons, each by its pid.
  if [ -f "$T/slurm.conf" ]; then SLURM_CONF=$T/slurm.conf timeout 10 scancel --full --quiet --user=root 2>/dev/null || true; fi
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 1 50); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive -eq 0 ] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  if [ $rc -ne 0 ]; then
    echo "slurm_test: FAILED (rc $rc); logs:" >&2
    for f in "$T"/*.log "$T"/job/*.out; do [ -f "$f" ] && { echo "---- $f" >&2; tail -n 30 "$f" >&2; }; done
  fi
  rm -rf "$T"
  exit $rc
}
trap cleanup EXIT

# wait_for SECONDS DESCRIPTION CMD...: runs CMD until it succeeds, or fails at the deadline.
wait_for() {
  local deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || { echo "slurm_test: timed out waiting for $what" >&2; return 1; }
    sleep 0.2
  done
}
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# munge with a private key, socket, pid and log (as root it needs --force).
dd if=/dev/urandom of="$T/munge.key" bs=1024 count=1 status=none
chmod 400 "$T/munge.key"
munged --force --key-file="$T/munge.key" --socket="$T/munge.sock" --pid-file="$T/munged.pid" \
  --log-file="$T/munged.log" --seed-file="$T/munge.seed" --foreground &
pids+=($!)
wait_for 10 "munged's socket" test -S "$T/munge.sock"

ctld_port=$(free_port)
d_port=$(free_port)
mkdir -p "$T/ctld" "$T/spool" "$T/job"
cpus=16  # more than the machine has: SlurmdParameters=config_overrides lets slurmd run them
cat >"$T/slurm.conf" <<CONF
ClusterName=pscoretest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$T/munge.sock
CredType=cred/munge
StateSaveLocation=$T/ctld
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=600
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=pscore Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$T/slurm.conf
slurmctld -D -i -f "$SLURM_CONF" >>"$T/slurmctld.log" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" -N localhost >>"$T/slurmd.log" 2>&1 &
pids+=($!)
# Each check captures the output first: with pipefail, `cmd | grep -q` fails when grep's early
# exit kills cmd with SIGPIPE.
node_idle() { local s; s=$(sinfo -h -N -o %T) && [[ $s == *idle* || $s == *mixed* ]]; }
wait_for 60 "the node to be idle (slurmctld + slurmd)" node_idle
echo "== slurm up: $(sinfo -h -o '%P %D %T %C')"

# The job: 1 scheduler, 2 servers, 2 trainers. Enough steps that the scale-out lands mid-run.
export PSCORE_BIN=$build PSCORE_SERVER_NUM=2 PSCORE_WORKER_NUM=2
export PSCORE_NODE_ARGS="--heartbeat_interval_ms=200 --heartbeat_timeout_ms=3000"
export PSCORE_TRAIN_ARGS="--steps=${PSCORE_TEST_STEPS:-3000}"
job=$(cd "$T/job" && sbatch --parsable --ntasks=5 --chdir="$T/job" "$root/deploy/slurm/pscore.sbatch")
echo "== submitted job $job"
host=localhost
port=$((20000 + job % 20000))
sched_ip=127.0.0.1
admin_status() { "$build/pscore-admin" --scheduler_host=$sched_ip --scheduler_port=$port --timeout_ms=1000 status 2>/dev/null; }
cluster_ready() { local s; s=$(admin_status) && [[ $s == *CLUSTER_READY* ]]; }
wait_for 90 "job $job's cluster to be READY" cluster_ready
echo "== job $job READY; scaling out to 3 servers from a second allocation"
join=$(cd "$T/job" && PSCORE_SCHEDULER_HOST=$host PSCORE_SCHEDULER_PORT=$port PSCORE_JOIN_ROLE=server \
  PSCORE_JOIN_TOTAL=3 sbatch --parsable --ntasks=1 --chdir="$T/job" "$root/deploy/slurm/pscore-join.sbatch")
echo "== submitted join job $join"
three_servers() { local s; s=$(admin_status) && [[ $s == *CLUSTER_READY*"servers 3/3"* ]]; }
wait_for 90 "3 servers in job $job" three_servers
admin_status || true

job_done() { local s; s=$(scontrol show job "$1" 2>/dev/null) && [[ $s =~ JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) ]]; }
wait_for 240 "job $job to end" job_done "$job"
wait_for 60 "join job $join to end" job_done "$join"
state=$(scontrol show job "$job" | grep -oE 'JobState=[A-Z_]+|ExitCode=[0-9:]+' | tr '\n' ' ' || true)
jstate=$(scontrol show job "$join" | grep -oE 'JobState=[A-Z_]+|ExitCode=[0-9:]+' | tr '\n' ' ' || true)
echo "== job $job: $state"
echo "== join job $join: $jstate"
out=$T/job/pscore-$job.out
grep -v " step " "$out" | tail -n 40 || true
echo "---- join job output"
cat "$T/job/pscore-join-$join.out"
fail=0
record=$(scontrol show job "$job")
jrecord=$(scontrol show job "$join")
[[ $record == *JobState=COMPLETED* ]] || { echo "slurm_test: job $job did not complete" >&2; fail=1; }
[[ $record =~ (^|[[:space:]])ExitCode=0:0 ]] || { echo "slurm_test: job $job's exit code is not 0" >&2; fail=1; }
[[ $jrecord =~ (^|[[:space:]])ExitCode=0:0 ]] || { echo "slurm_test: join job's exit code is not 0" >&2; fail=1; }
# srun --label: "T: worker R final loss L acc A | ..." from each of the two trainers.
finals=$(grep -cE '^ *[0-9]+: worker [0-9]+ final loss' "$out" || true)
[ "$finals" = 2 ] || { echo "slurm_test: $finals trainers printed their final line, not 2" >&2; fail=1; }
grep -q "launcher slurm: role=server task=0 node_id=server-$join-0" "$T/job/pscore-join-$join.out" ||
  { echo "slurm_test: the joined server's detection line is missing" >&2; fail=1; }
grep -q "workers exited 0" "$out" || fail=1
[ $fail -eq 0 ] || exit 1
echo "== slurm test passed: job $job (2 servers + 1 joined from job $join, 2 trainers) finished, exit 0"
