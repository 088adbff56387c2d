package otel

import (
	"go.opentelemetry.io/otel/attribute"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/whatif"
)

// appendWhatIf appends, per cause, how much shorter this step would have
// been without it (gpu.step.what_if.<cause>_ms): the step's own saving,
// not amortized, so a checkpoint step shows its whole cost.
func appendWhatIf(a []attribute.KeyValue, s correlate.Step, gaps []correlate.Gap) []attribute.KeyValue {
	saved := whatif.ForStep(s, gaps)
	for _, c := range correlate.Causes {
		if ns := saved[c]; ns > 0 {
			a = append(a, whatIfKeys[c].Float64(ms(ns)))
		}
	}
	return a
}
