#!/usr/bin/env bash
# Validate gaptrace on a real GPU machine. Builds nothing: bin/gaptrace is built beforehand on an
# x86-64 machine (make build) and shipped with the repository.
#
#   test/gpu/run.sh OUTDIR [PHASE...]     phases: info pyinfo accuracy ddp ddp-one overhead pairs cost attach-pairs attach-loader layouts loops
#                                         styles auto-steady
#
# RECORD=1 adds --record to the traced runs of accuracy, ddp and loops and packs the recordings into
# OUTDIR/recordings.tar ('gaptrace replay' reproduces those runs offline), with the accuracy runs'
# GPU busy intervals from the profiler (evaluate.py --kineto takes them in place of its trace).
#
# pairs: tracing's cost on a launch-bound PyTorch job, untraced vs null/lite/auto/full and the
# profiler in interleaved pairs (REPS, default 20); its table comes from bin/bench (build it with
# `go build -o bin/bench ./test/bench` and ship it beside bin/gaptrace), the same as make bench's.
#
# Large intermediate files (profiler traces, gaps) stay in $WORK (default /tmp/gaptrace-gpu);
# OUTDIR receives the tables (results.txt) and a few small JSON files.
set -uo pipefail
OUTDIR=${1:?usage: test/gpu/run.sh OUTDIR [info accuracy ddp ddp-one overhead]}
shift
PHASES=${*:-info accuracy ddp ddp-one overhead}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
G=${GAPTRACE:-$ROOT/bin/gaptrace}
PY=${PYTHON:-python3}
WORK=${WORK:-/tmp/gaptrace-gpu}
STEPS=${STEPS:-100}
mkdir -p "$OUTDIR" "$WORK"
RES=$OUTDIR/results.txt
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
[ -d /sys/kernel/tracing/events ] || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true

say() { echo "$*" | tee -a "$RES"; }
phase() { say ""; say "=== $1 ($(date -u +%FT%TZ))"; }
rec() { [ -n "${RECORD:-}" ] && echo --record "$1.rec.gz"; }

for p in $PHASES; do
  case $p in
  info)
    phase info
    { uname -r; nvidia-smi --query-gpu=index,name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
      "$PY" -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count())'
      "$G" version; } 2>&1 | tee -a "$RES"
    "$G" check 2>&1 | tee -a "$RES"
    ;;
  pyinfo)
    # What the Python frame walker needs to know about the interpreter.
    phase pyinfo
    { "$PY" -c 'import sys, sysconfig; print(sys.version); print(sys.executable, "shared:", sysconfig.get_config_var("Py_ENABLE_SHARED"))'
      exe=$("$PY" -c 'import sys, os; print(os.path.realpath(sys.executable))'); echo "realpath $exe"
      ldd "$exe" | grep -i python
      "$PY" -c 'import time; time.sleep(2)' & sleep 1; grep -E 'python|libpython' /proc/$!/maps | awk '{print $6}' | sort -u; wait
      for f in "$exe" $(ldd "$exe" | awk '/libpython/{print $3}'); do
        echo "$f: $(readelf -Ws --dyn-syms "$f" 2>/dev/null | awk '$8=="_PyRuntime"||$8=="Py_Version"||$8=="_Py_DebugOffsets"' | head -4)"
      done; } 2>&1 | tee -a "$RES"
    ;;
  accuracy)
    for probes in ${ACC_PROBES:-full lite auto}; do
      phase "accuracy probes=$probes"
      pre=$WORK/acc-$probes
      "$G" run --probes "$probes" --live off $(rec "$pre") --gaps-out "$pre-gaps.jsonl" --summary-json "$pre-summary.json" \
        --spans-out "$pre-spans.jsonl" --windows-out "$pre-windows.jsonl" -- \
        "$PY" "$HERE/trainer.py" --steps "$STEPS" --warmup 15 --truth "$pre-truth.jsonl" --profile "$pre-kineto.json" \
        --data-dir "$WORK" --stall io.read:every=10:ms=40 --stall net:every=12:ms=30 \
        --stall io.write:every=15:ms=40 --stall cpu:every=9:ms=25 --stall loader.wait:every=7:ms=60 \
        --stall launch:every=20:ms=30 >"$pre-run.log" 2>&1
      say "gaptrace rc=$? ($(tail -c 300 "$pre-run.log" | tr '\n' ' ' | tail -c 200))"
      "$PY" "$HERE/evaluate.py" --gaps "$pre-gaps.jsonl" --truth "$pre-truth.jsonl" --kineto "$pre-kineto.json" \
        --spans "$pre-spans.jsonl" --windows "$pre-windows.jsonl" --json "$OUTDIR/accuracy-$probes.json" \
        --busy-out "$pre-busy.json" --missed 12 2>&1 | tee -a "$RES"
      grep -E '"(gpu_idle_ns|wall_ns|steps|gaps|dropped_events|late_events|forced_events|incomplete_steps|gaps_after_step)"' "$pre-summary.json" | tr -d ' \n' | tee -a "$RES"; say ""
      "$PY" "$HERE/stacks_eval.py" --gaps "$pre-gaps.jsonl" --truth "$pre-truth.jsonl" 2>&1 | tee -a "$RES"
    done
    head -c 60000 "$WORK/acc-full-gaps.jsonl" >"$OUTDIR/sample-gaps-full.jsonl"
    ;;
  ddp)
    phase "ddp two ranks, rank 1 slow by 60 ms/step"
    n=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
    if [ "$n" -lt 2 ]; then say "skipped: $n GPU(s)"; continue; fi
    job=ddp-$(date +%s)
    port=$((29500 + RANDOM % 400))
    for r in 0 1; do
      slow=0; [ $r = 1 ] && slow=60
      "$G" run --job-id "$job" --rank $r --live off $(rec "$WORK/ddp$r") --gaps-out "$WORK/ddp$r-gaps.jsonl" \
        --spans-out "$WORK/ddp$r-spans.jsonl" --summary-json "$WORK/ddp$r-summary.json" -- \
        "$PY" "$HERE/ddp.py" --rank $r --port $port --slow-ms $slow --truth "$WORK/ddp$r-truth.jsonl" \
        >"$WORK/ddp$r.log" 2>&1 &
    done
    wait
    tail -n 3 "$WORK"/ddp0.log "$WORK"/ddp1.log | tee -a "$RES"
    "$PY" "$HERE/ddp_eval.py" --gaps0 "$WORK/ddp0-gaps.jsonl" --truth1 "$WORK/ddp1-truth.jsonl" \
      --spans0 "$WORK/ddp0-spans.jsonl" --spans1 "$WORK/ddp1-spans.jsonl" --json "$OUTDIR/ddp.json" 2>&1 | tee -a "$RES"
    grep -m3 '"comm"' "$WORK/ddp0-gaps.jsonl" | head -c 3000 >"$OUTDIR/sample-ddp-comm-gaps.jsonl"
    ;;
  ddp-one)
    # The same job with both ranks under one gaptrace: the ranks' own timelines decide the comm
    # stalls (late_rank in the evidence), where one gaptrace per rank has only each rank's history.
    phase "ddp two ranks under one gaptrace, rank 1 slow by 60 ms/step"
    n=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
    if [ "$n" -lt 2 ]; then say "skipped: $n GPU(s)"; continue; fi
    port=$((29500 + RANDOM % 400))
    pre=$WORK/ddp-one
    "$G" run --live off $(rec "$pre") --gaps-out "$pre-gaps.jsonl" --spans-out "$pre-spans.jsonl" \
      --summary-json "$pre-summary.json" -- sh -c "
        \"$PY\" \"$HERE/ddp.py\" --rank 0 --port $port --truth \"$pre-truth0.jsonl\" >\"$pre-r0.log\" 2>&1 &
        \"$PY\" \"$HERE/ddp.py\" --rank 1 --port $port --slow-ms 60 --truth \"$pre-truth1.jsonl\" >\"$pre-r1.log\" 2>&1
        wait" >"$pre.log" 2>&1
    say "gaptrace rc=$?"
    tail -n 3 "$pre-r0.log" "$pre-r1.log" | tee -a "$RES"
    "$PY" "$HERE/ddp_eval.py" --gaps0 "$pre-gaps.jsonl" --truth0 "$pre-truth0.jsonl" --truth1 "$pre-truth1.jsonl" \
      --spans-both "$pre-spans.jsonl" --json "$OUTDIR/ddp-one.json" 2>&1 | tee -a "$RES"
    grep -m3 '"late_rank"' "$pre-gaps.jsonl" | head -c 3000 >"$OUTDIR/sample-ddp-one-comm-gaps.jsonl"
    ;;
  overhead)
    phase overhead
    "$PY" "$HERE/overhead.py" --gaptrace "$G" --out "$WORK/overhead" --reps "${REPS:-3}" --steps "${OVH_STEPS:-500}" \
      --configs "${CONFIGS:-untraced,lite,auto,full,null,profiler}" --raw "$OUTDIR/overhead-raw.json" 2>&1 | tee -a "$RES"
    cp "$WORK/overhead/overhead.json" "$OUTDIR/overhead.json" 2>/dev/null && rm -f "$OUTDIR/overhead-raw.json"
    ;;
  pairs)
    phase "overhead pairs: launch-bound job, untraced vs null/lite/auto/full/profiler"
    "$PY" "$HERE/overhead_pairs.py" --gaptrace "$G" --bench "${BENCH:-$ROOT/bin/bench}" --out "$WORK/pairs" \
      --reps "${REPS:-20}" --steps "${PAIR_STEPS:-2000}" --modes "${PAIR_MODES:-untraced,null,lite,auto,full,profiler}" 2>&1 | tee -a "$RES"
    cp "$WORK/pairs/pairs.json" "$OUTDIR/overhead-pairs.json" 2>/dev/null
    ;;
  cost)
    # The sidecar's own cost on a job with a 2-worker pinned DataLoader (cost.sh: interleaved pairs).
    phase "cost: 2-worker pinned DataLoader, untraced vs traced"
    WORK=$WORK/cost "$HERE/cost.sh" "$OUTDIR" 2>&1 | tee -a "$RES"
    ;;
  attach-pairs)
    # The same costs in one long-running job: gaptrace attached and detached, the profiler switched on
    # and off, in interleaved windows (overhead_attach.py); ATTACH_BUDGET caps the seconds spent in
    # repetitions, then the sidecar's own CPU and RSS are measured in a 30 s attachment per mode
    # (SIDECAR); HOST_US adds that much Python work to each step (a lower launch rate).
    phase "overhead in one job: untraced windows vs attached null/lite/auto/full and the profiler"
    seed=${SEED:-1}
    "$PY" "$HERE/overhead_attach.py" --gaptrace "$G" --bench "${BENCH:-$ROOT/bin/bench}" --out "$WORK/attach-$seed" \
      --reps "${REPS:-20}" --window "${WINDOW:-1.5}" --modes "${PAIR_MODES:-null,lite,auto,full,profiler}" \
      --budget "${ATTACH_BUDGET:-0}" --seed "$seed" --sidecar "${SIDECAR:-auto,lite}" --host-us "${HOST_US:-0}" --pprof 2>&1 | tee -a "$RES"
    for f in pairs windows sidecar; do cp "$WORK/attach-$seed/$f.json" "$OUTDIR/attach-$seed-$f.json" 2>/dev/null; done
    (cd "$WORK/attach-$seed" && tar cf "$OUTDIR/attach-$seed-pprof.tar" *.cpu *.heap 2>/dev/null)
    ;;
  attach-loader)
    # cost.sh's job (trainer.py fed by 2 pinned DataLoader workers, loader and read stalls) in one
    # long-running process: untraced windows against auto and lite attached (overhead_attach.py --job
    # loader), whole iterations timed, so the loader's wait and the stalls are in them; then the
    # sidecar's own CPU and RSS in one attachment per mode in SIDECAR (SIDECAR_SECONDS, default 40).
    # GAPTRACE_ALT=BIN: modes ending in @alt (auto@alt) run that build, timed interleaved with $G's.
    # LOADER_WORKERS: the job's DataLoader workers (default 2; 8 is a job of 9 processes).
    phase "overhead in one job with loader workers: untraced windows vs attached auto/lite"
    seed=${SEED:-1}
    "$PY" "$HERE/overhead_attach.py" --job loader --loader-workers "${LOADER_WORKERS:-2}" --gaptrace "$G" ${GAPTRACE_ALT:+--gaptrace-alt "$GAPTRACE_ALT"} \
      --bench "${BENCH:-$ROOT/bin/bench}" \
      --out "$WORK/loader-$seed" --reps "${REPS:-10}" --window "${WINDOW:-4}" --settle-auto 3 \
      --modes "${PAIR_MODES:-auto,lite}" --budget "${ATTACH_BUDGET:-0}" --seed "$seed" --sidecar "${SIDECAR:-auto}" \
      --sidecar-seconds "${SIDECAR_SECONDS:-40}" --pprof 2>&1 | tee -a "$RES"
    for f in pairs windows sidecar; do cp "$WORK/loader-$seed/$f.json" "$OUTDIR/loader-$seed-$f.json" 2>/dev/null; done
    (cd "$WORK/loader-$seed" && tar cf "$OUTDIR/loader-$seed-pprof.tar" *.cpu *.heap 2>/dev/null)
    tail -n 20 "$WORK/loader-$seed/job.log" >"$OUTDIR/loader-$seed-job.log" 2>/dev/null
    ;;
  layouts)
    # attach --pid to a job that already runs CUDA, and the PID-namespace
    # layouts: the job in a child namespace with gaptrace on the host
    # (DaemonSet, hostPID), and gaptrace inside the job's namespace (sidecar).
    stalls="--stall io.read:every=10:ms=40 --stall net:every=12:ms=30 --stall io.write:every=15:ms=40 --stall loader.wait:every=7:ms=60"
    gflags() { echo --live off --gaps-out "$1-gaps.jsonl" --summary-json "$1-summary.json" --spans-out "$1-spans.jsonl"; }
    job() { echo "$PY" "$HERE/trainer.py" --steps "$STEPS" --warmup 15 --truth "$1-truth.jsonl" --profile "$1-kineto.json" --data-dir "$WORK" $stalls; }
    cudapid() { # first process under $1 (itself included) that maps libcuda
      for _ in $(seq 600); do
        for p in $1 $(pgrep -P "$1"; for c in $(pgrep -P "$1"); do pgrep -P "$c"; done); do
          grep -q libcuda "/proc/$p/maps" 2>/dev/null && { echo "$p"; return 0; }
        done; sleep 0.1
      done; return 1; }
    report() { # $1 prefix, $2 label
      say "$2: $(grep -E '"(steps|gaps|dropped_events|late_events|forced_events|incomplete_steps|gaps_after_step)"' "$1-summary.json" | tr -d ' \n')"
      "$PY" "$HERE/evaluate.py" --gaps "$1-gaps.jsonl" --truth "$1-truth.jsonl" --kineto "$1-kineto.json" \
        --spans "$1-spans.jsonl" --json "$OUTDIR/$(basename "$1").json" 2>&1 | tee -a "$RES"
      say "pids in gaps: $("$PY" -c 'import json,sys,collections; c=collections.Counter((g["pid"], (g.get("workload") or {}).get("ns_pid")) for g in map(json.loads, open(sys.argv[1]))); print(dict(c))' "$1-gaps.jsonl")"
    }
    phase "layouts: attach --pid to a running CUDA job"
    pre=$WORK/lay-attach
    $(job "$pre") >"$pre-job.log" 2>&1 & jp=$!
    p=$(cudapid $jp) || { say "job never mapped libcuda"; continue; }
    t0=$(date +%s.%N)
    "$G" attach --pid "$p" $(gflags "$pre") >"$pre-run.log" 2>&1; rc=$?
    t1=$(date +%s.%N)
    if kill -0 "$jp" 2>/dev/null; then alive=yes; else alive=no; fi
    wait $jp; jrc=$?
    say "attach rc=$rc after $(awk "BEGIN{printf \"%.1f\", $t1 - $t0}") s; job still running when gaptrace exited: $alive; job rc=$jrc"
    report "$pre" "attach"
    phase "layouts: job in a child PID namespace, gaptrace on the host (DaemonSet hostPID)"
    pre=$WORK/lay-daemonset
    unshare --pid --fork --mount-proc $(job "$pre") >"$pre-job.log" 2>&1 & up=$!
    p=$(cudapid $up) || { say "job never mapped libcuda"; continue; }
    "$G" attach --pid "$p" $(gflags "$pre") >"$pre-run.log" 2>&1; say "attach rc=$? (host pid $p)"
    wait $up
    report "$pre" "daemonset"
    phase "layouts: gaptrace inside the job's PID namespace (sidecar, shareProcessNamespace)"
    pre=$WORK/lay-sidecar
    unshare --pid --fork --mount-proc sh -c "$(job "$pre") >$pre-job.log 2>&1 & jp=\$!; \
      for i in \$(seq 600); do grep -q libcuda /proc/\$jp/maps 2>/dev/null && break; sleep 0.1; done; \
      $G attach --pid \$jp $(gflags "$pre") >$pre-run.log 2>&1; echo attach rc=\$? pid \$jp; wait"  2>&1 | tee -a "$RES"
    report "$pre" "sidecar"
    tail -n 5 "$WORK"/lay-*-run.log >"$OUTDIR/layouts-logs.txt" 2>&1
    ;;
  loops)
    # Real loops: pinned DataLoader copies with 2 workers and extra .item() reads, a checkpoint of
    # CUDA tensors, a GIL-holding background thread, a pageable copy; then the same under a CUDA
    # graph. Steps counted against the loop's iterations (warm-up included: gaptrace sees them).
    # LOOP_FORMS (default eager graph) and LOOP_PROBES (default auto) pick the runs.
    for probes in ${LOOP_PROBES:-auto}; do
    for form in ${LOOP_FORMS:-eager graph}; do
      phase "loops form=$form probes=$probes"
      pre=$WORK/loops-$form; [ "$probes" = auto ] || pre=$pre-$probes
      extra=""; [ $form = graph ] && extra=--graph
      "$G" run --probes "$probes" --live off $(rec "$pre") --gaps-out "$pre-gaps.jsonl" --summary-json "$pre-summary.json" \
        --spans-out "$pre-spans.jsonl" -- \
        "$PY" "$HERE/trainer.py" --steps "$STEPS" --warmup 15 --truth "$pre-truth.jsonl" --profile "$pre-kineto.json" \
        --data-dir "$WORK" --pin-memory --loader-workers 2 --item-reads 2 $extra \
        --stall checkpoint:every=12:ms=0 --stall lock:every=9:ms=40 --stall pageable:every=10:ms=0 >"$pre-run.log" 2>&1
      say "gaptrace rc=$? ($(tail -c 200 "$pre-run.log" | tr '\n' ' '))"
      say "steps: gaptrace $(grep -o '"steps": *[0-9]*' "$pre-summary.json" | grep -o '[0-9]*$'), loop iterations $((STEPS + 15))"
      "$PY" "$HERE/evaluate.py" --gaps "$pre-gaps.jsonl" --truth "$pre-truth.jsonl" --kineto "$pre-kineto.json" \
        --spans "$pre-spans.jsonl" --json "$OUTDIR/$(basename "$pre").json" 2>&1 | tee -a "$RES"
      say "with copies counted idle (kernels only busy): $("$PY" "$HERE/evaluate.py" --compute-only --gaps "$pre-gaps.jsonl" \
        --truth "$pre-truth.jsonl" --kineto "$pre-kineto.json" 2>&1 | grep -E '^detection|^pageable ' | tr '\n' ' ')"
      "$PY" "$HERE/stacks_eval.py" --gaps "$pre-gaps.jsonl" --truth "$pre-truth.jsonl" 2>&1 | tee -a "$RES"
    done
    done
    ;;
  styles)
    # Loops written unlike trainer.py (styles.py): AMP with a GradScaler and a pageable DataLoader,
    # gradient accumulation with a dict batch and a logging thread, a synthetic benchmark loop that
    # syncs every 10th step, a loop that evaluates every 15th. Steps against the loop's iterations; detection and the checkpoints'
    # attribution against the profiler. STYLES and STYLE_PROBES pick the runs, STYLE_TIMEOUT (s) bounds each.
    for probes in ${STYLE_PROBES:-auto lite}; do
    for style in ${STYLES:-amp-cnn accum logevery synthetic evalloop}; do
      phase "styles style=$style probes=$probes"
      pre=$WORK/style-$style-$probes
      timeout "${STYLE_TIMEOUT:-300}" "$G" run --probes "$probes" --live off $(rec "$pre") --gaps-out "$pre-gaps.jsonl" --summary-json "$pre-summary.json" \
        --spans-out "$pre-spans.jsonl" -- \
        "$PY" "$HERE/styles.py" --style "$style" --steps "$STEPS" --warmup 10 --truth "$pre-truth.jsonl" \
        --profile "$pre-kineto.json" --data-dir "$WORK" >"$pre-run.log" 2>&1
      say "gaptrace rc=$? ($(tail -c 200 "$pre-run.log" | tr '\n' ' '))"
      say "steps: gaptrace $(grep -o -m1 '"steps": *[0-9]*' "$pre-summary.json" | head -1 | grep -o '[0-9]*$') + windows $(grep -o '"windows": *[0-9]*' "$pre-summary.json" | head -1 | grep -o '[0-9]*$'), loop iterations $((STEPS + 10))"
      "$PY" "$HERE/evaluate.py" --gaps "$pre-gaps.jsonl" --truth "$pre-truth.jsonl" --kineto "$pre-kineto.json" \
        --spans "$pre-spans.jsonl" --json "$OUTDIR/$(basename "$pre").json" --busy-out "$pre-busy.json" --missed 5 2>&1 | tee -a "$RES"
      grep -o '"by_cause": *{[^}]*}' "$pre-summary.json" | tee -a "$RES"
    done
    done
    ;;
  auto-steady)
    # auto's cost over lite in one long attachment: the job's steps in auto's lite stretches against
    # all of the steady attachment (auto_steady.py). AUTO_SECONDS, HOST_US.
    phase "auto-steady: one long auto attachment"
    "$PY" "$HERE/auto_steady.py" --gaptrace "$G" --out "$WORK/auto-steady" --seconds "${AUTO_SECONDS:-180}" \
      --host-us "${HOST_US:-0}" 2>&1 | tee -a "$RES"
    cp "$WORK/auto-steady/auto-steady.json" "$OUTDIR/" 2>/dev/null
    grep -E 'window asked|per-launch probes (at|de)tached' "$WORK/auto-steady/gaptrace.log" | cut -c1-220 >"$OUTDIR/auto-steady-windows.txt"
    ;;
  *) echo "unknown phase $p" >&2; exit 2 ;;
  esac
done
if [ -n "${RECORD:-}" ]; then
  (cd "$WORK" && ls *.rec.gz >/dev/null 2>&1 && tar cf "$OUTDIR/recordings.tar" *.rec.gz *truth.jsonl *summary.json $(ls *busy.json 2>/dev/null))
fi
say ""
say "done $(date -u +%FT%TZ)"
