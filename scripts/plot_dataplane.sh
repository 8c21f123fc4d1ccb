#!/usr/bin/env bash
# Plots a data-plane benchmark run (the output of `scripts/bench.sh dataplane`) as a PNG:
# MB/s against value size (log-2 axis) for the baseline one-way rate and pscore's 1w1s
# push, zero-copy push, pull, pull-into and zero-copy pull. The baseline drawn is the median
# of the runs paired with the figures (baseline_oneway_<size>_paired) when the output has
# it, else the one run at the start. Usage: scripts/plot_dataplane.sh bench-output.txt out.png
set -euo pipefail
in=${1:?bench output}
out=${2:?png to write}
data=$(mktemp)
trap 'rm -f "$data"' EXIT
size_kib() {
  case "$1" in
    *KiB) echo "${1%KiB}" ;;
    *MiB) echo $(( ${1%MiB} * 1024 )) ;;
  esac
}
for size in 4KiB 64KiB 1MiB 16MiB 64MiB; do
  get() { awk -v n="$1" '$1 == n { print $2 }' "$in"; }
  opt() { get "$1" | grep . || echo NaN; }  # figures measured for sizes >= 1 MiB only
  base=$(get "baseline_oneway_${size}_paired" | grep . || get "baseline_oneway_$size")
  printf '%s %s %s %s %s %s %s\n' "$(size_kib $size)" "$base" "$(get push_1w1s_$size)" \
    "$(get pull_1w1s_$size)" "$(opt pullinto_1w1s_$size)" "$(opt zpush_1w1s_$size)" "$(opt zpull_1w1s_$size)" >> "$data"
done
gnuplot <<GP
set terminal pngcairo size 900,620 noenhanced
set output "$out"
set title "pscore data plane, 1 worker / 1 server, loopback (MB/s, higher is better)"
set logscale x 2
set xlabel "value size (KiB)"
set ylabel "MB/s"
set key below maxrows 3
set grid
plot "$data" using 1:2 with linespoints title "baseline one-way (blocking sockets)", \
     "$data" using 1:3 with linespoints title "Push", \
     "$data" using 1:4 with linespoints title "Pull", \
     "$data" using 1:5 with linespoints title "PullInto (read into the caller's memory)", \
     "$data" using 1:6 with linespoints title "ZPush (zero-copy)", \
     "$data" using 1:7 with linespoints title "ZPull (zero-copy)"
GP
echo "wrote $out"
