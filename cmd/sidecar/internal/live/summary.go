package live

import (
	"fmt"
	"slices"
	"strings"
)

// Outputs names the files a session wrote, for the summary.
type Outputs struct {
	Gaps, Spans, Summary, OTLP, Prometheus string
	Trace                                  string // --perfetto-out
	Windows                                string // --windows-out
	Record                                 string // --record
}

// Summary renders the final summary of a session.
func Summary(v View, out Outputs, width int) string {
	var b strings.Builder
	rule := strings.Repeat("─", max(60, min(width, 120)))
	b.WriteString(rule + "\n")
	b.WriteString("summary\n")
	v.whatIfBlock = true
	b.WriteString(Frame(v, width))
	if len(v.Stats.Missing) > 0 {
		fmt.Fprintf(&b, "\nprobes not attached (%d): %s\n", len(v.Stats.Missing), Escape(missingList(v.Stats.Missing, 6)))
	}
	if v.Steps == 0 && v.Windows == 0 && v.Gaps == 0 {
		b.WriteString("\nno GPU activity was attributed: the target made no CUDA calls gaptrace could see\n" +
			"(is libcuda.so loaded by it? run `gaptrace check --pid PID`)\n")
	}
	var files []string
	for _, f := range []struct{ what, path string }{
		{"gaps", out.Gaps}, {"spans", out.Spans}, {"summary", out.Summary}, {"OTLP", out.OTLP}, {"metrics", out.Prometheus},
		{"trace", out.Trace}, {"windows", out.Windows}, {"record", out.Record},
	} {
		if f.path != "" {
			files = append(files, fmt.Sprintf("  %-8s %s", f.what, Escape(f.path)))
		}
	}
	if len(files) > 0 {
		b.WriteString("\noutputs\n" + strings.Join(files, "\n") + "\n")
	}
	b.WriteString(rule + "\n")
	return b.String()
}

// missingList shortens the tracer's "library path: symbol NAME" warnings
// to distinct names, at most n of them.
func missingList(missing []string, n int) string {
	var names []string
	for _, m := range missing {
		if i := strings.LastIndex(m, "symbol "); i >= 0 {
			m = m[i+len("symbol "):]
		}
		if !slices.Contains(names, m) {
			names = append(names, m)
		}
	}
	if len(names) > n {
		return strings.Join(names[:n], ", ") + fmt.Sprintf(", … (%d more)", len(names)-n)
	}
	return strings.Join(names, ", ")
}
