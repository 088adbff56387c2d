package live

import (
	"fmt"
	"slices"
	"strings"
)

// Hang is one hang as the live view and the summary show it.
type Hang struct {
	ID      string
	Text    string // the detector's one-line reason
	Seconds float64
	Ongoing bool
}

// SetHang records a hang as it begins, lasts and ends (same ID). The view
// shows ongoing ones as a banner at the top and every hang's time on a
// line of its own: a hang's time is in no cause's share.
func (a *Aggregator) SetHang(h Hang) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.hangs == nil {
		a.hangs = map[string]Hang{}
	}
	a.hangs[h.ID] = h
}

func (a *Aggregator) hangList() []Hang {
	out := make([]Hang, 0, len(a.hangs))
	for _, h := range a.hangs {
		out = append(out, h)
	}
	slices.SortFunc(out, func(x, y Hang) int { return strings.Compare(x.ID, y.ID) })
	return out
}

// writeHangs writes the banner of the ongoing hangs and the line that
// totals every hang.
func writeHangs(b *strings.Builder, v View, width int) {
	if len(v.Hangs) == 0 {
		return
	}
	var total float64
	ongoing := 0
	for _, h := range v.Hangs {
		total += h.Seconds
		if h.Ongoing {
			ongoing++
			fmt.Fprintf(b, "!! HANG %.0fs: %s\n", h.Seconds, trimRight(Escape(h.Text), max(20, width-16)))
		}
	}
	fmt.Fprintf(b, "hangs: %d (%d ongoing), %.1f s hung, not in the causes below\n", len(v.Hangs), ongoing, total)
}

// hangsLog is the log line's part for hangs.
func hangsLog(v View) string {
	if len(v.Hangs) == 0 {
		return ""
	}
	var total float64
	ongoing := 0
	for _, h := range v.Hangs {
		total += h.Seconds
		if h.Ongoing {
			ongoing++
		}
	}
	return fmt.Sprintf(" hangs=%d hangs_ongoing=%d hung_s=%.1f", len(v.Hangs), ongoing, total)
}
