package correlate

import (
	"github.com/gaptrace/gaptrace/correlate/stepclock"
	"github.com/gaptrace/gaptrace/event"
)

// Steps from framework markers (event.KindMarker): once a process enters
// PyTorch's optimizer step (or, without one, the profiler's step), each
// such marker ends a step, wherever the syncs come from. A step is one
// optimizer step: a gradient-accumulation loop reads its loss once per
// micro-batch, so its call site recurs several times per step, while its
// optimizer steps once. stepclock.FrameworkClock picks the marker; the
// stepper runs under modeSite with the framework as the source, which a
// call site does not unseat. A declared site (--step-at) wins over it.

// onMarker feeds one framework marker to p's step clock.
func (p *proc) onMarker(x env, ev *event.Event) {
	if p.st.onMarker(x.set, ev) {
		p.resolveHeld(x, false)
	}
}

// onMarker reports whether a step ended at the marker.
func (s *stepper) onMarker(set settings, ev *event.Event) bool {
	if set.stepAt != nil {
		return false
	}
	if s.mode == modeUnknown && s.origin == 0 {
		// No launch or sync came before it: attached mid-loop, the
		// marker's probe (libtorch's) went in before libcuda's. The first
		// iteration seen begins here, not at the clock's zero.
		s.origin = ev.End
	}
	prev := s.fw
	var ends bool
	s.fw, ends = s.fw.Take(stepclock.Marker{TID: ev.TID, Name: ev.Name, T: ev.End})
	if !ends {
		return false
	}
	if s.fw == prev {
		// A whole interval between two markers of the running clock.
		s.fwMost, s.fwSpans = max(s.fwMost, s.fwCalls), s.fwSpans+1
	}
	s.fwCalls = 0
	c := &s.sites
	if s.fw != prev || s.mode != modeSite || c.source != stepclock.SourceFramework {
		c.source, c.name, c.key, c.strikes = stepclock.SourceFramework, s.fw.Name, "", 0
		set.log.Info("steps end at a framework marker", "pid", s.pid, "marker", c.name, "tid", ev.TID)
		s.enterSite(nil)
	}
	o := s.openStep()
	if o == nil || ev.End <= o.Start || ev.End <= o.lastGap {
		return false
	}
	// The marker ends the iteration the open step holds, a fixed window
	// until now (the clock's first marker): it is a step.
	o.Window = false
	c.lastAt = ev.End
	s.boundary(ev.End, false)
	return true
}

// fwLostCalls: sited calls without a marker after which the framework
// clock gives way to the call sites, at least; more where the loop makes
// more between two markers (fwLostPer times the most seen); fwLostBare
// where no sited call came between two markers yet. A CUDA-graph loop
// steps its optimizer eagerly in its warm-up and its capture, with no
// read between, then only replays: the markers stop while the loss reads
// go on, and the iterations until the call site takes over are one step.
const (
	fwLostCalls = 32
	fwLostPer   = 4
	fwLostBare  = 2
	fwBareSpans = 2 // intervals between markers seen before fwLostBare applies
)

// frameworkSiteCall takes a sited call under the framework clock: it ends
// no step, unless the markers stopped coming while the calls go on; then
// the call sites take over (a found site, or fixed windows until one is
// found) and a marker that comes later takes the steps back.
func (s *stepper) frameworkSiteCall(set settings, t int64) bool {
	if set.stepAt != nil {
		return false
	}
	limit := max(fwLostCalls, fwLostPer*s.fwMost)
	if s.fwMost == 0 && s.fwSpans >= fwBareSpans {
		limit = fwLostBare
	}
	if s.fwCalls++; s.fwCalls <= limit {
		return false
	}
	c := &s.sites
	set.log.Info("framework markers stopped, steps from the call sites", "pid", s.pid, "marker", c.name, "calls", s.fwCalls)
	s.fw, s.fwCalls, s.fwMost, s.fwSpans = stepclock.FrameworkClock{}, 0, 0, 0
	c.source, c.key, c.name, c.calls, c.strikes = "", "", "", 0, 0
	s.toWindows(t)
	s.checkSite(set)
	return true
}
