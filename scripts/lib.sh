# Shared shell helpers of the launch scripts (sourced, not run).
# Processes started with start_proc are recorded in $JOB_DIR/pids and stopped by pid.

# start_proc NAME CMD...: runs CMD in the background, logging to $JOB_DIR/NAME.log.
start_proc() {
  local name=$1
  shift
  "$@" >"$JOB_DIR/$name.log" 2>&1 &
  echo "$! $name" >>"$JOB_DIR/pids"
}

# wait_file PATH SECONDS: waits until PATH exists and is non-empty.
wait_file() {
  local path=$1 deadline=$((SECONDS + $2))
  while [ ! -s "$path" ]; do
    [ $SECONDS -lt $deadline ] || { echo "timed out waiting for $path" >&2; return 1; }
    sleep 0.05
  done
}

# stop_all: TERM then KILL every recorded process still running.
stop_all() {
  [ -f "$JOB_DIR/pids" ] || return 0
  local pid name
  while read -r pid name; do kill -TERM "$pid" 2>/dev/null || true; done <"$JOB_DIR/pids"
  for _ in $(seq 1 40); do
    local alive=0
    while read -r pid name; do kill -0 "$pid" 2>/dev/null && alive=1; done <"$JOB_DIR/pids"
    [ $alive -eq 0 ] && break
    sleep 0.05
  done
  while read -r pid name; do kill -KILL "$pid" 2>/dev/null || true; done <"$JOB_DIR/pids"
}
