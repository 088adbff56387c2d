#!/usr/bin/env bash
# Hangs on a real GPU: a PyTorch job of two processes sharing GPU 0 whose second rank stops
# (SIGSTOP), exits, or blocks in a read, under gaptrace run --hang-after 10s. Under gloo (no NCCL
# call: no collective is seen) the missing rank is named through the socket between the ranks.
# All cases take about 4 minutes (each run's torch start-up, 100 steps, the 20 s look; the exit case
# waits for the process group's 60 s timeout under NCCL).
#
#   test/gpu/hang.sh OUTDIR [CASE...]    cases: stop exit sleep (default: all), each with NCCL,
#                                        and with gloo where NCCL refuses two ranks on one GPU
#
# Per case OUTDIR/CASE/ receives gaptrace's log, the gaps file (hang records), spans, summary,
# a `gaptrace dump` taken during the hang, the Prometheus metrics scraped during it, and the
# job's own truth (when rank 1 stopped); OUTDIR/results.txt gets, per case, the hang records
# found (reason, detection delay after the call began, missing ranks and their state, the GPU's
# SM activity) and whether each expectation held.
set -uo pipefail
OUTDIR=${1:?usage: test/gpu/hang.sh OUTDIR [stop exit sleep]}
shift
CASES=${*:-stop exit sleep}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
G=${GAPTRACE:-$ROOT/bin/gaptrace}
PY=${PYTHON:-python3}
HANG_AFTER=${HANG_AFTER:-10s}
mkdir -p "$OUTDIR"
RES=$OUTDIR/results.txt
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
[ -d /sys/kernel/tracing/events ] || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
say() { echo "$*" | tee -a "$RES"; }

# rank1 DIR: the pid of rank 1 once its meta record is written (empty after 120 s).
rank1() {
  for _ in $(seq 1 240); do
    pid=$("$PY" -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r["type"] == "meta": print(r["pid"]); break' "$1/rank1.jsonl" 2>/dev/null)
    [ -n "$pid" ] && { echo "$pid"; return; }
    sleep 0.5
  done
}

# summarize DIR CASE: the hang records and the checks, into results.txt.
summarize() {
  "$PY" - "$1" "$2" "$3" <<'EOF' | tee -a "$RES"
import json, sys, os
d, case, backend = sys.argv[1], sys.argv[2], sys.argv[3]
recs = [json.loads(l) for l in open(os.path.join(d, "gaps.jsonl")) if '"kind":"hang"' in l]
meta = {}
for r in (0, 1):
    p = os.path.join(d, "rank%d.jsonl" % r)
    if os.path.exists(p):
        for l in open(p):
            x = json.loads(l)
            if x["type"] == "meta":
                meta[r] = x["pid"]
print("  hang records: %d (%d ended)" % (len(recs), sum(r["status"] == "ended" for r in recs)))
for r in recs:
    if r["status"] != "ongoing":
        continue
    print("  - %s" % r["reason"])
    print("    detected %.2f s after the call began; stacks of %d processes, %d threads with Python frames" % (
        (r["detected_unix_nano"] - r["start_unix_nano"]) / 1e9, len(r.get("stacks", [])),
        sum(1 for s in r.get("stacks", []) for t in s["threads"] if t.get("python"))))
    for m in r.get("missing", []):
        print("    missing rank %d pid %d state %s %s %s" % (m["rank"], m["pid"], m.get("state"), m.get("file", ""), m.get("exit", "")))
    if r.get("gpu"):
        print("    gpu %d: sm_activity %.3f utilization %.3f" % (r["gpu"]["device"], r["gpu"]["sm_activity"], r["gpu"]["utilization"]))
want = {"stop": "stopped", "exit": "exited", "sleep": "sleeping"}[case]
named = [r for r in recs if r.get("pid") == meta.get(0) and
         any(m.get("pid") == meta.get(1) and m.get("state") == want for m in r.get("missing", []))]
rank0 = [r for r in recs if r.get("pid") == meta.get(0)]
if backend == "gloo" and case == "exit" and not rank0:
    # rank 1's exit closes its sockets: gloo fails rank 0's all-reduce at once, nothing hangs.
    print("  CHECK rank 0 not hung: gloo failed its all-reduce on rank 1's closed connection: PASS")
else:
    print("  CHECK rank 0 (pid %s) reported waiting on rank 1 (pid %s) %s: %s" % (meta.get(0), meta.get(1), want, "PASS" if named else "FAIL"))
if backend == "gloo" and named:
    w = named[0]["waiting"]
    print("  CHECK rank 1 named without a collective (%s%s%s): %s" % (w["call"], " on " + w["file"] if w.get("file") else "",
          " to " + w["peer_addr"] if w.get("peer_addr") else "", "PASS" if not w.get("collective") else "FAIL"))
dump = os.path.join(d, "dump.json")
try:
    dj = json.load(open(dump))
    print("  CHECK gaptrace dump: %d in flight, %d processes: PASS" % (len(dj["in_flight"]), len(dj["processes"])))
except Exception as e:
    print("  CHECK gaptrace dump: FAIL (%s)" % e)
m = open(os.path.join(d, "metrics.txt")).read() if os.path.exists(os.path.join(d, "metrics.txt")) else ""
print("  CHECK gaptrace_hangs_total in metrics: %s" % ("PASS" if "gaptrace_hangs_total" in m else "FAIL"))
s = open(os.path.join(d, "spans.jsonl")).read() if os.path.exists(os.path.join(d, "spans.jsonl")) else ""
print("  CHECK gpu.hang span: %s" % ("PASS" if '"gpu.hang"' in s else "FAIL"))
EOF
}

# one CASE BACKEND
one() {
  local case=$1 backend=$2 d=$OUTDIR/$1-$2
  rm -rf "$d"; mkdir -p "$d"
  say ""; say "=== $case backend=$backend ($(date -u +%FT%TZ))"
  GAPTRACE_RUN_DIR=$d/run "$G" run --live off --hang-after "$HANG_AFTER" --gaps-out "$d/gaps.jsonl" \
    --spans-out "$d/spans.jsonl" --summary-json "$d/summary.json" --prometheus 127.0.0.1:9477 -- \
    "$PY" "$HERE/hang_job.py" --backend "$backend" --mode "$case" --truth-dir "$d" --timeout-s 60 --sleep-s 30 \
    >"$d/stdout.txt" 2>"$d/gaptrace.log" &
  local gt=$!
  local r1; r1=$(rank1 "$d")
  if [ -z "$r1" ]; then say "  rank 1 never started (see $d/gaptrace.log)"; kill -INT $gt; wait $gt; return 1; fi
  # Hang after 10 s, reported within a tick: look at 20 s after rank 1 stopped.
  for _ in $(seq 1 120); do grep -q "\"type\": \"$case\"" "$d/rank1.jsonl" 2>/dev/null && break; sleep 0.5; done
  sleep 20
  GAPTRACE_RUN_DIR=$d/run "$G" dump --out "$d/dump.json" 2>>"$d/gaptrace.log"
  curl -s http://127.0.0.1:9477/metrics >"$d/metrics.txt" || true
  [ "$case" = stop ] && { sleep 10; kill -CONT "$r1" 2>/dev/null; }
  # exit: rank 0 waits until the process group's timeout (60 s) fails it.
  for _ in $(seq 1 240); do kill -0 $gt 2>/dev/null || break; sleep 0.5; done
  kill -INT $gt 2>/dev/null; wait $gt; say "  gaptrace exit $?"
  grep -h 'msg="hang' "$d/gaptrace.log" | cut -c1-400 >>"$RES"
  grep -h "hangs:" "$d/stdout.txt" >>"$RES"
  summarize "$d" "$case" "$backend"
}

T0=$(date +%s)
for c in $CASES; do
  one "$c" nccl || true
  if grep -qi "duplicate GPU\|invalid usage" "$OUTDIR/$c-nccl/gaptrace.log" "$OUTDIR/$c-nccl/stdout.txt" 2>/dev/null; then
    say "  NCCL refused two ranks on one GPU: again with gloo"
    one "$c" gloo || true
  fi
done
say ""; say "all cases: $(( $(date +%s) - T0 )) s"
