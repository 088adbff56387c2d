#!/usr/bin/env bash
# Steps on a real GPU: PyTorch loops written the ways step counting finds hard (test/gpu/steps_job.py:
# eager, CUDA graph with a background saver thread, torch.compile, 4 micro-batches, an evaluation
# every 25 iterations, the loss read every 10th, per-tensor checkpoint copies, and 8 micro-batches
# an optimizer step with no sync in it, with and without torch.optim), each traced by
# `gaptrace run` under --probes full, auto and lite and by `gaptrace attach --pid` a few seconds
# into the run. The job writes its own optimizer steps; gaptrace's are its train.step spans.
#
#   test/gpu/steps.sh OUTDIR [JOB...]     (default: every job; about 8 minutes in all)
#
# STEPS_MODES picks the modes (default "full auto lite attach"), STEPS_SECONDS each run's length,
# STEPS_ATTACH_PROBES the probe set attach uses (default full; auto is what a user gets);
# STEPS_RECORD=1 adds --record (DIR/rec.gz, which `gaptrace replay` reproduces offline).
#
# OUTDIR/steps.tsv: one row per job and mode: job, mode, true steps, gaptrace steps, their ratio,
# and the step clock the summary names (source and site). OUTDIR/JOB-MODE/ keeps each run's
# outputs (log, spans, summary, the job's truth).
set -uo pipefail
OUTDIR=${1:?usage: test/gpu/steps.sh OUTDIR [eager graph compile accum eval logevery ckpt hfaccum hfmanual]}
shift
JOBS=${*:-eager graph compile accum eval logevery ckpt hfaccum hfmanual}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
G=${GAPTRACE:-$ROOT/bin/gaptrace}
PY=${PYTHON:-/opt/torch/.venv/bin/python3}
SECONDS_RUN=${STEPS_SECONDS:-8}
mkdir -p "$OUTDIR"
TSV=$OUTDIR/steps.tsv
printf 'job\tmode\ttrue_steps\tgaptrace_steps\tratio\tstep_clock\n' >"$TSV"
[ -d /sys/kernel/tracing/events ] || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$OUTDIR/inductor-cache}

outs() { # outs DIR: gaptrace's output flags
  echo --live off --spans-out "$1/spans.jsonl" --summary-json "$1/summary.json" --gaps-out "$1/gaps.jsonl"
  [ -n "${STEPS_RECORD:-}" ] && echo --record "$1/rec.gz"
}

# one JOB MODE: runs the job once under gaptrace.
one() {
  local job=$1 mode=$2 d=$OUTDIR/$1-$2
  rm -rf "$d" && mkdir -p "$d"
  local jobargs=(--job "$job" --seconds "$SECONDS_RUN" --truth "$d/truth.jsonl")
  if [ "$mode" = attach ]; then
    "$PY" "$HERE/steps_job.py" "${jobargs[@]}" >"$d/job.log" 2>&1 &
    local pid=$!
    # Attach once the job has run a few steps (its first records).
    for _ in $(seq 1 600); do
      [ "$(cat "$d/truth.jsonl" 2>/dev/null | grep -c "\"step\"")" -ge 20 ] && break
      kill -0 $pid 2>/dev/null || break
      sleep 0.1
    done
    timeout 300 "$G" attach --pid $pid --probes "${STEPS_ATTACH_PROBES:-full}" $(outs "$d") >"$d/gaptrace.log" 2>&1
    wait $pid
  else
    timeout 300 "$G" run --probes "$mode" $(outs "$d") -- "$PY" "$HERE/steps_job.py" "${jobargs[@]}" >"$d/gaptrace.log" 2>&1
  fi
  row "$job" "$mode" "$d" >>"$TSV"
}

# row JOB MODE DIR: the table row. True steps: the job's step records that began once gaptrace
# counted (its first step's start; all of them under run). Gaptrace's: its train.step spans (not
# fixed windows) ending after the first of those records began and by the end of the last.
row() {
  "$PY" - "$@" <<'EOF'
import json, os, sys
job, mode, d = sys.argv[1:4]
def lines(p):
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []
it = [r for r in lines(os.path.join(d, "truth.jsonl")) if r.get("type") == "step"]
spans = [s for s in lines(os.path.join(d, "spans.jsonl")) if s.get("name") == "train.step"]
steps = sorted((s["start_unix_nano"], s["end_unix_nano"]) for s in spans
               if not s.get("attributes", {}).get("gpu.step.window"))
clock = "-"
try:
    c = json.load(open(os.path.join(d, "summary.json"))).get("step_clock") or {}
    clock = "%s %s" % (c.get("source", "-"), c.get("site", ""))
except (OSError, ValueError):
    pass
if mode == "attach" and steps:
    it = [r for r in it if r["start_unix_nano"] >= steps[0][0]]
if not it:
    print("%s\t%s\t0\t%d\t-\t%s" % (job, mode, len(steps), clock))
    sys.exit()
lo, hi = it[0]["start_unix_nano"], it[-1]["end_unix_nano"]
n = sum(1 for s, e in steps if lo < e <= hi + 2_000_000)
print("%s\t%s\t%d\t%d\t%.3f\t%s" % (job, mode, len(it), n, n / len(it), clock.strip()))
EOF
}

for job in $JOBS; do
  # The four modes of a job run side by side: one GPU, separate processes.
  for mode in ${STEPS_MODES:-full auto lite attach}; do
    one "$job" "$mode" &
  done
  wait
done
if command -v column >/dev/null; then column -t -s "$(printf '\t')" "$TSV"; else cat "$TSV"; fi
