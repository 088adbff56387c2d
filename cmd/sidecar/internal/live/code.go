package live

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/gaptrace/gaptrace/correlate"
)

// addCode counts the CPU samples of g's code (correlate.Gap.Code) by site:
// the code that burned the gaps' CPU time. Bounded like the call sites.
// Called with a.mu held.
func (a *Aggregator) addCode(g *correlate.Gap) {
	for _, c := range g.Code {
		key := c.Site()
		if c.GC {
			key += " [gc]"
		}
		if a.code == nil {
			a.code = map[string]*correlate.CodeSummary{}
		}
		s := a.code[key]
		if s == nil {
			if len(a.code) >= maxTracked {
				evictSmallest(a.code, func(s *correlate.CodeSummary) (int64, uint64, int) { return s.Samples, 0, int(s.Gaps) }, &a.otherCode)
			}
			s = &correlate.CodeSummary{Site: key, Function: c.Function, File: c.File, Line: c.Line, Role: c.Role, GC: c.GC}
			a.code[key] = s
		}
		s.Samples += int64(c.Samples)
		s.Gaps++
	}
}

// CPUCode returns the n sites with the most samples in gaps, most first
// (the --summary-json cpu_code).
func (a *Aggregator) CPUCode(n int) []correlate.CodeSummary {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.topCode(n)
}

// topCode: with a.mu held.
func (a *Aggregator) topCode(n int) []correlate.CodeSummary {
	out := make([]correlate.CodeSummary, 0, len(a.code))
	for _, s := range a.code {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(x, y correlate.CodeSummary) int {
		return cmp.Or(cmp.Compare(y.Samples, x.Samples), cmp.Compare(x.Site, y.Site))
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// samplesOf says n samples: "1 sample", "41 samples".
func samplesOf(n int) string {
	if n == 1 {
		return "1 sample"
	}
	return fmt.Sprintf("%d samples", n)
}

// codeItem renders a site as a view row: "41 samples in 12 gaps (holder)".
func codeItem(s correlate.CodeSummary) TopItem {
	var b strings.Builder
	fmt.Fprintf(&b, "%d sample", s.Samples)
	if s.Samples != 1 {
		b.WriteByte('s')
	}
	fmt.Fprintf(&b, " in %d gap", s.Gaps)
	if s.Gaps != 1 {
		b.WriteByte('s')
	}
	if s.Role != correlate.RoleFeeder {
		fmt.Fprintf(&b, " (%s thread)", s.Role)
	}
	return TopItem{Name: s.Site, Note: b.String(), Calls: int(s.Samples)}
}

func writeCode(b *strings.Builder, v View, width int) {
	if len(v.TopCode) == 0 {
		return
	}
	b.WriteString("\ntop code in cpu gaps\n")
	for _, s := range v.TopCode {
		line := Escape(s.Name) + " — " + s.Note
		fmt.Fprintf(b, "  %s\n", trimRight(line, max(20, width-2)))
	}
}
