package live

import (
	"fmt"
	"strings"
	"time"
)

// LogLine renders v as one line for logs (stdout not a terminal).
func LogLine(v View) string {
	var b strings.Builder
	fmt.Fprintf(&b, "gaptrace elapsed=%s steps=%d rate=%.1f/s gpu_idle=%s gaps=%d drops=%d",
		v.Elapsed.Round(time.Second), v.Steps, v.StepsPerSec, pct(v.IdlePct), v.Gaps, v.Stats.Drops)
	if v.Windows > 0 {
		fmt.Fprintf(&b, " windows=%d", v.Windows)
	}
	if e := v.Stats.Export; e.Errors > 0 || e.Dropped > 0 {
		fmt.Fprintf(&b, " export_errors=%d export_dropped=%d export_failing=%t", e.Errors, e.Dropped, e.Failing)
	}
	b.WriteString(hangsLog(v))
	for _, n := range lossNames {
		if c := n.n(&v.Losses); c > 0 {
			fmt.Fprintf(&b, " %s=%d", n.key, c)
		}
	}
	if len(v.ByCause) > 0 {
		b.WriteString(" causes=")
		for i, c := range v.ByCause {
			if i == 4 {
				break
			}
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%s:%.0f%%", c.Cause, 100*c.Share)
		}
	}
	if w := shownWhatIf(v.WhatIf, 1); len(w) > 0 {
		fmt.Fprintf(&b, " what_if=%s:-%s/step:-%.1f%%", w[0].Cause, strings.ReplaceAll(formatSaving(w[0].SavedNSPerStep), " ", ""), 100*w[0].SavedFraction)
	}
	if len(v.TopFiles) > 0 {
		fmt.Fprintf(&b, " top_file=%s", logValue(v.TopFiles[0].Name))
	}
	if len(v.TopPeers) > 0 {
		fmt.Fprintf(&b, " top_peer=%s", logValue(v.TopPeers[0].Name))
	}
	if len(v.TopSites) > 0 {
		fmt.Fprintf(&b, " top_site=%s", logValue(v.TopSites[0].Name))
	}
	if len(v.TopCode) > 0 {
		fmt.Fprintf(&b, " top_cpu_code=%s", logValue(v.TopCode[0].Name))
	}
	return b.String()
}
