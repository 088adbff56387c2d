// Command crosscheck is an independent judge of gaptrace's step counting
// and cause attribution, on training loops written unlike the project's
// own simulated trainers (testdata/simgpu's simtrain.c and pytrain.py).
//
// The trainers live in jobs/: Python loops that drive the simulated
// libcuda through ctypes and C loops linked against it. Each writes its own
// truth as JSON Lines in CLOCK_REALTIME nanoseconds (jobs/xtruth.py for the
// Python ones):
//
//	{"type":"meta","job":NAME,"pid":P,"clock":"realtime"}
//	{"type":"step","n":N,"start":NS,"end":NS}            one per optimizer step
//	{"type":"stall","cause":C,"code":F,"start":NS,"end":NS,"tid":T,"run_delay_ns":D,...}
//	{"type":"end","steps":N}
//
// A stall's cause is the label gaptrace should give it (README's cause
// table; loader.wait.cpu is loader.wait with worker evidence of CPU work);
// its code is the function a gap over it should name, alternatives
// separated by "|", empty where no name can exist (a stripped binary).
//
// Each job runs under each probe mode: full, auto and lite are
// `gaptrace run --probes MODE -- JOB`; attach starts the job, waits until
// its truth holds attachAfter steps and runs `gaptrace attach --pid`. The
// truth is then cut to what the tracer could see (the steps that started
// after its uprobes attached, less the first) and scored:
//
//   - steps: train.step spans of the job's pid ending within the truth's
//     steps, against the truth's count; target within 2%. Fixed windows
//     (no step found) count too, and the table says how many ("win").
//   - cause share, per stall kind (cause/first code name): over the gaps
//     overlapping each stall, each gap's breakdown spread evenly over it and
//     clipped to the stall, the time given the expected cause over all the
//     time seen, less cpu.contention up to the stall's own run-queue wait
//     (the machine's load); target ≥ 0.9.
//   - code named: the share of stalls with a gap over them whose JSON names
//     the stall's function anywhere (stack frames, lock holders, host ops,
//     sampled code); target ≥ 0.9.
//   - other: breakdown time labelled other over all breakdown time of the
//     job's gaps in the scored range; target ≤ 5%.
//
// Run it from the repository root (root: the tracer loads eBPF):
//
//	go run ./test/crosscheck -gaptrace bin/gaptrace -simgpu build/simgpu [-jobs a,b] [-modes full,auto,lite,attach]
//
// It prints one row per job and mode and a final "N targets met, M
// missed" line, exits 1 when a target is missed, and keeps every run's
// inputs and outputs under out/crosscheck/<job>-<mode>/. TestCrossCheck
// runs the same and fails on a missed target; it is skipped unless
// GAPTRACE_CROSSCHECK=1, until the step clock and attribution changes it
// judges have landed, when CI turns it on.
package main
