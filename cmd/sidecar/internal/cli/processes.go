package cli

import (
	"cmp"
	"slices"
	"strconv"
	"sync"

	"github.com/gaptrace/gaptrace/correlate"
)

// processes is a sink that remembers which processes had steps and gaps,
// and where each runs (container, pod, rank), for the summary.
type processes struct {
	mu sync.Mutex
	by map[uint32]*correlate.ProcessSummary
}

// maxSummaryProcesses bounds the list on a node whose jobs fork without end.
const maxSummaryProcesses = 1024

func (p *processes) get(pid uint32, w *correlate.Workload) *correlate.ProcessSummary {
	if p.by == nil {
		p.by = map[uint32]*correlate.ProcessSummary{}
	}
	ps := p.by[pid]
	if ps == nil {
		if len(p.by) >= maxSummaryProcesses {
			return &correlate.ProcessSummary{}
		}
		ps = &correlate.ProcessSummary{PID: pid}
		p.by[pid] = ps
	}
	if ps.Workload == nil {
		ps.Workload = w
	}
	return ps
}

func (p *processes) Gap(g correlate.Gap) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.get(g.PID, g.Workload).Gaps++
}

func (p *processes) Step(s correlate.StepResult) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ps := p.get(s.PID, s.Workload)
	if s.Window {
		ps.Windows++
	} else {
		ps.Steps++
	}
}

// list returns the processes by pid.
func (p *processes) list() []correlate.ProcessSummary {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]correlate.ProcessSummary, 0, len(p.by))
	for _, ps := range p.by {
		out = append(out, *ps)
	}
	slices.SortFunc(out, func(a, b correlate.ProcessSummary) int { return cmp.Compare(a.PID, b.PID) })
	return out
}

// where says in one line where the traced processes run, for the summary's
// title: the container and pod of the one with the most steps, and how
// many other containers there were. "" when none runs in a container.
func where(ps []correlate.ProcessSummary) string {
	var main *correlate.ProcessSummary
	containers := map[string]bool{}
	for i := range ps {
		w := ps[i].Workload
		if w == nil || w.ContainerID == "" {
			continue
		}
		containers[w.ContainerID] = true
		if main == nil || ps[i].Steps > main.Steps {
			main = &ps[i]
		}
	}
	if main == nil {
		return ""
	}
	w := main.Workload
	s := "container " + w.ContainerID[:min(12, len(w.ContainerID))]
	if w.PodName != "" {
		s += " · pod " + w.PodNamespace + "/" + w.PodName
		if w.ContainerName != "" {
			s += " (" + w.ContainerName + ")"
		}
	} else if w.PodUID != "" {
		s += " · pod uid " + w.PodUID
	}
	if n := len(containers) - 1; n > 0 {
		s += " · and " + strconv.Itoa(n) + " more container"
		if n > 1 {
			s += "s"
		}
	}
	return s
}
