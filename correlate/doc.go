// Package correlate is gaptrace's attribution engine: it joins the host
// events recorded by tracer/ with the GPU's own idle windows (NVML/GPM) and
// says, for every GPU idle gap, why the GPU had nothing to do.
//
// # Lifecycle
//
// One Engine serves one traced process tree. The caller (one goroutine)
// feeds it with Event and Window as they arrive, calls Advance with the wall
// clock regularly (every 50–100 ms is right), and Close once at exit. Results
// leave through the Sink as soon as they are final: a Gap at the latest
// about EmitDelay + the Advance period after its end (well inside 1 s with
// the defaults), a Step once the GPU windows that cover it have arrived.
//
// # Pipeline
//
// CPU samples (event.KindCPUSample) skip the queue: each thread's recent
// samples are kept apart (samples.go), move no model, and name, when a gap
// is emitted, the code its thread, its lock holders and its data-loader
// workers ran during it (Gap.Code). So do page-fault bursts on mapped
// files (event.KindFaultRead, faultreads.go): they move a gap's cpu time
// to io.read of the file when it is emitted; samples inside libc's read
// or write wrappers move the share of its cpu they stand for to io.read
// or io.write (reads and writes too short to be emitted).
//
// Events may arrive out of order across threads by up to EmitDelay. They
// are buffered in a heap and processed in order of their end time once the
// watermark (now - EmitDelay) passes them; a gap is therefore decided with
// every host event that ended before it already seen. Events older than the
// watermark are late: they still enter thread timelines (evidence), but no
// longer move the GPU queue model.
//
// Per process (one device each, SetDevice) the engine keeps a GPU queue
// model: per stream, whether work was enqueued since the stream was last
// known drained. A synchronisation (cu*Synchronize, a synchronous copy or
// free while work was pending) drains the streams it covers: a context
// sync or a free all of them, a stream sync its stream plus the work other
// streams enqueued before the synced stream's last work (side-stream batch
// copies are consumed by the main stream through untraced events). When
// every stream is drained a gap opens at the sync's return and closes at
// the next enqueue of the process, by any thread (launch, async copy,
// memset, collective). A synchronous copy or an allocation issued while the
// queue is already drained is not an enqueue: it is host activity inside the
// gap (cuda.memcpy, cuda.alloc), because the GPU computes nothing during it.
// A later sync that still waits proves the open gap wrong (lost events,
// another stream still busy): it is dropped and reopened at that sync.
// Gaps at least MinGap long are attributed and emitted (Evidence.Source
// "host"); shorter ones are micro-gaps and only count through the windows.
//
// The loop's thread owns its gaps (loopthread.go): the running call
// site's thread, else the process's main feeder (most launches; in lite,
// where none is seen, most calls that give the GPU work: launches,
// memsets, collectives, copies other than reads to the host). A thread
// that never fed the GPU (only device-to-host copies and syncs: a
// checkpoint saver, a metrics reader) does not end, reject or absorb into
// an open gap of another thread; its copies drain on its own stream, its
// events stay on its timeline and its tid among the gap's threads. A
// thread that feeds the GPU (autograd's backward thread) ends it as
// before.
//
// An async copy issued while the queue is drained is held until its thread
// shows what it was (episode.go). A copy from pageable memory keeps the host
// in the call while the driver stages it (KindMemcpyStaged, from the
// copy's return probe): the gap then ends at the copy's return, cuda.memcpy,
// with Evidence.Copy (bytes, direction, GB/s, the fix). A copy followed at
// once by a sync of the same thread that waited only for it, no kernel in
// between (lite: copies to the host and a sync that did not wait), is a
// host operation's own device traffic (torch.save copies each tensor to
// the host): it does not end the gap. Such a gap is labelled by the
// operation's dominant host activity, serialization from the open of the
// file it writes counting as writing it, and a checkpoint's own copies too,
// with Evidence.Episode. Lite needs one copy of real data (over 4 KiB) to
// start an episode, since a scalar read may follow launches it cannot see;
// with launches seen, a copy and sync with no launch since the drain is
// never step work, however small. Anything else the thread does next (a
// launch, another call) releases the copy as the ordinary enqueue that ends
// the gap.
//
// Full probes also see a queue drain that no sync shows (quiet.go): CUDA
// events carry the thread's last launch and its launches not yet flushed,
// and a launch after a 1 ms pause is emitted. When the work queued since
// the queue was last empty is one thread's small burst (at most 16
// launches, a quarter of what syncs usually flush, and copies of known
// size: GradScaler's update after its found_inf read, an optimizer step
// after loss.item()) and the thread's next CUDA event comes long after its
// last launch, a gap opens where the burst's work most likely ended: its
// launches times the steps' busy time per launch, its bytes at 10 GB/s,
// never before the last launch's kernel. A sync that still waits rejects
// it, as it rejects any open gap.
//
// Per thread it keeps an activity timeline (syscalls, runqueue waits,
// off-CPU time, CUDA calls). A gap's breakdown is the time-share of what the
// thread that ended the gap did during it; where that thread waited on a
// sibling thread (futex/poll/pipe woken by it) the sibling's activity over
// the wait is charged instead, one hop deep; where it waited on another
// traced process that is not an ancestor (a data-loader worker) the time is
// loader.wait and the worker's own events decide whether it was doing I/O or
// computing (a pipe writer not seen yet counts as a worker too: after an
// attach, workers are known only once they emit something). Time the
// timeline does not cover is cpu: syscalls shorter than the tracer's
// threshold never arrive, so they count as on-CPU time, except holes of at
// most 100 µs between two blocking calls of the same cause (a read loop),
// which keep that cause. Overlaps resolve as: a CUDA call owns the syscalls
// nested in it, runnable time beats the syscall around it (the I/O was done;
// the CPU was not free), off-CPU time is the weakest fact.
//
// Two feeder threads: the gap ends at the first enqueue of either, its TID
// and breakdown are those of the thread that ended it (with waits on the
// other resolved through the wake-up as above), and Evidence.Threads lists
// every feeder considered.
//
// Idle the host cannot bound comes from the GPU windows:
//   - CPU ahead without a sync: a feeder blocked for at least MinGap in all
//     (a read loop's calls each take less) while its queue still held work.
//     The host bounds [blocking start, next enqueue or a sync that found the
//     queue empty or waited less than MinGap]. Where recent syncs waited,
//     the queue ran dry the usual drain time (sync return - last enqueue)
//     after the last enqueue, and the idle is from there on, capped by the
//     windows' idle; otherwise the windows give how much of it was idle,
//     placed at the end of the interval because the queue drains first, and
//     their idle outside the interval is discounted at the device's recent
//     micro-idle density (Evidence.Source "host+gpu").
//   - Lite: a gap lite closes at the next work it sees (launches are
//     invisible) ends at the feeder's last blocking call in it; run-queue
//     waits, time blocked outside any call (a page fault) and calls that
//     mostly waited for a CPU are left out: the feeder stopping lands in
//     the launch loop as often as before it. Only a feeder that has not
//     run at all since the sync's return (the wait for a CPU after its
//     wakeup) enqueued nothing for sure: that time is a host gap, as at
//     full. A gap no blocking explains is the feeder computing: the usual
//     lead says where the invisible launches began, and the idle is from
//     the gap's start to there, capped by the windows. The lead is both
//     the feeder's running time from a sync's return to the next work
//     seen (the time it could not run left out: a loop paced by its work)
//     and the time that passed (a loop paced by the clock runs less when
//     preempted); only what exceeds both is computing.
//   - A feeder that cannot run while its queue is shallow starves the GPU
//     (lite, between a sync's return and the next work seen): the queue is
//     empty until the launches begin, then grows to what the syncs usually
//     wait for (depth: the upper quartile of the last 16 waits less their
//     run-queue time; under MinGap/2 it counts as empty, being the last
//     kernel and the sync's own latency) over the usual lead. A run-queue
//     wait or a block outside any call of D that starts after τ of running
//     time, while the queue holds Q = depth·min(τ/lead, 1) < D, is idle
//     from its start + Q to its end (the feeder enqueues as soon as it
//     runs); Q is at most the usual wait (depth) less the wait of the
//     feeder's next sync, which waits for what was enqueued after the
//     preemption less what the GPU ran of its queue meanwhile (a feeder
//     preempted between steps, before it launched, waits as long as ever:
//     Q = 0); capped by the windows' idle, labelled by the thread's
//     timeline (a run-queue wait is cpu.contention), Evidence.Source
//     "host+gpu". A launch-bound loop thus loses the GPU for every
//     preemption, while a GPU-bound loop (syncs that wait for most of the
//     step) hides every preemption its queue outlasts. Full sees the
//     launches and bounds the same waits as CPU ahead (above).
//   - Micro-gaps: per step, window idle minus the gaps already bounded.
//     Within a window, the busy time not already known (sync waits are
//     busy) is split over the remaining time in proportion to the launches
//     made there, since a training loop does the same GPU work every step;
//     without launch counts (lite) the window's unbounded idle is spread
//     evenly. Micro idle is attributed in proportion to what the feeder
//     threads did outside the gaps, leaving out time blocked in syncs and
//     idle waits on nobody (usually cpu: launch-bound). Never one record per
//     micro-gap. Without windows MicroIdleNS is 0: the engine does not
//     invent idle. NVML windows are preferred to GPM ones for idle totals
//     (utilization is "a kernel ran", the definition of idle).
//
// Comm stalls: a sync that waited on streams whose pending work holds a
// collective, longer than the minimum wait the same sync of the step (same
// call, stream and position in the step) showed over the last 32 steps, is
// a stall of kind "stall", cause comm, for the excess, placed at the end of
// the wait. It needs a step period and four earlier steps. When GPM SM
// activity covers it, activity above 0.5 rejects it (the GPU was
// computing); otherwise Evidence.SMActivity confirms it. A stall waits for
// GPM up to holdMax, before a device's first GPM window too where
// Config.GPMDevices says windows will come. When every rank
// of the collective's communicator is traced by this engine, the ranks'
// own timelines judge the wait instead (correlate/ranks): comm for as long as the
// last rank reached the collective after this one, naming it
// (CollectiveEvidence.LateRank, LatePID). Communicators are linked across
// processes from their creation when it was seen, else from their
// collectives (ranks/link.go: the same sequence, collectives completing
// together on every rank); a wait on one that may still be linked, or
// whose peer's collective has not arrived, is held up to linkWait. Ranks
// traced by other sidecars of the job count as traced here once those
// sidecars send what their engines keep of each communicator (ranks/mirror.go:
// Engine.Peer mirrors them, SetPeerOut reports this engine's own).
//
// # Steps
//
// A step is one iteration of the training loop, however many syncs it
// holds; under gradient accumulation, one optimizer step, however many
// micro-batches it holds. The step clock takes the strongest source it
// has (stepsite.go), and reports which (StepClock, Step.ClockSource):
//
//   - declared: Config.StepAt (--step-at), FILE:LINE or a function; a step
//     ends at each sync or blocking copy with it on the stack (the tracer
//     captures stacks there, not at async copies, graph launches or
//     collectives).
//   - framework: a framework's own per-step marker (marker.go,
//     stepclock.FrameworkClock): PyTorch's "Optimizer.step#<Class>.step"
//     region, or its profiler's "ProfilerStep#N" where no optimizer step
//     comes; each ends a step, so gradient accumulation counts optimizer
//     steps, not micro-batches.
//   - call_site: the site of the main thread's sync that recurs once an
//     iteration (stepclock.PickSite): its own frames, up to eight, tell
//     a helper (or a chain of them: log, update, sync, item) called from
//     the loop from the same one called from an evaluation; between two
//     of its calls the thread launched or a copy or collective was
//     enqueued, none more than twice; a checkpoint's
//     per-tensor reads hold no work between them, a read every tenth
//     iteration ten batch copies, a saver thread is not the main thread.
//     Where two sites of the thread recur apart with comparable counts
//     (training and an evaluation longer than the training between), the
//     stream does not say which is the iteration: the work pattern
//     decides. A running site gives way only after three checks in a row
//     find it no longer recurring, or at once where it is no longer called
//     and, after its last call, another site of its thread recurs twelve
//     times launching no clearly less, or no kernel while copying the
//     same batch (the loop changed: eager warm-up steps, then a captured
//     graph's replays; stepsite.go replacedBy; the launches must be
//     known, so not under lite).
//     Where the batch copies between a site's calls vary (2-6
//     micro-batches packed by a token budget), the launches decide
//     (stepclock/varied.go): a fixed part on top of a part per copy is
//     one optimizer step; none, a read every few iterations. Lite sees
//     no launch and cannot tell them apart.
//   - work_pattern: the rules below, for code with no usable site
//     (stripped native loops, stacks not captured).
//
// Under the work pattern, steps are counted by the work clock (clock.go,
// stepclock) whenever one is found: an enqueued operation other than a scalar read
// (a copy or memset over 4 KiB, a collective; a copy's direction is part
// of it, so a checkpoint's copies to the host never clock the batch's
// copies to the device) that occurs a fixed number of times m per
// step, between two of which the same operations and, in full, about the
// same number of kernels (within 30%) were enqueued in 80% of the steps,
// compared with the most common step. A clock must still occur (not a
// warm-up's or a checkpoint's burst), its steps must share the work (the
// median step holds at least a quarter of the mean and half its share of
// a coarser clock's, and in full launches kernels; the run's first step,
// while the ring holds it, is left out of the mean: the first iteration's
// compiling and autotuning are one-off work however long, not where the
// loop's work recurs), m > 1 needs the segments between occurrences to
// differ by position (the step starts after the stretch that held a sync
// in every step), and the finest such clock wins. While nothing is
// decided yet (no period, gaps held) a clock must also be proven: a sync
// came between its occurrences, or they span at least the time the token
// ring held before the first. Operations repeating alike before the
// loop's first sync may be a burst inside the first iteration (the
// backward's per-layer copies, after the forward and its compiling),
// exposed once the iteration's sync falls into one of their steps and
// makes it the one that holds the work; the operation that starts every
// iteration has no such stretch of work before it, so a loop that never
// syncs is still clocked from its first iterations. Waiting loses no
// step: gaps are held meanwhile and the clock, once proven, lays its steps
// over the ring (or splits the fixed window the warm-up ran out to). The
// loop's first iteration is a step: it starts at the last boundary
// occurrence before the first token known to follow compute (loopStart;
// earlier ones are setup), and the fixed window that the loop's first
// iteration ends in, while the ring reaches back to the run's start, is
// that iteration (under the sync period: the window of the first boundary
// after compute, and a setup whose syncs the history holds is a window up
// to its last sync). Gradient accumulation (accum.go): g of a clock's
// steps are one iteration when one of every g holds the group's sync and,
// where launches are seen, launches over 30% more than the others; lite
// counts the micro-batches (a loss read every g-th iteration looks the
// same), auto keeps a grouping its windows learnt while the sync still
// comes once per group; detection waits for four groups while gaps are
// held, and a grouping takes over from its running steps at once. Where
// no sync marks the group (a loop that reads its loss only every few
// optimizer steps, the host running ahead of the device), the launches
// by position may (launchSlot): one step of every g launches more than
// nearly every other, the others alike, syncs seldom elsewhere; the clock
// then compares its steps by position (a loop that seldom syncs flushes
// its counts only then), an occurrence after a sync inside a group is an
// insertion's (an evaluation's batches, each read back) and counts no
// micro-batch, the grouping is kept where launches are not seen
// (keepGroup) and realigned when one shows the group's place moved, and
// a call site whose calls come more often than its steps (withinGroup)
// does not take the steps. A
// running clock is checked every 16 operations and gives way, at two
// checks in a row, to a clearly finer one or when it no longer qualifies;
// many syncs without any operation mean the loop stopped, and steps fall
// back to fixed windows.
// A loop that enqueues only kernels is clocked, under full, by marked
// launches (marks.go in tracer: a few of each process's rarest launched
// functions, Event.Mark): a marked function is a clock operation like a
// copy, compared by exact launch positions with the marked functions up
// to 4.5 times rarer; its steps end at the launch unless every step
// syncs; copies and collectives win over it.
// A step ends when the next step's clock operation is enqueued: at the
// sync after which the host clearly paused longest from the call's return
// (full only), else at the last sync before it; at exit, at the last sync.
// A host operation's syncs (a bulk episode's: torch.save) are passed
// over, and the pause after the sync before it lasts through it.
// Gaps after the open step's start wait for that, at most holdMax.
//
// Without a clock, steps are found from the recurrence of
// synchronisations: each sync (and each synchronous device-to-host copy
// that drained work) gets a signature (CUDA call, stream, launches, async
// copies and collectives since the previous one). The smallest period P
// whose signatures repeat (80% of recent comparisons) is the number of
// syncs per step. The step ends at the sync after which the host clearly
// takes longest to enqueue again, else at the one with the longest median
// wait, never at a sync followed at once by another sync. A step open for
// 30 s (and 10× the usual step) means the loop stopped syncing. A gap
// belongs to the step holding its midpoint. Until a period is found the
// engine holds gaps for at most 850 ms after their end; past that, or 3 s
// after the first GPU work without a period, it falls back to fixed
// windows of StepWindow (Step.Window true) and keeps looking; numbering
// always increases. A lost pattern (half the recent syncs or clock steps
// stop matching) returns to fixed windows. A clock that takes over from
// another, the sync period or fixed windows takes the open step's
// operations so far from the token ring, so that its first step is
// compared whole with the next.
//
// Comm baselines name a sync by its position in the step: under the sync
// period its index mod P, under the clock its index since the clock
// operation, where most recent steps held the same number of syncs.
//
// # Layout
//
// The engine is a thin layer over models that each own their state, and
// over sub-packages that hold what needs no engine state at all. Each
// package follows one rule, which its doc.go states and
// docs/architecture.md lists:
//
//   - correlate (this package): the engine and the per-process models.
//     Data flows down, decisions flow up, and only engine.go calls the
//     Sink.
//   - correlate/stepclock: pure functions from the sequence of enqueued
//     operations and syncs to step boundaries (the work clock and the sync
//     period). No state across calls; the stepper keeps the ring.
//   - correlate/interval: sorted lists of disjoint intervals, pure
//     functions over values the caller owns.
//   - correlate/reorder: the reorder buffer, a type that owns its events
//     and knows nothing of what they mean.
//   - correlate/queue: the GPU queue model (Streams: per stream, work
//     enqueued since the last drain; Burst; FirstOps; Ahead): types that
//     own their state and decide no gap.
//   - correlate/attribute: why the host left the GPU idle over an
//     interval. Thread owns its activity timeline; an Attribution reads
//     the timelines and the world (attribute.World, which correlate's
//     world implements) and changes neither; where a gap begins and ends
//     is not its to decide.
//   - correlate/ranks: the communicators' registry, a type that owns
//     every communicator, group and mirror; the engine holds Refs to
//     collectives and asks it for the ranks' verdict.
//   - correlate/record: the recording and replay format, above the
//     engine: it wraps the engine's Input and replays into an Engine; the
//     engine knows nothing of recordings.
//
// Every package under correlate imports only event, the standard library
// and correlate's own sub-packages (the linter's depguard rule says so).
// No sub-package imports correlate except record, which is a client of
// the engine, not a part of it; the tests that replay recordings are
// external (package correlate_test) for the same reason.
//
// The Engine owns everything; it hands each call into a process's models
// an env: the settings (an immutable value resolved once from Config), the
// clock (now and the watermark), the process's device and the world, which
// models read but never change. Models leave the gaps and steps they
// decide, and the candidates they reject, in the process's outbox; the
// engine applies it after every call, so totals and sink calls happen in
// decision order and in one place. No model holds the Engine. A step
// leaves with the gaps it holds (StepResult), so no consumer rebuilds the
// join; a gap no step will carry is marked Late.
//
//	engine.go     Engine: the public API, event dispatch, finalize, apply
//	              (outbox → totals and Sink), sweeping silent processes
//	config.go     Config, its validation, settings, the internal tunables
//	world.go      world: processes, threads, devices, the communicators'
//	              registry (ranks); who is a loader worker; collective
//	              evidence; the view an attribution reads (attribute.World)
//	proc.go       proc: one process's state (the models it composes), its
//	              outbox, what it must keep, closing at exit
//	gapstate.go   gapState: the open host-bounded gap, begun and ended
//	              only through its methods
//	waitring.go   waitRing: a ring of recent durations and its statistics
//	queue.go      the queue model's events: enqueues fill the streams
//	              (queue.Streams), syncs and synchronous copies drain them;
//	              open and close host-bounded gaps
//	              (lite: where the gap most likely ended, what a feeder
//	              that could not run cost)
//	quiet.go      a queue that drains after a thread's small trailing
//	              burst, with no sync to show it (full probes)
//	loopthread.go the loop's thread (call site's or main feeder) and the
//	              readers whose copies and syncs stay out of its gaps
//	episode.go    copies issued into a gap: pageable copies that end it at
//	              their return, host operations whose copies and syncs stay
//	              inside it, and their labels
//	ahead.go      CPU ahead: a feeder blocked while its queue held work;
//	              windows decide how much was idle
//	comm.go       comm stalls: per-slot wait baselines, GPM confirmation,
//	              waits held for the ranks' verdict
//	rankstep.go   steps the ranks agree on: shared prologue verdicts, step
//	              numbers from the communicator's sequence
//	peer.go       the engine's side of the exchange with other sidecars:
//	              PeerRecord (ranks.Record), SetPeerOut, Peer, PeerLeft
//	emit.go       holding gaps until a step clock runs, delivering them to
//	              their step
//	samples.go    each thread's recent CPU samples; the code (and its
//	              caller) they name in a gap
//	faultreads.go each thread's bursts of page faults on mapped files
//	              (KindFaultRead); their time in a gap's cpu given to
//	              io.read of the file
//	sampledcalls.go the share of a gap's cpu its thread's samples found in
//	              short reads and writes, given to io.read and io.write
//	steps.go      the stepper: sync history, fixed windows, the mode it
//	              counts steps by (the detection itself is stepclock's)
//	final.go      when a step is final, and emitting it
//	stepsite.go   the step site: declared or found in the calls' stacks
//	clocksummary.go the step clock each process's steps came from
//	              (StepClock, the summary's step_clock)
//	giveback.go   micro-batch steps laid before an optimizer step's site
//	              was found, laid again by its calls
//	clock.go      the stepper under the work clock: the token ring,
//	              detection, laying a clock's steps over the ring
//	premarks.go   a marked launch's clock before the tracer marked it:
//	              the key each of its steps holds once cuts the ring
//	clockstate.go the running clock: its recent steps' syncs, insertions,
//	              the ring's tokens settled by GPM
//	accum.go      gradient accumulation: a clock's steps grouped into the
//	              loop's iterations
//	launchgroup.go the groups that no sync marks: launches by position,
//	              the grouping kept, realigned and refuted; the batch
//	              copy's clock kept against marked launches
//	marker.go     framework markers (PyTorch's optimizer step) ending steps
//	probemode.go  under auto, which probe set decided each span of time
//	micro.go      micro idle of a finished step and its cause split; launch
//	              records that weigh the windows' busy time
//	windows.go    device: GPU windows, idle and SM activity over intervals
//	stack.go      the summary's call sites (CallSiteSummary) and the
//	              stack helpers attribute defines, under correlate's name
//	types.go      the results (Gap, Step, StepResult, Summary) and Sink;
//	              Cause and the evidence types, attribute's under their
//	              correlate names
//	jsonl.go      the --gaps-out writer and Tee
//	input.go      Input, the engine's inputs as one interface
//	stepclock/    Detect, DetectPeriod and the types they compare
//	interval/     sorted disjoint interval lists (Span, Add, Overlap)
//	reorder/      Queue: events held until the watermark, end order
//	queue/        Streams: per-stream pending work and drains; Burst, a
//	              thread's trailing work; FirstOps, which operation is the
//	              first GPU work after a sync (lite ends a gap there);
//	              Ahead, blocking while the queue held work
//	attribute/    Thread (activity timelines), causes, Attribution and its
//	              Result (cause, breakdown, evidence), stacks
//	record/       the recording format, Writer, Reader, Replay, ReplayAs
//	              and Wrap, which records each input before passing it on
//	ranks/        Registry: communicators and their groups across
//	              processes, collective matching and lateness, linking by
//	              collectives, peers' mirrored communicators
//
// # Memory
//
// Everything is trimmed once final: thread timelines to the oldest step not
// yet emitted (at most maxIntervals per thread), windows and gap spans to
// what pending steps still need, sync history to a ring, evidence lists to
// the top entries by time. Exited processes and threads are forgotten, and
// so are non-feeding processes silent for 10 minutes once more than 256 are
// known (lost exit events). Fixed windows skip ahead over a clock jump.
// The reorder queue holds at most Config.MaxBuffered events (65536, about
// 17 MiB): past it the oldest are processed before the watermark reaches
// them and the watermark moves to their end. Nothing of this is silent:
// late and forced events, dropped timeline intervals, steps emitted
// incomplete and gaps delivered after their step are counted (Losses).
package correlate
