#!/usr/bin/env bash
# Soak: gaptrace traces simtrain at its highest launch rate (1 µs kernels,
# no launch gap, no stall) for SOAK (default 1h), printing gaptrace's
# resident memory and CPU every interval (a tenth of the run, at most a
# minute apart) and at the end a table of every sample and one of RSS and
# CPU per 10 minutes (the last interval may be shorter). A leak shows as
# RSS that keeps growing after the first interval; a slow path as CPU that
# climbs.
#
# Usage: tools/soak.sh            (make soak builds and sets the paths)
# Env:   SOAK=10m|1h|90s          run length (s, m or h; combined like 1h30m)
#        GAPTRACE_BIN, GAPTRACE_SIMGPU   the binary and the simulated GPU
#        SOAK_DIR                  where outputs and gaptrace's log go
#                                  (default: a new directory under /tmp)
# It stops by itself: after SOAK it interrupts gaptrace (which forwards the
# interrupt to the trainer, detaches and prints its summary); if gaptrace
# has not exited a minute later its process group is killed and the soak
# fails.
set -euo pipefail

die() { echo "soak: $*" >&2; exit 2; }

# seconds parses 1h30m, 10m, 90s into seconds.
seconds() {
	local s=$1 total=0 n unit
	[[ $s =~ ^([0-9]+[smh])+$ ]] || die "SOAK=$1: want a duration like 90s, 10m, 1h or 1h30m"
	while [[ $s =~ ^([0-9]+)([smh])(.*)$ ]]; do
		n=$((10#${BASH_REMATCH[1]})) unit=${BASH_REMATCH[2]} s=${BASH_REMATCH[3]}
		case $unit in s) total=$((total + n)) ;; m) total=$((total + 60 * n)) ;; h) total=$((total + 3600 * n)) ;; esac
	done
	((total > 0)) || die "SOAK=$1: the duration must be positive"
	echo "$total"
}

dur=$(seconds "${SOAK:-1h}")
bin=${GAPTRACE_BIN:-bin/gaptrace}
sim=${GAPTRACE_SIMGPU:-build/simgpu}
[[ -x $bin ]] || die "no gaptrace binary at $bin: run make build (or make soak) or set GAPTRACE_BIN"
[[ -x $sim/simtrain ]] || die "no simtrain in $sim: run make simgpu (or make soak) or set GAPTRACE_SIMGPU"
((EUID == 0)) || die "gaptrace loads BPF programs: run the soak as root"

# A tenth of the run, at most a minute, at least a second.
interval=$((dur / 10))
((interval <= 60)) || interval=60
((interval >= 1)) || interval=1

out=${SOAK_DIR:-$(mktemp -d /tmp/gaptrace-soak.XXXXXX)}
mkdir -p "$out/simgpu"
hz=$(getconf CLK_TCK)
log=$out/gaptrace.log

# Job control: gaptrace (and the trainer under it) get a process group of
# their own, which the end of the soak can kill as one.
set -m
SIMGPU_DIR=$out/simgpu "$bin" run --live off \
	--nvml-lib "$sim/libnvidia-ml.so.1" \
	--gaps-out "$out/gaps.jsonl" --summary-json "$out/summary.json" \
	--spans-out "$out/spans.jsonl" --spans-max-size 64M --spans-keep 1 \
	-- "$sim/simtrain" --steps 1099511627776 --kernels-per-step 100 --kernel-us 1 --launch-gap-us 0 --quiet \
	>"$log" 2>&1 &
pid=$!
set +m
cleanup() { kill -KILL -- "-$pid" 2>/dev/null || true; }
trap cleanup EXIT
trap 'echo "soak: interrupted" >&2; exit 130' INT TERM

# cpu_ticks is gaptrace's user+system time in clock ticks; rss_kib its
# resident set. Fields of /proc/PID/stat are counted after the command
# name, which may hold spaces.
cpu_ticks() { local s; s=$(<"/proc/$pid/stat") && s=${s##*) } && set -- $s && echo $((${12} + ${13})); }
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status"; }

printf 'soak: gaptrace pid %d on simtrain (100 × 1 µs kernels a step, no gap) for %ds, a sample every %ds\n' "$pid" "$dur" "$interval"
printf 'soak: outputs and gaptrace log in %s\n' "$out"
# per10m turns sample rows (elapsed "608s", RSS MiB, CPU %, CPU s so far)
# into one row per 10 minutes of the run: the samples up to 600 s, up to
# 1200 s, ...; its CPU is the CPU seconds over its wall time, from the
# previous interval's last sample (for the first, from the start, at CPU
# seconds $1: what loading took is not counted).
per10m() {
	awk -v prev_cpu="$1" '
		function flush() {
			if (n == 0) return
			printf "%8s %10s %10.1f %10.1f %8.1f %10.1f\n", (k * 10) "-" ((k + 1) * 10) "m", end_el "s", end_rss, max_rss, \
				(end_el > prev_el ? 100 * (end_cpu - prev_cpu) / (end_el - prev_el) : 0), end_cpu
			prev_el = end_el; prev_cpu = end_cpu; n = 0
		}
		BEGIN { printf "%8s %10s %10s %10s %8s %10s\n", "interval", "to", "rss_MiB", "rss_max", "cpu_%", "cpu_s"; k = -1 }
		{
			el = $1; sub(/s$/, "", el); el += 0
			i = el > 0 ? int((el - 1) / 600) : 0
			if (i != k) { flush(); k = i; max_rss = 0 }
			n++; end_el = el; end_rss = $2; end_cpu = $4
			if ($2 > max_rss) max_rss = $2
		}
		END { flush() }'
}

printf '%8s %10s %8s %10s\n' elapsed rss_MiB cpu_% cpu_s
start=$(date +%s)
prev_t=$start
prev_c=$(cpu_ticks) || die "gaptrace exited at once; its log:$(echo; cat "$log")"
start_c=$prev_c
rows=()
while :; do
	now=$(date +%s)
	left=$((start + dur - now))
	((left > 0)) || break
	sleep $((left < interval ? left : interval))
	kill -0 "$pid" 2>/dev/null || die "gaptrace exited during the soak; its log: $log$(echo; tail -20 "$log")"
	t=$(date +%s)
	c=$(cpu_ticks)
	r=$(rss_kib)
	el=$((t - start))
	pct=$(awk -v dc=$((c - prev_c)) -v dt=$((t - prev_t)) -v hz="$hz" 'BEGIN { printf "%.1f", (dt > 0 ? 100 * dc / hz / dt : 0) }')
	row=$(printf '%8s %10.1f %8s %10.1f' "${el}s" "$(awk -v r="$r" 'BEGIN { print r / 1024 }')" "$pct" "$(awk -v c="$c" -v hz="$hz" 'BEGIN { print c / hz }')")
	echo "$row"
	rows+=("$row")
	prev_t=$t prev_c=$c
done

# The end: SIGINT to gaptrace alone, as `kill -INT` from an operator.
kill -INT "$pid"
for _ in $(seq 600); do
	kill -0 "$pid" 2>/dev/null || break
	sleep 0.1
done
if kill -0 "$pid" 2>/dev/null; then
	echo "soak: gaptrace still running a minute after SIGINT: killed; its log: $log" >&2
	exit 1
fi
code=0
wait "$pid" || code=$?
trap - EXIT

echo
echo "soak: final table (gaptrace, $dur s on simtrain at its highest launch rate)"
printf '%8s %10s %8s %10s\n' elapsed rss_MiB cpu_% cpu_s
printf '%s\n' "${rows[@]}"
printf '%s\n' "${rows[@]}" | awk '
	{ rss[NR] = $2; cpu += $3 }
	END {
		if (NR == 0) exit
		lo = hi = rss[1]
		for (i = 1; i <= NR; i++) { if (rss[i] < lo) lo = rss[i]; if (rss[i] > hi) hi = rss[i] }
		printf "rss MiB: first %.1f, last %.1f, min %.1f, max %.1f (growth after the first sample %+.1f)\n", rss[1], rss[NR], lo, hi, rss[NR] - rss[1]
		printf "cpu: %.1f%% of one core on average over %d samples\n", cpu / NR, NR
	}'
echo
echo "soak: per 10 minutes (RSS at the end of each and its peak in it, CPU over it)"
printf '%s\n' "${rows[@]}" | per10m "$(awk -v c="$start_c" -v hz="$hz" 'BEGIN { print c / hz }')"
grep -E 'steps|lost|dropped' "$log" | tail -5 || true
echo "gaptrace exit status $code; summary: $out/summary.json"
exit "$code"
