package live

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/gaptrace/gaptrace/correlate"
)

// siteAgg is the idle time behind one call site (correlate.CallSite of a
// gap's innermost user frame).
type siteAgg struct {
	sum correlate.CallSiteSummary
}

// addSite charges g to its call site; gaps without a stack are not charged.
// Called with a.mu held.
func (a *Aggregator) addSite(g *correlate.Gap) {
	f, ok := correlate.SiteFrame(g.Evidence.Stack)
	if !ok {
		return
	}
	key := correlate.CallSite(f)
	if a.sites == nil {
		a.sites = map[string]*siteAgg{}
	}
	s := a.sites[key]
	if s == nil {
		if len(a.sites) >= maxTracked {
			// Like files: the site with the least time makes room, so the
			// sites that matter stay named in a bounded table.
			evictSmallest(a.sites, func(s *siteAgg) (int64, uint64, int) { return s.sum.NS, 0, int(s.sum.Gaps) }, &a.otherSites)
		}
		s = &siteAgg{sum: correlate.CallSiteSummary{Site: key, Function: f.Function, File: f.Where(), Line: f.Line,
			ByCause: map[correlate.Cause]int64{}}}
		a.sites[key] = s
	}
	s.sum.Gaps++
	s.sum.NS += g.Duration
	if len(g.Breakdown) > 0 {
		for c, ns := range g.Breakdown {
			s.sum.ByCause[c] += ns
		}
	} else {
		s.sum.ByCause[g.Cause] += g.Duration
	}
}

// CallSites returns the n call sites with the most idle time, most first
// (the --summary-json call_sites).
func (a *Aggregator) CallSites(n int) []correlate.CallSiteSummary {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.topSites(n)
}

// topSites: with a.mu held.
func (a *Aggregator) topSites(n int) []correlate.CallSiteSummary {
	out := make([]correlate.CallSiteSummary, 0, len(a.sites))
	for _, s := range a.sites {
		c := s.sum
		c.ByCause = make(map[correlate.Cause]int64, len(s.sum.ByCause))
		for k, v := range s.sum.ByCause {
			c.ByCause[k] = v
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(x, y correlate.CallSiteSummary) int {
		return cmp.Or(cmp.Compare(y.NS, x.NS), cmp.Compare(x.Site, y.Site))
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// siteItem renders a call site as a view row: "12 gaps, 1.80 s io.write,
// 20 ms cpu" (its two largest causes).
func siteItem(s correlate.CallSiteSummary) TopItem {
	var b strings.Builder
	fmt.Fprintf(&b, "%d gap", s.Gaps)
	if s.Gaps != 1 {
		b.WriteByte('s')
	}
	for i, c := range CauseShares(s.ByCause) {
		if i == 2 {
			break
		}
		fmt.Fprintf(&b, ", %s %s", FormatNS(c.NS), c.Cause)
	}
	return TopItem{Name: s.Site, Note: b.String(), NS: s.NS, Calls: int(s.Gaps)}
}

func writeSites(b *strings.Builder, v View, width int) {
	if len(v.TopSites) == 0 {
		return
	}
	b.WriteString("\ntop call sites\n")
	for _, s := range v.TopSites {
		line := Escape(s.Name) + " — " + s.Note
		fmt.Fprintf(b, "  %s\n", trimRight(line, max(20, width-2)))
	}
}

func trimRight(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
