package tracer

import (
	"strings"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/event"
)

// TestAutoLaunchToggle traces simtrain under ProbesAuto, attaches the
// per-launch probes for one window in the middle of the run and detaches
// them again: enqueues are seen inside the window only, and the launches
// they count are the ones simtrain made there.
func TestAutoLaunchToggle(t *testing.T) {
	type toggles struct{ on, off LaunchToggle }
	done := make(chan toggles, 1)
	var attachedDuring []ProbeInfo
	hook := func(tr *Tracer, pid int) {
		if ps := tr.Processes(); len(ps) != 1 || ps[0] != pid {
			t.Errorf("Processes() = %v, want [%d]", ps, pid)
		}
		// A window before simtrain runs: what attaches is what detaches.
		on, err1 := tr.SetLaunchProbes(true)
		off, err2 := tr.SetLaunchProbes(false)
		if err1 != nil || err2 != nil || on.Links == 0 || off.Links != on.Links {
			t.Errorf("idle window: attached %d (%v), detached %d (%v)", on.Links, err1, off.Links, err2)
		}
		go func() {
			var tg toggles
			var err error
			time.Sleep(300 * time.Millisecond)
			if tg.on, err = tr.SetLaunchProbes(true); err != nil {
				t.Errorf("attach launch probes: %v", err)
			}
			attachedDuring = tr.Stats().Attached
			time.Sleep(500 * time.Millisecond)
			if tg.off, err = tr.SetLaunchProbes(false); err != nil {
				t.Errorf("detach launch probes: %v", err)
			}
			done <- tg
		}()
	}
	r := runSimtrainWith(t, ProbesAuto, hook, "--steps", "3000", "--kernels-per-step", "10", "--kernel-us", "50")
	tg := <-done
	t.Logf("attach: %d links in %v; detach: %d links in %v", tg.on.Links, tg.on.Took, tg.off.Links, tg.off.Took)
	if tg.on.Links == 0 || tg.off.Links != tg.on.Links {
		t.Fatalf("attached %d launch links, detached %d", tg.on.Links, tg.off.Links)
	}
	for _, p := range r.attached {
		if strings.HasPrefix(p.Symbol, "cuLaunch") || strings.HasPrefix(p.Symbol, "cuGraphLaunch") {
			t.Errorf("auto: %s probed before any window", p.Symbol)
		}
	}
	launchProbed := false
	for _, p := range attachedDuring {
		launchProbed = launchProbed || p.Symbol == "cuLaunchKernel"
	}
	if !launchProbed {
		t.Error("cuLaunchKernel not listed as attached during the window")
	}
	var end int64
	for _, rec := range r.calls("launch_count") {
		end = max(end, mono(rec.End))
	}
	if end < tg.off.At {
		t.Fatalf("simtrain ended (%d) before the window closed (%d): the run is too short for this machine", end, tg.off.At)
	}
	main := r.meta.PID
	var inside int
	var counted uint64
	for _, ev := range r.kind(event.KindEnqueue, main) {
		// The ring buffer is read after the fact: a probe that fired
		// while the links were being attached or closed lies just
		// outside [on.At, off.At], by at most the time that took.
		if ev.Start < tg.on.At-int64(tg.on.Took) || ev.Start > tg.off.At+int64(tg.off.Took) {
			t.Errorf("enqueue at %d outside the window [%d,%d]", ev.Start, tg.on.At, tg.off.At)
			continue
		}
		inside++
		counted += ev.Count
	}
	var syncCounted uint64
	for _, ev := range r.kind(event.KindSync, main) {
		syncCounted += ev.Count
	}
	// Launches made inside the window, from simtrain's own clock.
	var truth uint64
	for _, rec := range r.calls("launch_count") {
		if mono(rec.Start) >= tg.on.At && mono(rec.End) <= tg.off.At {
			truth += rec.Count
		}
	}
	if inside == 0 || truth == 0 {
		t.Fatalf("%d enqueues inside the window, simtrain launched %d there", inside, truth)
	}
	if got := counted + syncCounted; got < truth {
		t.Errorf("launches counted %d, simtrain made %d inside the window", got, truth)
	}
}
