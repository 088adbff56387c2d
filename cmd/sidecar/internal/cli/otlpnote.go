package cli

import (
	"fmt"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/live"
)

// otlpNote qualifies the OTLP endpoint in the summary's outputs: one that
// received nothing is not listed as if it had.
func otlpNote(e live.ExportStats) string {
	switch {
	case e.Exported == 0 && (e.Errors > 0 || e.Dropped > 0):
		return fmt.Sprintf(" (NOT reached: %d failed exports, %d spans dropped; see the warning above)", e.Errors, e.Dropped)
	case e.Dropped > 0:
		return fmt.Sprintf(" (INCOMPLETE: %d spans exported, %d dropped, %d failed exports)", e.Exported, e.Dropped, e.Errors)
	}
	return ""
}
