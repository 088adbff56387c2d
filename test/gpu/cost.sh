#!/usr/bin/env bash
# What tracing costs a PyTorch job with data-loader workers, on a GPU machine: trainer.py fed by a
# DataLoader of 2 workers into pinned memory, with loader and read stalls, run untraced and traced
# (gaptrace run, default probes, GAPTRACE_PPROF) in interleaved pairs, the order alternating.
#
#   test/gpu/cost.sh OUTDIR
#
# REPS pairs (default 7, at least 5), STEPS measured steps a run (default 400), PROBES (auto), GAPTRACE
# (bin/gaptrace), PYTHON (python3), WORK (/tmp/gaptrace-gpu/cost). Writes to OUTDIR: cost.txt (the
# table), cost.json (every pair), and the traced runs' CPU and heap profiles (cost-pprof.tar).
#
# Per pair: the step time traced over untraced (the trainer's own steps/s over its measured steps);
# over the pairs their median with a bootstrap 95% interval. Per traced run: gaptrace's CPU as a share
# of one core between 5 s after its start and its last second (probe loading left out: /proc ticks
# sampled every second), its peak RSS and records read (summary file), and the records a second.
set -uo pipefail
OUTDIR=${1:?usage: test/gpu/cost.sh OUTDIR}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
G=${GAPTRACE:-$ROOT/bin/gaptrace}
PY=${PYTHON:-python3}
WORK=${WORK:-/tmp/gaptrace-gpu/cost}
REPS=${REPS:-7}
STEPS=${STEPS:-400}
PROBES=${PROBES:-auto}
[ "$REPS" -ge 5 ] || { echo "cost.sh: REPS $REPS: at least 5 pairs" >&2; exit 2; }
[ -x "$G" ] || { echo "cost.sh: $G not found (make build)" >&2; exit 2; }
mkdir -p "$OUTDIR" "$WORK"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0

JOB=("$PY" "$HERE/trainer.py" --preset loader-cost --steps "$STEPS" --data-dir "$WORK")

untraced() { "${JOB[@]}" --result "$WORK/u$1.json" >"$WORK/u$1.log" 2>&1; }

traced() {
  local pre=$WORK/t$1
  GAPTRACE_PPROF=$pre "$G" run --probes "$PROBES" --live off --summary-json "$pre-summary.json" \
    --gaps-out "$pre-gaps.jsonl" -- "${JOB[@]}" --result "$pre.json" >"$pre.log" 2>&1 &
  local gt=$! hz
  hz=$(getconf CLK_TCK)
  # gaptrace's CPU ticks every second while it runs: "unix_time ticks".
  while kill -0 "$gt" 2>/dev/null; do
    awk -v t="$(date +%s.%N)" '{print t, $14 + $15}' "/proc/$gt/stat" 2>/dev/null
    sleep 1
  done >"$pre-ticks.txt"
  wait "$gt"
  echo "$hz" >"$pre-hz.txt"
}

for i in $(seq "$REPS"); do
  if [ $((i % 2)) -eq 1 ]; then untraced "$i"; traced "$i"; else traced "$i"; untraced "$i"; fi
  echo "pair $i done" >&2
done

"$PY" - "$WORK" "$REPS" "$OUTDIR" <<'PYEOF'
import json, os, random, statistics, sys
work, reps, outdir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
pairs = []
for i in range(1, reps + 1):
    p = {"pair": i}
    try:
        u = json.load(open(f"{work}/u{i}.json"))
        t = json.load(open(f"{work}/t{i}.json"))
        p["ratio"] = u["steps_per_s"] / t["steps_per_s"]
    except (OSError, ValueError, KeyError) as e:
        p["error"] = f"run missing: {e}"
    rows = [l.split() for l in open(f"{work}/t{i}-ticks.txt") if len(l.split()) == 2]
    hz = float(open(f"{work}/t{i}-hz.txt").read())
    rows = [(float(a), float(b)) for a, b in rows]
    if len(rows) >= 8:
        (t0, c0), (t1, c1) = rows[5], rows[-1]
        p["cpu_share"] = (c1 - c0) / hz / (t1 - t0)
    try:
        s = json.load(open(f"{work}/t{i}-summary.json"))
        sc = s.get("sidecar") or {}
        p["rss_mib"] = sc.get("max_rss_bytes", 0) / 2**20
        p["events"] = sc.get("events", 0)
        p["events_by_kind"] = sc.get("events_by_kind", {})
        p["cpu_s"] = sc.get("cpu_ns", 0) / 1e9
        p["dropped_events"] = s.get("dropped_events", 0)
        if rows:
            p["events_per_s"] = p["events"] / max(1e-9, rows[-1][0] - rows[0][0])
    except (OSError, ValueError) as e:
        p["error"] = f"summary missing: {e}"
    pairs.append(p)

def median_ci(xs, n=10000):
    if not xs:
        return None, None, None
    rnd = random.Random(1)
    meds = sorted(statistics.median(rnd.choices(xs, k=len(xs))) for _ in range(n))
    return statistics.median(xs), meds[int(0.025 * n)], meds[int(0.975 * n) - 1]

lines = ["tracing cost: trainer.py, 2-worker pinned DataLoader with loader and read stalls, "
         f"probes {os.environ.get('PROBES', 'auto')}, {len(pairs)} interleaved pairs"]
for key, what, fmt in [("ratio", "step time traced / untraced", "{:.4f}"),
                       ("cpu_share", "gaptrace CPU, share of one core", "{:.2%}"),
                       ("rss_mib", "gaptrace peak RSS, MiB", "{:.1f}"),
                       ("events_per_s", "records handled a second", "{:.0f}"),
                       ("dropped_events", "dropped events", "{:.0f}")]:
    xs = [p[key] for p in pairs if key in p]
    m, lo, hi = median_ci(xs)
    if m is None:
        lines.append(f"  {what}: no data")
        continue
    lines.append(f"  {what}: median {fmt.format(m)}  95% interval [{fmt.format(lo)}, {fmt.format(hi)}]  "
                 f"(n={len(xs)}, each: {', '.join(fmt.format(x) for x in xs)})")
for p in pairs:
    if "error" in p:
        lines.append(f"  pair {p['pair']}: {p['error']}")
open(f"{outdir}/cost.txt", "w").write("\n".join(lines) + "\n")
json.dump(pairs, open(f"{outdir}/cost.json", "w"), indent=1)
print("\n".join(lines))
PYEOF
(cd "$WORK" && tar cf "$OUTDIR/cost-pprof.tar" t*.cpu t*.heap 2>/dev/null)
