package correlate

import (
	"fmt"
	"sort"

	"github.com/gaptrace/gaptrace/correlate/stepclock"
)

// What a process's steps were counted by, for the summary's step_clock,
// the live view and the train.step spans.

// clockSource is the step clock steps end by now: its source and site
// (declared, call site) or what the work pattern counts.
func (s *stepper) clockSource() (source, site string) {
	switch s.mode {
	case modeSite:
		return s.sites.source, s.sites.name
	case modeClock:
		if c := s.clock; c != nil {
			return stepclock.SourceWork, fmt.Sprintf("%s ×%d", c.key.String(), c.m)
		}
	case modePeriod:
		return stepclock.SourceWork, fmt.Sprintf("every %d syncs", s.period)
	}
	return stepclock.SourceWork, "fixed windows"
}

// StepClock says what a process's steps were counted by: the source
// (declared, framework, call_site, work_pattern) and the site it found,
// for a user to pin with --step-at, or what the work pattern counted.
type StepClock struct {
	PID    uint32 `json:"pid"`
	Source string `json:"source"`
	Site   string `json:"site,omitempty"`
	Steps  int64  `json:"steps"`
	// BySource: the steps each source ended, where more than one did.
	BySource map[string]int64 `json:"by_source,omitempty"`
}

// noteClock counts an emitted step to its process's step clock.
func (e *Engine) noteClock(st *Step) {
	if st.Window {
		return
	}
	if e.clocks == nil {
		e.clocks = map[uint32]*StepClock{}
	}
	c := e.clocks[st.PID]
	if c == nil {
		c = &StepClock{PID: st.PID, BySource: map[string]int64{}}
		e.clocks[st.PID] = c
	}
	c.Steps++
	c.BySource[st.ClockSource]++
	if c.Source == st.ClockSource || c.BySource[st.ClockSource] > c.BySource[c.Source] {
		// The source that ended the most steps, at its latest site.
		c.Source, c.Site = st.ClockSource, st.ClockSite
	}
}

// stepClocks lists the processes' step clocks, most steps first.
func (e *Engine) stepClocks() []StepClock {
	out := make([]StepClock, 0, len(e.clocks))
	for _, c := range e.clocks {
		v := *c
		v.BySource = nil
		if len(c.BySource) > 1 {
			v.BySource = make(map[string]int64, len(c.BySource))
			for k, n := range c.BySource {
				v.BySource[k] = n
			}
		}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Steps != out[j].Steps {
			return out[i].Steps > out[j].Steps
		}
		return out[i].PID < out[j].PID
	})
	return out
}
