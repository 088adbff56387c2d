package live

import (
	"fmt"
	"strings"
	"time"
)

// Bar draws a bar of width cells for a fraction 0..1, with eighth-block
// resolution so small shares still show.
func Bar(frac float64, width int) string {
	frac = max(0, min(1, frac))
	eighths := int(frac*float64(width*8) + 0.5)
	full, rem := eighths/8, eighths%8
	var b strings.Builder
	b.WriteString(strings.Repeat("█", full))
	cells := full
	if rem > 0 {
		b.WriteRune([]rune("▏▎▍▌▋▊▉")[rem-1])
		cells++
	}
	b.WriteString(strings.Repeat("·", width-cells))
	return b.String()
}

// FormatNS prints a duration in the unit a person reads fastest.
func FormatNS(ns int64) string {
	d := time.Duration(ns)
	switch {
	case d >= 100*time.Second:
		return fmt.Sprintf("%.0f s", d.Seconds())
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.0f ms", float64(d)/1e6)
	case d >= time.Microsecond:
		return fmt.Sprintf("%.0f µs", float64(d)/1e3)
	}
	return fmt.Sprintf("%d ns", ns)
}

// FormatBytes prints a byte count in binary units.
func FormatBytes(b uint64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(b)/float64(div), "KMGTPE"[exp])
}

func formatElapsed(d time.Duration) string {
	s := int(d.Seconds())
	return fmt.Sprintf("%02d:%02d:%02d", s/3600, s/60%60, s%60)
}

func pct(p float64) string {
	if p < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f%%", p)
}
