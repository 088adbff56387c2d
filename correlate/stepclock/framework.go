package stepclock

import (
	"strings"

	"github.com/gaptrace/gaptrace/event"
)

// Framework markers: the training framework says itself where a step
// ends. PyTorch wraps every optimizer step in a record_function region
// named "Optimizer.step#<Class>.step", even with the profiler off, and its
// profiler names each iteration "ProfilerStep#N"; the tracer reads both
// names (bpf/marker.c). A step is one optimizer step: under gradient
// accumulation the loop reads its loss once per micro-batch, and the call
// site recurs that often, but the optimizer steps once per iteration.

// MarkerClass says which framework marker a name is.
type MarkerClass uint8

const (
	MarkerNone          MarkerClass = iota
	MarkerProfilerStep              // "ProfilerStep#N": clocks where no optimizer step does
	MarkerOptimizerStep             // "Optimizer.step#<Class>.step": clocks first
)

// ClassOf classifies a marker's name.
func ClassOf(name string) MarkerClass {
	switch {
	case strings.HasPrefix(name, event.MarkerOptimizerStep):
		return MarkerOptimizerStep
	case strings.HasPrefix(name, event.MarkerProfilerStep):
		return MarkerProfilerStep
	}
	return MarkerNone
}

// Marker is one framework marker a thread entered at T.
type Marker struct {
	TID  uint32
	Name string
	T    int64
}

// FrameworkClock is the marker that clocks a process's steps: its class,
// the thread that enters it and, for an optimizer, its name (a loop with
// two optimizers of different classes steps once per iteration on the
// first one seen). The zero value clocks nothing yet.
type FrameworkClock struct {
	Class MarkerClass
	TID   uint32
	Name  string
}

// Take says what marker m does to the clock c: the clock after it and
// whether a step ends at m. The first marker of either class starts the
// clock; an optimizer step replaces a profiler step's clock (the
// stronger marker); after that only the clock's own marker, on its own
// thread, ends steps: a profiler step under an optimizer's clock, another
// thread's regions and another optimizer's steps do not.
func (c FrameworkClock) Take(m Marker) (FrameworkClock, bool) {
	class := ClassOf(m.Name)
	switch {
	case class == MarkerNone:
		return c, false
	case class > c.Class:
		return FrameworkClock{Class: class, TID: m.TID, Name: clockName(class, m.Name)}, true
	case class < c.Class || m.TID != c.TID:
		return c, false
	case class == MarkerOptimizerStep:
		return c, m.Name == c.Name
	}
	return c, true
}

// clockName is the site a clock reports: an optimizer step's full name,
// or the profiler's prefix (its number changes every step).
func clockName(class MarkerClass, name string) string {
	if class == MarkerProfilerStep {
		return event.MarkerProfilerStep + "N"
	}
	return name
}

// On says whether the clock started.
func (c FrameworkClock) On() bool { return c.Class != MarkerNone }
