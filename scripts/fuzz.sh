#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/*_fuzz.cc) with clang in build-fuzz and runs
# each for N seconds (default 60) from the checked-in seed corpus. Fails on any crash,
# sanitizer report, leak, timeout (10 s per input) or RSS over 2 GiB. See docs/fuzzing.md.
# Usage: scripts/fuzz.sh [seconds] [target...]   (FUZZ_BUILD_DIR, JOBS, FUZZ_JOBS may be set)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-60}
shift || true
dir=${FUZZ_BUILD_DIR:-$root/build-fuzz}
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for src in "$root"/tests/fuzz/*_fuzz.cc; do targets+=("$(basename "$src" .cc)"); done
fi

"$root/scripts/setup.sh"
cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPSCORE_FUZZ=ON \
  -DPSCORE_BUILD_TESTS=OFF -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
ninja -C "$dir" -j "${JOBS:-$(nproc)}" "${targets[@]}"

# Longest input worth trying per target: the formats are small; longer inputs only slow
# the search down.
max_len() {
  case "$1" in
    frame_decoder_fuzz) echo 70000 ;;  # reaches the direct payload read (>= 16 KiB)
    blocking_link_fuzz) echo 70000 ;;  # the same, on PullSync's direct link
    tls_frame_fuzz) echo 70000 ;;      # frames through TLS, up to the direct payload read
    http_request_fuzz) echo 8192 ;;    # over the fuzz server's 2 KiB header limit
    *) echo 4096 ;;
  esac
}

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT
# Each libFuzzer process uses one core: FUZZ_JOBS targets run side by side (default: one
# per core), each for the full time. Reports are printed in target order once all are done.
run_one() {
  local t=$1 seeds="$root/tests/fuzz/corpus/$1" rc=0
  # The checked-in seeds stay untouched: new inputs go to a scratch corpus.
  mkdir -p "$work/$t" "$work/artifacts-$t"
  [ -d "$seeds" ] || seeds=""
  "$dir/$t" -max_total_time="$secs" -max_len="$(max_len "$t")" -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$work/artifacts-$t/" "$work/$t" $seeds \
    >"$work/$t.log" 2>&1 || rc=$?
  echo "$rc" >"$work/$t.rc"
}
slots=${FUZZ_JOBS:-$(nproc)}
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$slots" ]; do wait -n || true; done
  echo "== $t: ${secs}s, -max_len=$(max_len "$t")"
  run_one "$t" &
  pids+=($!)
done
wait
failed=()
for t in "${targets[@]}"; do
  if [ "$(cat "$work/$t.rc" 2>/dev/null)" = 0 ]; then
    echo "$t: $(grep -aE "^stat::number_of_executed_units|^stat::peak_rss_mb" "$work/$t.log" | tr '\n' ' ')corpus: $(ls "$work/$t" | wc -l) inputs"
  else
    echo "!! $t failed; log tail:"
    tail -60 "$work/$t.log" || true
    mkdir -p "$dir/artifacts"
    cp "$work/artifacts-$t"/* "$dir/artifacts/" 2>/dev/null || true
    echo "!! reproducer(s) copied to $dir/artifacts/ (run: $dir/$t <file>)"
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]}"
  exit 1
fi
echo "fuzz: all ${#targets[@]} targets ran ${secs}s without a finding"
