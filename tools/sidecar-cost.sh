#!/bin/sh
# sidecar-cost.sh PROBES KERNELS [SECONDS]: gaptrace's own CPU and peak RSS
# while it traces simtrain (1 µs kernels, a 19 µs gap between launches:
# at most 50k launches/s). CPU is read from /proc/PID/stat between 5 s after
# start and SECONDS (default 25), so loading the probes is left out.
# Prints one line: probes, kernels a step, launches/s, CPU % of a core, peak RSS MiB.
# Needs bin/gaptrace and build/simgpu (make build simgpu); run as root.
# GAPTRACE=BIN measures another binary (compare two interleaved: the machine's
# load moves the figures), PPROF=FILE writes FILE.cpu/.heap, GTFLAGS adds
# flags, KEEP=1 keeps the run's folder (its path goes to stderr).
set -eu
probes=$1 kernels=$2 secs=${3:-25}
root=$(cd "$(dirname "$0")/.." && pwd)
sim=$root/build/simgpu
tmp=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT; echo "$tmp" >&2
export SIMGPU_DIR=$tmp
GAPTRACE_PPROF=${PPROF:-} "${GAPTRACE:-$root/bin/gaptrace}" run --live off ${GTFLAGS:-} --probes "$probes" --nvml-lib "$sim/libnvidia-ml.so.1" \
	--spans-out "$tmp/spans.jsonl" -- "$sim/simtrain" --steps 100000000 --kernels-per-step "$kernels" \
	--kernel-us 1 --launch-gap-us 19 >"$tmp/out" 2>"$tmp/err" &
gt=$!
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
sleep 5
t0=$(date +%s.%N) c0=$(ticks $gt)
sleep $((secs - 5))
t1=$(date +%s.%N) c1=$(ticks $gt)
rss=$(awk '/VmHWM/{print $2}' "/proc/$gt/status")
st=$(pgrep -P $gt simtrain || true)
[ -n "$st" ] && kill -INT "$st"
wait $gt || true
hz=$(getconf CLK_TCK)
rate=$(grep -o "[0-9.]* steps/s" "$tmp/out" | tail -1 | awk -v k="$kernels" '{printf "%.0f", $1*k}')
echo "$probes $kernels launches/s=$rate cpu%=$(echo "$c0 $c1 $t0 $t1 $hz" | awk '{printf "%.1f", 100*($2-$1)/$5/($4-$3)}') rssMiB=$((rss / 1024))"
