package cli

import (
	"encoding/json"
	"fmt"
	"syscall"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/live"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/regress"
	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/internal/safefile"
	"github.com/gaptrace/gaptrace/whatif"
)

// maxSummaryCallSites: the summary names the call sites that matter, not
// every one the job blocked at.
const maxSummaryCallSites = 10

func writeSummaryJSON(path string, s correlate.Summary, wi []whatif.Estimate, steps *regress.StepIdle, hangs ...live.Hang) error {
	if s.ByCause == nil {
		s.ByCause = map[correlate.Cause]int64{}
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		c := correlate.SidecarCost{}
		if s.Sidecar != nil {
			c = *s.Sidecar // the events it handled, from the pipeline
		}
		c.CPUNS = ru.Utime.Nano() + ru.Stime.Nano()
		c.MaxRSSBytes = ru.Maxrss << 10 // Linux reports KiB
		s.Sidecar = &c
	}
	b, err := json.MarshalIndent(struct {
		correlate.Summary
		// The engine's losses, zeros included: a summary that names
		// none says nothing was lost.
		correlate.Losses
		WhatIf map[correlate.Cause]whatif.JSON `json:"what_if,omitempty"`
		// Each cause's per-step idle moments, for gaptrace diff.
		StepIdle map[string]regress.Moments `json:"step_idle,omitempty"`
		Hangs    *hangTotals                `json:"hangs,omitempty"`
		// What the steps were counted by: the process with the most
		// steps, and every process where several had steps.
		StepClock  *correlate.StepClock  `json:"step_clock,omitempty"`
		StepClocks []correlate.StepClock `json:"step_clocks,omitempty"`
	}{s, s.Losses, whatif.JSONMap(wi), steps.Summary(), totalHangs(hangs), firstClock(s.StepClocks), manyClocks(s.StepClocks)}, "", "  ")
	if err != nil {
		return err
	}
	if err := safefile.WriteAtomic(path, append(b, '\n')); err != nil {
		return fmt.Errorf("write summary %s: %w", path, err)
	}
	return nil
}

func firstClock(cs []correlate.StepClock) *correlate.StepClock {
	if len(cs) == 0 {
		return nil
	}
	return &cs[0]
}

func manyClocks(cs []correlate.StepClock) []correlate.StepClock {
	if len(cs) < 2 {
		return nil
	}
	return cs
}
