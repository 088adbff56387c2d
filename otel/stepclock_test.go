package otel

import (
	"testing"

	"github.com/gaptrace/gaptrace/correlate"
)

// The train.step span names what ended the step, and only when known.
func TestStepClockAttributes(t *testing.T) {
	find := func(st correlate.Step) map[string]string {
		m := map[string]string{}
		for _, kv := range stepAttributes(st) {
			if k := string(kv.Key); k == "gpu.step.clock.source" || k == "gpu.step.clock.site" {
				m[k] = kv.Value.AsString()
			}
		}
		return m
	}
	m := find(correlate.Step{ClockSource: "call_site", ClockSite: "train.py:42 main"})
	if m["gpu.step.clock.source"] != "call_site" || m["gpu.step.clock.site"] != "train.py:42 main" {
		t.Fatalf("attributes %v, want the call site", m)
	}
	if m := find(correlate.Step{}); len(m) != 0 {
		t.Fatalf("attributes %v for a step with no clock, want none", m)
	}
}
