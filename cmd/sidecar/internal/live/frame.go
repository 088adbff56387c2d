package live

import (
	"fmt"
	"strings"

	"github.com/gaptrace/gaptrace/correlate"
)

// Frame renders the live view of v, width columns wide. The same text is
// used for the terminal and (as the body) for the final summary.
func Frame(v View, width int) string {
	width = max(60, min(width, 120))
	var b strings.Builder
	fmt.Fprintf(&b, "gaptrace · %s · %s\n", Escape(v.Title), formatElapsed(v.Elapsed))
	fmt.Fprintf(&b, "steps %d (%.1f/s)%s   GPU idle %s   gaps %d   dropped events %d\n",
		v.Steps, v.StepsPerSec, windowsNote(v.Windows), pct(v.IdlePct), v.Gaps, v.Stats.Drops)
	writeStepClock(&b, v, width)
	writeHangs(&b, v, width)
	writeLosses(&b, v.Losses, width)
	if v.Stats.Peers != "" {
		fmt.Fprintf(&b, "peers: %s\n", trimRight(Escape(v.Stats.Peers), width-7))
	}
	if l := exportLine(v.Stats.Export); l != "" {
		b.WriteString(l + "\n")
	}
	if v.Probes == correlate.ProbesAuto {
		// Gaps outside the windows are decided as lite decides them.
		fmt.Fprintf(&b, "probes auto: %.1f%% of the time at full (per-launch probes), the rest lite\n", 100*v.FullShare)
	}
	writeCauses(&b, v, width)
	writeWhatIf(&b, v)
	writeEvidence(&b, v, width)
	writeSites(&b, v, width)
	writeCode(&b, v, width)
	if v.CPUPct >= 0 {
		fmt.Fprintf(&b, "gaptrace itself: %.1f%% of a core · %s peak resident · %.0f events/s\n",
			v.CPUPct, FormatBytes(uint64(max(0, v.Stats.RSSBytes))), v.EventsPerSec)
	}
	if v.LastGap != nil {
		g := v.LastGap
		probes := ""
		if g.Probes != "" {
			probes = ", probes " + g.Probes
		}
		fmt.Fprintf(&b, "last gap: %s %s (pid %d tid %d, step %d%s)\n", FormatNS(g.Duration), g.Cause, g.PID, g.TID, g.Step, probes)
		if c := g.Evidence.Collective; c != nil && (c.LatePID != 0 || c.LateRank != nil) {
			who := fmt.Sprintf("pid %d (rank unknown)", c.LatePID)
			if c.LateRank != nil {
				who = fmt.Sprintf("rank %d (pid %d)", *c.LateRank, c.LatePID)
			}
			if c.LateSidecar != "" {
				// Traced by another sidecar of the job (--peers): its pid
				// is that sidecar's view.
				who = fmt.Sprintf("%s, sidecar %s", strings.TrimSuffix(who, ")"), c.LateSidecar) + ")"
			}
			fmt.Fprintf(&b, "  waited on %s, %s late\n", Escape(who), FormatNS(c.LateByNS))
		}
		if d := gapDetail(g); d != "" {
			b.WriteString("  " + trimRight(Escape(d), max(20, width-2)) + "\n")
		}
		if hs := g.Evidence.LockHolders; len(hs) > 0 {
			b.WriteString("  " + trimRight(Escape(holderLine(hs[0])), max(20, width-2)) + "\n")
		}
		if l := codeLine(g); l != "" {
			b.WriteString("  " + trimRight(Escape(l), max(20, width-2)) + "\n")
		}
	}
	return b.String()
}

// holderLine says which thread a gap's feeder waited on and what that
// thread did meanwhile.
func holderLine(h correlate.LockHolderEvidence) string {
	who := fmt.Sprintf("tid %d", h.TID)
	if h.Comm != "" {
		who += " (" + h.Comm + ")"
	}
	d := fmt.Sprintf("waited %s on %s", FormatNS(h.NS), who)
	switch h.Doing {
	case "":
	case correlate.CauseCPU:
		d += ", which computed holding the lock"
	case correlate.CauseSleep:
		d += ", which slept holding the lock"
	default:
		d += ", which was in " + string(h.Doing)
	}
	switch {
	case h.File != "":
		d += " on " + h.File
	case h.Peer != "":
		d += " with " + h.Peer
	}
	if len(h.Code) > 0 {
		d += fmt.Sprintf(", in %s (%s)", h.Code[0].Site(), samplesOf(h.Code[0].Samples))
	}
	return d
}

// codeLine names the code the samples found running in a gap: "code:
// train.py:88 collate (6 samples), util.py:30 burn (1 sample)".
func codeLine(g *correlate.Gap) string {
	var parts []string
	for _, c := range g.Code {
		if c.Role != correlate.RoleFeeder || len(parts) == 3 {
			continue
		}
		site := c.Site()
		if c.GC {
			site += " in gc.collect"
		}
		parts = append(parts, fmt.Sprintf("%s (%s)", site, samplesOf(c.Samples)))
	}
	if len(parts) == 0 {
		return ""
	}
	return "code: " + strings.Join(parts, ", ")
}

// gapDetail is the one line that says what a gap's copy or host operation
// was, when it has one.
func gapDetail(g *correlate.Gap) string {
	if c := g.Evidence.Copy; c != nil {
		d := fmt.Sprintf("%s %s %.1f MB at %.1f GB/s", c.Call, c.Direction, float64(c.Bytes)/1e6, c.GBps)
		if c.Pageable {
			d = "pageable " + d
		}
		if c.Fix != "" {
			d += ": " + c.Fix
		}
		return d
	}
	if cs := g.Evidence.Children; len(cs) > 0 {
		return fmt.Sprintf("waited for child pid %d: %s", cs[0].PID, cs[0].Command)
	}
	if e := g.Evidence.Episode; e != nil {
		return fmt.Sprintf("%s %s: %d copies %s, serialization %s, %d writes %s, fsync %s", e.Kind, e.File,
			e.Copies, FormatNS(e.CopyNS), FormatNS(e.SerializeNS), e.Writes, FormatNS(e.WriteNS), FormatNS(e.FsyncNS))
	}
	return ""
}

func writeCauses(b *strings.Builder, v View, width int) {
	if len(v.ByCause) == 0 {
		b.WriteString("\nidle by cause: nothing attributed yet\n")
		return
	}
	fmt.Fprintf(b, "\nidle by cause (%s lost of %s)\n", FormatNS(v.LostNS), FormatNS(v.WallNS))
	barW := width - 16 - 10 - 8 - 4
	for _, c := range v.ByCause {
		fmt.Fprintf(b, "  %-15s %s %9s %6.1f%%\n", c.Cause, Bar(c.Share, barW), FormatNS(c.NS), 100*c.Share)
	}
}

func trimLeft(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return "…" + string(r[len(r)-n+1:])
}

func writeEvidence(b *strings.Builder, v View, width int) {
	nameW := width - 41
	if len(v.TopFiles) > 0 {
		fmt.Fprintf(b, "\ntop files%s %9s %10s\n", strings.Repeat(" ", max(0, nameW+15-9)), "blocked", "bytes")
		for _, f := range v.TopFiles {
			fmt.Fprintf(b, "  %-*s %-*s %9s %10s\n", nameW, trimLeft(Escape(f.Name), nameW), opsNoteWidth, Escape(f.Note), FormatNS(f.NS), FormatBytes(f.Bytes))
		}
		if o := v.OtherFiles; o != nil {
			fmt.Fprintf(b, "  %-*s %-*s %9s %10s\n", nameW, o.Name, opsNoteWidth, "", FormatNS(o.NS), FormatBytes(o.Bytes))
		}
	}
	if len(v.TopPeers) > 0 {
		fmt.Fprintf(b, "\ntop peers%s %9s %10s\n", strings.Repeat(" ", max(0, nameW+15-9)), "blocked", "bytes")
		for _, p := range v.TopPeers {
			fmt.Fprintf(b, "  %-*s %-11s %9s %10s\n", nameW, trimLeft(Escape(p.Name+" "+p.Note), nameW), "", FormatNS(p.NS), FormatBytes(p.Bytes))
		}
		if o := v.OtherPeers; o != nil {
			fmt.Fprintf(b, "  %-*s %-11s %9s %10s\n", nameW, o.Name, "", FormatNS(o.NS), FormatBytes(o.Bytes))
		}
	}
}

// lossNames are the engine's loss counters as the views name them, in
// the order they are shown: the live line's label, the log line's key.
var lossNames = []struct {
	label, key string
	n          func(*correlate.Losses) uint64
}{
	{"late events", "late", func(l *correlate.Losses) uint64 { return l.LateEvents }},
	{"forced events", "forced", func(l *correlate.Losses) uint64 { return l.ForcedEvents }},
	{"incomplete steps", "incomplete_steps", func(l *correlate.Losses) uint64 { return l.IncompleteSteps }},
	{"gaps after their step", "gaps_after_step", func(l *correlate.Losses) uint64 { return l.GapsAfterStep }},
	{"dropped intervals", "dropped_intervals", func(l *correlate.Losses) uint64 { return l.DroppedIntervals }},
}

// writeLosses names the engine's losses that are not zero under the line
// that says how many events were dropped, where one looks for what a
// sidecar that falls behind lost; nothing when none.
func writeLosses(b *strings.Builder, l correlate.Losses, width int) {
	line := ""
	for _, n := range lossNames {
		c := n.n(&l)
		if c == 0 {
			continue
		}
		item := fmt.Sprintf("%s %d", n.label, c)
		if line != "" && len(line)+3+len(item) > width {
			b.WriteString(line + "\n")
			line = ""
		}
		if line == "" {
			line = "  " + item
		} else {
			line += "   " + item
		}
	}
	if line != "" {
		b.WriteString(line + "\n")
	}
}

// windowsNote says how many fixed windows stood in for steps, if any.
func windowsNote(n int64) string {
	switch n {
	case 0:
		return ""
	case 1:
		return " + 1 window"
	}
	return fmt.Sprintf(" + %d windows", n)
}

// writeStepClock names what the steps are counted by, for the process
// with the most steps: the site a user can pin with --step-at, or the
// work pattern's operation.
func writeStepClock(b *strings.Builder, v View, width int) {
	if len(v.StepClocks) == 0 {
		return
	}
	c := v.StepClocks[0]
	line := "step clock: " + c.Source
	if c.Site != "" {
		line += " · " + c.Site
	}
	if pin := PinSite(c); pin != "" && c.Source == "call_site" {
		line += " (pin with --step-at " + pin + ")"
	}
	if n := len(v.StepClocks); n > 1 {
		line += fmt.Sprintf(" · %d processes", n)
	}
	b.WriteString(trimRight(Escape(line), width) + "\n")
}

// PinSite is the --step-at value that names a step clock's site
// ("train.py:42" of "train.py:42 main"), "" when it has no line.
func PinSite(c correlate.StepClock) string {
	at, _, ok := strings.Cut(c.Site, " ")
	if !ok || !strings.Contains(at, ":") {
		return ""
	}
	return at
}
