package live

import (
	"fmt"

	"github.com/gaptrace/gaptrace/correlate"
)

// ExportStats are the span export's counters since the start.
type ExportStats struct {
	Exported, Dropped, Errors uint64
	Failing                   bool // the last export failed
}

// exportLine says how a span export that has failed stands; "" while
// every export succeeded.
func exportLine(e ExportStats) string {
	if e.Errors == 0 && e.Dropped == 0 {
		return ""
	}
	state := "failing"
	if !e.Failing {
		state = "working again"
	}
	if e.Errors == 0 {
		state = "queue full"
	}
	return fmt.Sprintf("span export %s: %d failed exports, %d spans dropped, %d exported", state, e.Errors, e.Dropped, e.Exported)
}

// sumNS totals a by-cause map.
func sumNS(m map[correlate.Cause]int64) int64 {
	var n int64
	for _, ns := range m {
		n += ns
	}
	return n
}
