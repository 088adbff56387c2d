#!/usr/bin/env bash
# Causes no CUDA call explains, on a real GPU: test/gpu/causes_job.py (a PyTorch loop whose stalls
# are Python on the main thread beside a checkpoint saver, a slow DataLoader worker, the GIL held
# by another thread, logs into a pipe with a slow reader, a subprocess, cold pages of a mapped file,
# gc.collect) under gaptrace in full, auto and lite.
#
#   test/gpu/causes.sh OUTDIR          (OUTDIR defaults to $OUT)
#
# OUTDIR/causes.tsv gets one row per stall kind and probe set: the share of the stalls' time given
# the right cause, the share of stalls whose gap names the stall's function, and the share of all
# idle labelled other (test/gpu/causes_eval.py). OUTDIR/MODE/ keeps each run's gaps, truth,
# summary and log. Takes about 4 minutes (STEPS, default 144, sets the length). CAUSES_RECORD=1
# adds --record (OUTDIR/MODE/rec.gz, for `gaptrace replay`).
set -uo pipefail
OUTDIR=${1:-${OUT:?usage: test/gpu/causes.sh OUTDIR}}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
G=${GAPTRACE:-$ROOT/bin/gaptrace}
PY=${PYTHON:-/opt/torch/.venv/bin/python3}
STEPS=${STEPS:-144}
export PYTHONUNBUFFERED=1
[ -d /sys/kernel/tracing/events ] || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
mkdir -p "$OUTDIR"
TSV=$OUTDIR/causes.tsv
printf 'kind\tmode\tstalls\tcause_share\tcode_named\tother_share\n' > "$TSV"
for mode in full auto lite; do
  d=$OUTDIR/$mode
  mkdir -p "$d"
  echo "=== $mode ($(date -u +%FT%TZ))"
  timeout 150 "$G" run --probes "$mode" --live off --gaps-out "$d/gaps.jsonl" --summary-json "$d/summary.json" \
    --spans-out "$d/spans.jsonl" ${CAUSES_RECORD:+--record "$d/rec.gz"} -- "$PY" "$HERE/causes_job.py" --steps "$STEPS" --truth "$d/truth.jsonl" \
    --data-dir "$d" > "$d/gaptrace.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || echo "gaptrace run ($mode) exited $rc: see $d/gaptrace.log"
  rm -f "$d/causes-ckpt.pt" "$d/pycauses-mapped.bin"
  "$PY" "$HERE/causes_eval.py" "$d/truth.jsonl" "$d/gaps.jsonl" "$mode" --tsv "$TSV" || echo "scoring $mode failed"
  grep -A6 "top code in cpu gaps" "$d/gaptrace.log" | head -7
done
echo "rows in $TSV"
