package live

import (
	"fmt"
	"strings"
	"time"

	"github.com/gaptrace/gaptrace/whatif"
)

// whatIfMin is the smallest saving worth a row: below half a percent of
// the step, a fix is not worth anyone's time.
const whatIfMin = 0.005

func shownWhatIf(es []whatif.Estimate, n int) []whatif.Estimate {
	var out []whatif.Estimate
	for _, e := range es {
		if len(out) == n {
			break
		}
		if e.SavedFraction >= whatIfMin {
			out = append(out, e)
		}
	}
	return out
}

// formatSaving prints a per-step saving with one decimal below 10 ms,
// where whole milliseconds would round most savings away.
func formatSaving(ns int64) string {
	if ns >= int64(time.Millisecond) && ns < 10*int64(time.Millisecond) {
		return fmt.Sprintf("%.1f ms", float64(ns)/1e6)
	}
	return FormatNS(ns)
}

// writeWhatIf writes one line in the live view, a block in the summary:
// per cause, the step time saved without it and the fix that removes it.
// A cause seen in few steps (a periodic checkpoint) says so, since its
// per-step figure is an average over steps that mostly did not pay it.
func writeWhatIf(b *strings.Builder, v View) {
	if !v.whatIfBlock {
		es := shownWhatIf(v.WhatIf, 2)
		if len(es) == 0 {
			return
		}
		parts := make([]string, len(es))
		for i, e := range es {
			parts[i] = fmt.Sprintf("%s −%s/step (−%.1f%%)", e.Cause, formatSaving(e.SavedNSPerStep), 100*e.SavedFraction)
		}
		fmt.Fprintf(b, "what if: without %s\n", strings.Join(parts, ", "))
		return
	}
	es := shownWhatIf(v.WhatIf, 5)
	if len(es) == 0 {
		return
	}
	b.WriteString("\nwhat if (step time saved per step, each cause removed alone)\n")
	for _, e := range es {
		fmt.Fprintf(b, "  without %-15s −%s/step (−%.1f%%) — %s\n", e.Cause, formatSaving(e.SavedNSPerStep), 100*e.SavedFraction, e.Fix)
		if v.Steps > 0 && e.Steps*10 < v.Steps*9 {
			fmt.Fprintf(b, "          %-15s paid in %d of %d steps, up to %s in one\n", "", min(e.Steps, v.Steps), v.Steps, formatSaving(e.MaxNS))
		}
	}
}
