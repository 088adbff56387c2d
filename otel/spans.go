package otel

import (
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/event"
)

// Span names.
const (
	SpanStep = "train.step"
	SpanGap  = "gpu.idle"
)

func ms(ns int64) float64 { return float64(ns) / 1e6 }

func unix(ns int64) time.Time { return time.Unix(0, ns) }

// workloadAttributes names the process's container and pod with the OTel
// semantic conventions (container.id, k8s.*); a DaemonSet traces many pods,
// so they go on each span, not only on the resource.
func workloadAttributes(w *correlate.Workload) []attribute.KeyValue {
	if w == nil {
		return nil
	}
	var a []attribute.KeyValue
	if w.NSPID != 0 {
		a = append(a, attribute.Int64("gaptrace.process.ns_pid", int64(w.NSPID)))
	}
	if w.Rank != nil {
		a = append(a, attribute.Int("gaptrace.rank", *w.Rank))
	}
	for _, kv := range []struct{ k, v string }{
		{"container.id", w.ContainerID},
		{"k8s.pod.uid", w.PodUID},
		{"k8s.pod.name", w.PodName},
		{"k8s.namespace.name", w.PodNamespace},
		{"k8s.container.name", w.ContainerName},
	} {
		if kv.v != "" {
			a = append(a, attribute.String(kv.k, kv.v))
		}
	}
	return a
}

// stepAttrsRoom: the room stepAttributes allocates beyond the step's
// causes: 11 fixed attributes, 7 of a workload, 3 of the window and clock,
// 16 of the hardware, the job and rank emitStep adds, and as many what-if
// savings as causes.
var stepAttrsRoom = 39 + len(correlate.Causes)

// idleKeys and whatIfKeys are the per-cause attribute keys, built once
// (a key built per step and cause was a string allocation each).
var idleKeys, whatIfKeys = func() (idle, whatIf map[correlate.Cause]attribute.Key) {
	idle, whatIf = map[correlate.Cause]attribute.Key{}, map[correlate.Cause]attribute.Key{}
	for _, c := range correlate.Causes {
		idle[c] = attribute.Key("gpu.step.idle." + string(c))
		whatIf[c] = attribute.Key("gpu.step.what_if." + string(c) + "_ms")
	}
	return idle, whatIf
}()

// gapAttrsRoom: the room gapAttributes allocates beyond the gap's causes
// and syscall counts, enough for most gaps' evidence: growing from six
// attributes by appends reallocated a gap's attributes three or four
// times.
const gapAttrsRoom = 40

// breakdownKeys are the gap's per-cause attribute keys, built once.
var breakdownKeys = func() map[correlate.Cause]attribute.Key {
	m := map[correlate.Cause]attribute.Key{}
	for _, c := range correlate.Causes {
		m[c] = attribute.Key("gpu.gap.breakdown." + string(c))
	}
	return m
}()

// stepAttributes are a step span's attributes, in one allocation with
// room for appendWhatIf's.
func stepAttributes(s correlate.Step) []attribute.KeyValue {
	a := make([]attribute.KeyValue, 0, stepAttrsRoom+len(s.ByCause))
	a = append(a,
		attribute.Int64("gpu.step.number", s.Number),
		attribute.Float64("gpu.step.duration_ms", ms(s.End-s.Start)),
		attribute.Float64("gpu.step.idle_ms", ms(s.IdleNS)),
		attribute.Float64("gpu.step.bounded_idle_ms", ms(s.BoundedIdleNS)),
		attribute.Float64("gpu.step.micro_idle_ms", ms(s.MicroIdleNS)),
		attribute.Float64("gpu.step.stall_ms", ms(s.StallNS)),
		attribute.Float64("gpu.step.idle_ratio", s.IdleRatio),
		attribute.Int("gpu.step.gaps", s.Gaps),
		attribute.Int64("gpu.step.launches", int64(s.Launches)),
		attribute.Int("gpu.device", s.Device),
		semconv.ProcessPID(int(s.PID)),
	)
	a = append(a, workloadAttributes(s.Workload)...)
	if s.Window {
		a = append(a, attribute.Bool("gpu.step.window", true))
	}
	if s.ClockSource != "" {
		// What ended the step: the step site (declared or found), a
		// framework's marker, or the work pattern's operation.
		a = append(a, attribute.String("gpu.step.clock.source", s.ClockSource))
		if s.ClockSite != "" {
			a = append(a, attribute.String("gpu.step.clock.site", s.ClockSite))
		}
	}
	for _, c := range correlate.Causes {
		if ns := s.ByCause[c]; ns > 0 {
			a = append(a, idleKeys[c].Float64(ms(ns)))
		}
	}
	if hw := s.HW; hw != nil {
		a = appendHW(a, hw)
	}
	return a
}

// appendHW appends the GPU's state during the step to a.
func appendHW(a []attribute.KeyValue, hw *event.HWContext) []attribute.KeyValue {
	if hw.Name != "" {
		a = append(a, attribute.String("gpu.name", hw.Name))
	}
	if hw.UUID != "" {
		a = append(a, attribute.String("gpu.uuid", hw.UUID))
	}
	if hw.SMClockMHz > 0 {
		a = append(a, attribute.Int64("gpu.clock.sm_mhz", int64(hw.SMClockMHz)),
			attribute.Int64("gpu.clock.sm_max_mhz", int64(hw.MaxSMClockMHz)))
	}
	if len(hw.ThrottleReasons) > 0 {
		a = append(a, attribute.StringSlice("gpu.throttle_reasons", hw.ThrottleReasons))
	}
	if hw.TemperatureC > 0 {
		a = append(a, attribute.Int64("gpu.temperature_c", int64(hw.TemperatureC)))
		if hw.SlowdownTempC > 0 {
			a = append(a, attribute.Int64("gpu.temperature.slowdown_c", int64(hw.SlowdownTempC)))
		}
	}
	if hw.PCIeGen > 0 {
		a = append(a, attribute.Int64("gpu.pcie.gen", int64(hw.PCIeGen)), attribute.Int64("gpu.pcie.max_gen", int64(hw.PCIeMaxGen)),
			attribute.Int64("gpu.pcie.width", int64(hw.PCIeWidth)), attribute.Int64("gpu.pcie.max_width", int64(hw.PCIeMaxWidth)))
	}
	if hw.MemTotalBytes > 0 {
		a = append(a, attribute.Int64("gpu.memory.used_bytes", int64(hw.MemUsedBytes)),
			attribute.Int64("gpu.memory.total_bytes", int64(hw.MemTotalBytes)))
	}
	if hw.SMActivity >= 0 {
		a = append(a, attribute.Float64("gpu.sm_activity", hw.SMActivity))
	}
	if len(hw.OtherProcesses) > 0 {
		a = append(a, attribute.Int64Slice("gpu.other_processes", u32s(hw.OtherProcesses)))
	}
	if len(hw.XidErrors) > 0 {
		x := make([]int64, len(hw.XidErrors))
		for i, v := range hw.XidErrors {
			x[i] = int64(v)
		}
		a = append(a, attribute.Int64Slice("gpu.xid_errors", x))
	}
	return a
}

// addStepEvents marks what a user should not miss in a step: hardware
// conditions that slow busy time rather than create gaps.
func addStepEvents(sp *directSpan, s correlate.Step) {
	hw := s.HW
	if hw == nil {
		return
	}
	at := s.Start
	for _, xid := range hw.XidErrors {
		sp.addEvent("gpu.xid", at, attribute.Int64("gpu.xid", int64(xid)))
	}
	if len(hw.ThrottleReasons) > 0 {
		sp.addEvent("gpu.throttled", at, attribute.StringSlice("gpu.throttle_reasons", hw.ThrottleReasons))
	}
	if hw.PCIeMaxWidth > 0 && (hw.PCIeWidth < hw.PCIeMaxWidth || hw.PCIeGen < hw.PCIeMaxGen) {
		sp.addEvent("gpu.pcie.degraded", at,
			attribute.String("gpu.pcie.link", fmt.Sprintf("gen%d x%d of gen%d x%d", hw.PCIeGen, hw.PCIeWidth, hw.PCIeMaxGen, hw.PCIeMaxWidth)))
	}
	if len(hw.OtherProcesses) > 0 {
		sp.addEvent("gpu.shared", at, attribute.Int64Slice("gpu.other_processes", u32s(hw.OtherProcesses)))
	}
}

func u32s(v []uint32) []int64 {
	out := make([]int64, len(v))
	for i, x := range v {
		out[i] = int64(x)
	}
	return out
}

// gapAttributes names evidence with OTel semantic conventions where one
// exists (file.path, network.peer.address, process.pid, thread.id); the
// single-valued attributes carry the heaviest item, the gpu.gap.* slices all
// of them.
func gapAttributes(g *correlate.Gap) []attribute.KeyValue {
	a := make([]attribute.KeyValue, 0, gapAttrsRoom+len(g.Breakdown)+len(g.Evidence.Syscalls))
	a = append(a,
		attribute.String("gpu.gap.cause", string(g.Cause)),
		attribute.String("gpu.gap.kind", string(orKind(g.Kind))),
		attribute.Float64("gpu.gap.duration_ms", ms(gapDuration(g))),
		attribute.Int64("gpu.step.number", g.Step),
		attribute.Int("gpu.device", g.Device),
		semconv.ProcessPID(int(g.PID)),
	)
	a = append(a, workloadAttributes(g.Workload)...)
	if g.Evidence.Source != "" {
		a = append(a, attribute.String("gpu.gap.source", g.Evidence.Source))
	}
	if g.Probes != "" {
		// Probe set auto: which set decided this gap.
		a = append(a, attribute.String("gpu.gap.probes", g.Probes))
	}
	if g.TID != 0 {
		a = append(a, semconv.ThreadID(int(g.TID)))
	}
	for _, c := range correlate.Causes {
		if ns := g.Breakdown[c]; ns > 0 {
			a = append(a, breakdownKeys[c].Float64(ms(ns)))
		}
	}
	ev := &g.Evidence
	a = codeAttributes(a, g)
	a = fileAttributes(a, ev)
	a = peerAttributes(a, ev)
	a = workerAttributes(a, ev)
	a = lockAttributes(a, ev)
	if len(ev.Children) > 0 {
		// The child process waited for longest (cause subprocess).
		c := ev.Children[0]
		if c.PID != 0 {
			a = append(a, attribute.Int64("gpu.gap.child.pid", int64(c.PID)))
		}
		if c.Command != "" {
			a = append(a, attribute.String("gpu.gap.child.command", c.Command))
		}
	}
	a = collectiveAttributes(a, ev.Collective)
	if ev.SMActivity != nil {
		a = append(a, attribute.Float64("gpu.gap.sm_activity", *ev.SMActivity))
	}
	if ev.BaselineNS > 0 {
		a = append(a, attribute.Float64("gpu.gap.baseline_ms", ms(ev.BaselineNS)))
	}
	if ev.CUDACall != "" {
		a = append(a, attribute.String("gpu.cuda.call", ev.CUDACall))
	}
	a = copyAttributes(a, ev)
	for _, k := range sortedKeys(ev.Syscalls) {
		a = append(a, attribute.Int("gpu.gap.syscalls."+k, ev.Syscalls[k]))
	}
	if len(ev.Threads) > 0 {
		a = append(a, attribute.Int64Slice("gpu.gap.threads", u32s(ev.Threads)))
	}
	return a
}

// stackAttributes adds the code location behind the gap (semconv code.*).
func stackAttributes(a []attribute.KeyValue, ev *correlate.Evidence) []attribute.KeyValue {
	if f, ok := correlate.SiteFrame(ev.Stack); ok {
		a = append(a, attribute.String("code.function.name", f.Function),
			attribute.String("code.stacktrace", correlate.FormatStack(ev.Stack, ev.StackTruncated)))
		if f.File != "" {
			a = append(a, attribute.String("code.file.path", f.Where()))
		}
		if f.Line > 0 {
			a = append(a, attribute.Int("code.line.number", f.Line))
		}
	}
	return a
}

// fileAttributes adds the files the feeder read or wrote.
func fileAttributes(a []attribute.KeyValue, ev *correlate.Evidence) []attribute.KeyValue {
	// Items whose path or address could not be resolved carry "" and are
	// left out: an empty file.path is worse than none.
	top := -1
	var paths []string
	var bytes uint64
	for i, f := range ev.Files {
		bytes += f.Bytes
		if f.Path == "" {
			continue
		}
		paths = append(paths, f.Path)
		if top < 0 || f.NS > ev.Files[top].NS {
			top = i
		}
	}
	if top >= 0 {
		a = append(a, semconv.FilePath(ev.Files[top].Path),
			attribute.String("gpu.gap.file.op", ev.Files[top].Op),
			attribute.StringSlice("gpu.gap.files", paths))
	}
	if len(ev.Files) > 0 {
		a = append(a, attribute.Int64("gpu.gap.io.bytes", int64(bytes)))
	}
	return a
}

// peerAttributes adds the socket peers the feeder talked to.
func peerAttributes(a []attribute.KeyValue, ev *correlate.Evidence) []attribute.KeyValue {
	top := -1
	var peers []string
	var netBytes uint64
	for i, p := range ev.Peers {
		netBytes += p.Bytes
		if p.Address == "" {
			continue
		}
		peers = append(peers, p.Address)
		if top < 0 || p.NS > ev.Peers[top].NS {
			top = i
		}
	}
	if top >= 0 {
		p := ev.Peers[top]
		a = append(a, attribute.String("network.peer.address", p.Address),
			attribute.StringSlice("gpu.gap.peers", peers))
		if p.PID != 0 {
			a = append(a, attribute.Int64("gpu.gap.peer.process.pid", int64(p.PID)))
		}
		if p.Comm != "" {
			a = append(a, attribute.String("gpu.gap.peer.process.name", p.Comm))
		}
	}
	if len(ev.Peers) > 0 {
		a = append(a, attribute.Int64("gpu.gap.net.bytes", int64(netBytes)))
	}
	return a
}

// workerAttributes adds what the data-loader workers did.
func workerAttributes(a []attribute.KeyValue, ev *correlate.Evidence) []attribute.KeyValue {
	if len(ev.Workers) > 0 {
		pids := make([]int64, len(ev.Workers))
		acts := make([]string, len(ev.Workers))
		for i, w := range ev.Workers {
			pids[i] = int64(w.PID)
			acts[i] = w.Activity
		}
		a = append(a, attribute.Int64Slice("gpu.gap.worker.pids", pids),
			attribute.StringSlice("gpu.gap.worker.activity", acts))
		var files []string
		for _, w := range ev.Workers {
			files = append(files, w.Files...)
		}
		if len(files) > 0 {
			a = append(a, attribute.StringSlice("gpu.gap.worker.files", files))
		}
	}
	return a
}

// lockAttributes adds the threads that held the lock the feeder waited on.
func lockAttributes(a []attribute.KeyValue, ev *correlate.Evidence) []attribute.KeyValue {
	if len(ev.LockHolders) > 0 {
		// The thread the feeder waited on longest (first), and all of them.
		h := ev.LockHolders[0]
		a = append(a, attribute.Int64("gpu.gap.lock.holder.tid", int64(h.TID)))
		if h.Comm != "" {
			a = append(a, attribute.String("gpu.gap.lock.holder.name", h.Comm))
		}
		if h.Doing != "" {
			a = append(a, attribute.String("gpu.gap.lock.holder.doing", string(h.Doing)))
		}
		if h.File != "" {
			a = append(a, attribute.String("gpu.gap.lock.holder.file", h.File))
		}
		if h.Peer != "" {
			a = append(a, attribute.String("gpu.gap.lock.holder.peer", h.Peer))
		}
		if h.RunnableNS > 0 {
			// A holder starved of a CPU still held the lock.
			a = append(a, attribute.Float64("gpu.gap.lock.holder.runnable_ms", float64(h.RunnableNS)/1e6))
		}
		if len(h.Code) > 0 {
			a = append(a, attribute.String("gpu.gap.lock.holder.code", h.Code[0].Site()),
				attribute.Int("gpu.gap.lock.holder.code.samples", h.Code[0].Samples))
		}
		tids := make([]int64, len(ev.LockHolders))
		for i, h := range ev.LockHolders {
			tids[i] = int64(h.TID)
		}
		a = append(a, attribute.Int64Slice("gpu.gap.lock.holder.tids", tids))
	}
	return a
}

// collectiveAttributes adds the collective a stall waited on.
func collectiveAttributes(a []attribute.KeyValue, c *correlate.CollectiveEvidence) []attribute.KeyValue {
	if c == nil {
		return a
	}
	a = append(a, attribute.String("gpu.collective.op", c.Op), attribute.Int64("gpu.collective.bytes", int64(c.Bytes)))
	if c.Comm != "" {
		a = append(a, attribute.String("gpu.collective.comm", c.Comm))
	}
	if c.PeerRank != 0 {
		a = append(a, attribute.Int64("gpu.collective.peer_rank", int64(c.PeerRank)))
	}
	if c.Stream != "" {
		a = append(a, attribute.String("gpu.collective.stream", c.Stream))
	}
	if c.Ranks > 0 && c.Rank != nil {
		a = append(a, attribute.Int64("gpu.collective.ranks", int64(c.Ranks)), attribute.Int64("gpu.collective.rank", int64(*c.Rank)))
	}
	if len(c.WaitingOn) > 0 {
		w := make([]int64, len(c.WaitingOn))
		for i, r := range c.WaitingOn {
			w[i] = int64(r)
		}
		a = append(a, attribute.Int64Slice("gpu.collective.waiting_on_ranks", w))
	}
	// The late process is named even where its rank is unknown (its
	// communicator was linked by its collectives, no RANK said it).
	if c.LateRank != nil {
		a = append(a, attribute.Int64("gpu.collective.late_rank", int64(*c.LateRank)))
	}
	if c.LateRank != nil || c.LatePID != 0 {
		a = append(a, attribute.Float64("gpu.collective.late_by_ms", ms(c.LateByNS)))
	}
	if c.LatePID != 0 {
		a = append(a, attribute.Int64("gpu.collective.late_pid", int64(c.LatePID)))
	}
	if c.LateSidecar != "" {
		a = append(a, attribute.String("gpu.collective.late_sidecar", c.LateSidecar))
	}
	return a
}

// copyAttributes adds the staged copy and the host operation that moved
// device data inside the gap.
func copyAttributes(a []attribute.KeyValue, ev *correlate.Evidence) []attribute.KeyValue {
	if c := ev.Copy; c != nil {
		a = append(a, attribute.String("gpu.gap.copy.call", c.Call), attribute.String("gpu.gap.copy.direction", c.Direction),
			attribute.Int64("gpu.gap.copy.bytes", int64(c.Bytes)), attribute.Float64("gpu.gap.copy.ms", ms(c.NS)),
			attribute.Float64("gpu.gap.copy.gb_per_s", c.GBps), attribute.Bool("gpu.gap.copy.pageable", c.Pageable))
		if c.Fix != "" {
			a = append(a, attribute.String("gpu.gap.fix", c.Fix))
		}
	}
	if e := ev.Episode; e != nil {
		a = append(a, attribute.String("gpu.gap.episode.kind", e.Kind),
			attribute.Int("gpu.gap.episode.copies", e.Copies), attribute.Int64("gpu.gap.episode.copy_bytes", int64(e.CopyBytes)),
			attribute.Float64("gpu.gap.episode.copy_ms", ms(e.CopyNS)), attribute.Float64("gpu.gap.episode.serialize_ms", ms(e.SerializeNS)),
			attribute.Int("gpu.gap.episode.writes", e.Writes), attribute.Int64("gpu.gap.episode.write_bytes", int64(e.WriteBytes)),
			attribute.Float64("gpu.gap.episode.write_ms", ms(e.WriteNS)), attribute.Float64("gpu.gap.episode.fsync_ms", ms(e.FsyncNS)))
		if e.File != "" {
			a = append(a, attribute.String("gpu.gap.episode.file", e.File))
		}
	}
	return a
}

func orKind(k correlate.GapKind) correlate.GapKind {
	if k == "" {
		return correlate.GapIdle
	}
	return k
}

func gapDuration(g *correlate.Gap) int64 {
	if g.Duration > 0 {
		return g.Duration
	}
	return g.End - g.Start
}

// claimRoot reports whether this exporter should emit step n's train.step
// root (job mode): true the first time n is seen. Steps arrive roughly in
// order per device, so remembering the last rootMemory numbers suffices.
func (x *Exporter) claimRoot(n int64) bool {
	x.rootMu.Lock()
	defer x.rootMu.Unlock()
	if _, ok := x.roots[n]; ok {
		return false
	}
	if x.roots == nil {
		x.roots = make(map[int64]struct{}, rootMemory)
	}
	x.roots[n] = struct{}{}
	x.rootOrder = append(x.rootOrder, n)
	if len(x.rootOrder) > rootMemory {
		delete(x.roots, x.rootOrder[0])
		x.rootOrder = x.rootOrder[1:]
	}
	return true
}

const rootMemory = 4096
