package otel_test

import (
	"fmt"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/event"
	"github.com/gaptrace/gaptrace/otel"
)

// synth builds a step and its gaps the way the correlator would: a 100 ms
// step with one stall whose cause rotates through io.read, net, io.write
// and comm, each with its evidence and host operations inside the gap.
type synth struct {
	pid    uint32
	device int
	t0     int64 // unix ns of step 0
}

const stepNS = int64(100 * time.Millisecond)

var rotation = []correlate.Cause{correlate.CauseIORead, correlate.CauseNet, correlate.CauseIOWrite, correlate.CauseComm}

func (s synth) step(n int64) (correlate.Step, []correlate.Gap) {
	start := s.t0 + n*stepNS
	end := start + stepNS
	cause := rotation[int(n)%len(rotation)]
	gs := start + 10*int64(time.Millisecond)
	ge := gs + 30*int64(time.Millisecond)
	g := correlate.Gap{
		PID: s.pid, TID: s.pid + 1, Device: s.device, Step: n, Kind: correlate.GapIdle,
		Start: gs, End: ge, Duration: ge - gs, Cause: cause,
		Breakdown: map[correlate.Cause]int64{cause: 28 * int64(time.Millisecond), correlate.CauseCPU: 2 * int64(time.Millisecond)},
		Evidence:  correlate.Evidence{Source: "host", Threads: []uint32{s.pid + 1}},
	}
	op := func(name string, a, b int64, attrs map[string]string) correlate.HostOp {
		return correlate.HostOp{Name: name, TID: s.pid + 1, Start: gs + a*int64(time.Millisecond), End: gs + b*int64(time.Millisecond), Attrs: attrs}
	}
	switch cause {
	case correlate.CauseIORead:
		path := fmt.Sprintf("/data/shard-%03d.bin", n)
		g.Evidence.Files = []correlate.FileEvidence{{Path: path, Op: "read", Bytes: 8 << 20, Calls: 4, NS: 27e6}}
		g.Evidence.Syscalls = map[string]int{"read": 4}
		g.Ops = []correlate.HostOp{op("read", 1, 28, map[string]string{"file.path": path})}
	case correlate.CauseNet:
		g.Evidence.Peers = []correlate.PeerEvidence{{Address: "10.1.2.3:443", Bytes: 4096, Calls: 2, NS: 27e6}}
		g.Evidence.Syscalls = map[string]int{"sendto": 1, "recvfrom": 1}
		g.Ops = []correlate.HostOp{
			op("sendto", 1, 3, map[string]string{"network.peer.address": "10.1.2.3:443"}),
			op("recvfrom", 3, 28, map[string]string{"network.peer.address": "10.1.2.3:443"}),
		}
	case correlate.CauseIOWrite:
		path := fmt.Sprintf("/ckpt/step_%d.pt", n)
		g.Evidence.Files = []correlate.FileEvidence{{Path: path, Op: "write", Bytes: 64 << 20, Calls: 16, NS: 27e6}}
		g.Evidence.Episode = &correlate.EpisodeEvidence{Kind: "checkpoint", File: path, Copies: 16, CopyBytes: 64 << 20,
			CopyNS: 2e6, SerializeNS: 10e6, Writes: 16, WriteBytes: 64 << 20, WriteNS: 19e6, FsyncNS: 8e6}
		g.Ops = []correlate.HostOp{
			op("write", 1, 20, map[string]string{"file.path": path}),
			op("fsync", 20, 28, map[string]string{"file.path": path}),
		}
	case correlate.CauseComm:
		g.Kind = correlate.GapStall
		rank, late := int32(0), int32(1)
		g.Evidence.Collective = &correlate.CollectiveEvidence{Op: "AllReduce", Bytes: 25 << 20, Comm: "0x7f00aa", PeerRank: 1,
			Ranks: 2, Rank: &rank, WaitingOn: []int32{1}, LateRank: &late, LatePID: s.pid + 7, LateByNS: 27e6}
		g.Evidence.CUDACall = "cuStreamSynchronize"
		sm := 0.25
		g.Evidence.SMActivity, g.Evidence.BaselineNS = &sm, 5e6
		g.Ops = []correlate.HostOp{
			op("ncclAllReduce", 0, 1, map[string]string{"gpu.collective.op": "AllReduce"}),
			op("cuStreamSynchronize", 1, 29, nil),
		}
	}
	st := correlate.Step{
		PID: s.pid, Device: s.device, Number: n, Start: start, End: end,
		IdleNS: 35e6, BoundedIdleNS: 30e6, MicroIdleNS: 5e6, IdleRatio: 0.35,
		ByCause:  map[correlate.Cause]int64{cause: 28e6, correlate.CauseCPU: 7e6},
		Gaps:     1,
		Launches: 420,
		HW: &event.HWContext{Name: "NVIDIA H200", UUID: "GPU-0000", SMClockMHz: 1980, MaxSMClockMHz: 1980,
			PCIeGen: 5, PCIeMaxGen: 5, PCIeWidth: 16, PCIeMaxWidth: 16, SMActivity: 0.62},
	}
	if cause == correlate.CauseComm {
		st.StallNS = 28e6
	}
	return st, []correlate.Gap{g}
}

// deliver feeds x as the engine does: each gap as it is decided, then the
// step that carries them.
func deliver(x *otel.Exporter, st correlate.Step, gaps ...correlate.Gap) {
	for _, g := range gaps {
		x.Gap(g)
	}
	x.Step(correlate.StepResult{Step: st, GapList: gaps})
}
