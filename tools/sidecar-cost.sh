#!/bin/sh
# sidecar-cost.sh JOB PROBES [SECONDS]: gaptrace's own CPU and peak RSS while
# it traces a simtrain job. JOB is one of
#   launch[:K]  launch-bound: K (default 300) 1 µs kernels a step, a 19 µs
#               gap between launches (at most 50k launches/s)
#   loader[:N]  N (default 2) data-loader worker processes serving a batch
#               every step (cold reads and CPU work), 8 kernels of 200 µs a
#               step
#   ranks8      8 processes: 8 ranks on 8 simulated devices, an all-reduce
#               every step, 9 kernels of 1.5 ms
# CPU is read from /proc/PID/stat, and the records read by kind from the
# Prometheus endpoint (gaptrace_sidecar_events_total), between 5 s after
# start and SECONDS (default 25), so loading the probes and stopping the job
# are left out.
# Prints one line: job, probes, launches/s, CPU % of a core, CPU seconds in
# the window, peak RSS MiB, records in the window and by kind, and the
# sidecar's µs of CPU per record.
# Needs bin/gaptrace and build/simgpu (make build simgpu); run as root.
# GAPTRACE=BIN measures another binary (compare two interleaved: the machine's
# load moves the figures), PPROF=FILE writes FILE.cpu/.heap, GTFLAGS adds
# flags, KEEP=1 keeps the run's folder (its path goes to stderr).
set -eu
job=$1 probes=$2 secs=${3:-25}
root=$(cd "$(dirname "$0")/.." && pwd)
sim=$root/build/simgpu
tmp=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT; echo "$tmp" >&2
export SIMGPU_DIR=$tmp
kernels=8
case $job in
launch | launch:*)
	kernels=${job#launch}; kernels=${kernels#:}; kernels=${kernels:-300}
	set -- "$sim/simtrain" --steps 100000000 --kernels-per-step "$kernels" --kernel-us 1 --launch-gap-us 19 --workers 0 ;;
loader | loader:*)
	workers=${job#loader}; workers=${workers#:}
	set -- "$sim/simtrain" --steps 100000000 --workers "${workers:-2}" --data-dir "$tmp" \
		--stall loader.wait.io:every=2:ms=4 --stall loader.wait.cpu:every=3:ms=4 ;;
ranks8)
	kernels=9
	export SIMGPU_DEVICES=8
	cmd=""
	for r in 0 1 2 3 4 5 6 7; do
		cmd="$cmd $sim/simtrain --rank $r --nranks 8 --device $r --steps 100000000 --collectives 1 \
--kernels-per-step 9 --kernel-us 1500 --launch-gap-us 20 --comm-id cost-$$ --workers 0 --quiet &"
	done
	set -- sh -c "$cmd wait" ;;
*)
	echo "sidecar-cost.sh: unknown job $job (launch[:K], loader[:N], ranks8)" >&2
	exit 2 ;;
esac
port=$((20000 + $$ % 20000))
GAPTRACE_PPROF=${PPROF:-} "${GAPTRACE:-$root/bin/gaptrace}" run --live off ${GTFLAGS:-} --probes "$probes" \
	--prometheus "127.0.0.1:$port" \
	--nvml-lib "$sim/libnvidia-ml.so.1" --spans-out "$tmp/spans.jsonl" --summary-json "$tmp/summary.json" \
	-- "$@" >"$tmp/out" 2>"$tmp/err" &
gt=$!
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
# kind=count per line, from gaptrace_sidecar_events_total.
records() {
	curl -s "http://127.0.0.1:$port/metrics" | awk '/^gaptrace_sidecar_events_total/ {
		match($0, /kind="[^"]*"/); print substr($0, RSTART + 6, RLENGTH - 7) "=" $NF }' | sort
}
sleep 5
t0=$(date +%s.%N) c0=$(ticks $gt) r0=$(records)
sleep $((secs - 5))
t1=$(date +%s.%N) c1=$(ticks $gt) r1=$(records)
rss=$(awk '/VmHWM/{print $2}' "/proc/$gt/status")
# The job's processes: gaptrace's children and theirs (sh's ranks).
kids=$(pgrep -P $gt || true)
jobpids="$kids $(for k in $kids; do pgrep -P "$k" || true; done)"
for p in $jobpids; do
	[ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$sim/simtrain" ] && kill -INT "$p" 2>/dev/null || true
done
# A rank stopped a step before its peers leaves them in the all-reduce.
n=0
while kill -0 $gt 2>/dev/null && [ $n -lt 20 ]; do sleep 0.5; n=$((n + 1)); done
kill -0 $gt 2>/dev/null && for p in $jobpids; do kill -KILL "$p" 2>/dev/null || true; done
wait $gt || true
hz=$(getconf CLK_TCK)
steps=$(grep -o "[0-9.]* steps/s" "$tmp/out" | tail -1 | awk '{print $1}')
rate=$(echo "${steps:-0}" | awk -v k="$kernels" '{printf "%.0f", $1*k}')
ev=$(printf '%s\n' "$r0" | awk -F= -v r1="$r1" 'BEGIN { n = split(r1, l, "\n"); for (i = 1; i <= n; i++) { split(l[i], kv, "="); b[kv[1]] = kv[2] } }
	NF == 2 { a[$1] = $2 } END { for (k in b) { d = b[k] - a[k]; if (d > 0) { t += d; s = s " " k "=" d } } printf "%d%s", t, s }')
cpu_s=$(echo "$c0 $c1 $hz" | awk '{printf "%.2f", ($2-$1)/$3}')
echo "$job $probes launches/s=$rate $(echo "$c0 $c1 $t0 $t1 $hz" | awk '{printf "cpu%%=%.1f", 100*($2-$1)/$5/($4-$3)}') cpu_s=$cpu_s rssMiB=$((rss / 1024)) us/record=$(echo "$cpu_s ${ev%% *}" | awk '{printf "%.1f", ($2 > 0 ? 1e6*$1/$2 : 0)}') records=$ev"
