package correlate

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// thirtySteps is a job's loop before its last act: 30 steps of a pinned
// batch copy, 8 kernels of 2 ms and a sync.
func thirtySteps(lite bool) *gpuSim {
	s := newSim()
	s.lite = lite
	for range 30 {
		s.pinnedCopy(event.CUMemcpyHtoD, 1<<20)
		s.launches(8, 2*ms, 20*us)
		s.sync()
		s.t += 100 * us
	}
	return s
}

// TestFinalCheckpointAtExit: a job whose last act is saving a checkpoint
// (torch.save at the end of training) exits with the gap still open: the
// save is one io.write gap up to its fsync, and the interpreter's exit
// after it is no gap, in full and lite alike.
func TestFinalCheckpointAtExit(t *testing.T) {
	for _, lite := range []bool{false, true} {
		t.Run(map[bool]string{false: "full", true: "lite"}[lite], func(t *testing.T) {
			s := thirtySteps(lite)
			a := s.t
			checkpoint(s, 12)
			saved := s.t
			s.t += 40 * ms // the interpreter exiting
			s.evs = append(s.evs, event.Event{Kind: event.KindExit, PID: s.pid, TID: s.pid, Start: s.t, End: s.t})
			wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
			c := &collect{}
			feed(newEngine(c, func(cfg *Config) {
				if lite {
					cfg.Probes = ProbesLite
				}
			}), c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
			var found []Gap
			for _, g := range bigGaps(c.gaps) {
				if g.End > a {
					found = append(found, g)
				}
			}
			if len(found) != 1 {
				t.Fatalf("%d gaps over the final save, want one: %+v", len(found), found)
			}
			g := found[0]
			if g.Cause != CauseIOWrite || g.Start > a+50*us || g.End != saved || g.Evidence.Episode == nil {
				t.Errorf("gap [%d, %d] %s, want io.write over the save [%d, %d]", g.Start-t0, g.End-t0, g.Cause, a-t0, saved-t0)
			}
		})
	}
}

// TestFinalUploadAtExit: a job that uploads its model after the last
// iteration (or whose logger pushes its last records: wandb.finish) and
// exits holds the GPU idle for the upload: one net gap up to the last
// send, in full and lite alike. A job that only tears down after its last
// step (40 ms of exiting with a write to stdout) has no gap there.
func TestFinalUploadAtExit(t *testing.T) {
	for _, lite := range []bool{false, true} {
		for _, upload := range []bool{true, false} {
			name := map[bool]string{false: "full", true: "lite"}[lite] + map[bool]string{false: "/teardown only", true: "/upload"}[upload]
			t.Run(name, func(t *testing.T) {
				s := thirtySteps(lite)
				a, sent := s.t, int64(0)
				if upload {
					for range 20 {
						s.t += 500 * us // serialising a chunk
						s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysNet, Name: "sendto", FDKind: event.FDSocket,
							PeerAddr: "10.0.0.7:443"}, 8*ms)
					}
					sent = s.t
				}
				s.t += 30 * ms // the interpreter exiting
				s.block(event.Event{Kind: event.KindSyscall, Syscall: event.SysWrite, Name: "write", FDKind: event.FDPipe}, 2*ms)
				s.t += 10 * ms
				s.evs = append(s.evs, event.Event{Kind: event.KindExit, PID: s.pid, TID: s.pid, Start: s.t, End: s.t})
				wins := s.windows(t0, s.t+200*ms, 100*ms, event.SourceNVML, nil)
				c := &collect{}
				feed(newEngine(c, func(cfg *Config) {
					if lite {
						cfg.Probes = ProbesLite
					}
				}), c, s.evs, wins, s.t+2e9, 20*ms, 250*ms)
				var found []Gap
				for _, g := range bigGaps(c.gaps) {
					if g.End > a {
						found = append(found, g)
					}
				}
				if !upload {
					if len(found) != 0 {
						t.Errorf("%d gaps after the last step of a job that only exits: %+v", len(found), found)
					}
					return
				}
				if len(found) != 1 {
					t.Fatalf("%d gaps over the final upload, want one: %+v", len(found), found)
				}
				g := found[0]
				if g.Cause != CauseNet || g.Start > a+50*us || g.End != sent {
					t.Errorf("gap [%d, %d] %s, want net over the upload [%d, %d]", g.Start-t0, g.End-t0, g.Cause, a-t0, sent-t0)
				}
			})
		}
	}
}
