package correlate

import (
	"github.com/gaptrace/gaptrace/correlate/attribute"
	"github.com/gaptrace/gaptrace/event"
)

// CallSiteSummary is the idle time behind one code location: the innermost
// frame of the job's own code in the gaps' stacks.
type CallSiteSummary struct {
	Site     string          `json:"site"` // "train.py:142 save_checkpoint"
	Function string          `json:"function"`
	File     string          `json:"file,omitempty"`
	Line     int             `json:"line,omitempty"`
	Gaps     int64           `json:"gaps"`
	NS       int64           `json:"ns"`
	ByCause  map[Cause]int64 `json:"by_cause"`
}

// UserFrame is the index of the innermost frame of the job's own code
// (attribute.UserFrame).
func UserFrame(stack []event.Frame) int { return attribute.UserFrame(stack) }

// SiteFrame is the frame a gap is charged to (attribute.SiteFrame).
func SiteFrame(stack []event.Frame) (event.Frame, bool) { return attribute.SiteFrame(stack) }

// CallSite names a frame the way a person finds it (attribute.CallSite).
func CallSite(f event.Frame) string { return attribute.CallSite(f) }

// FormatStack renders a stack one frame a line, innermost first
// (attribute.FormatStack).
func FormatStack(stack []event.Frame, truncated bool) string {
	return attribute.FormatStack(stack, truncated)
}
