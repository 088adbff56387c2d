package cli

import (
	"strings"
	"testing"

	"github.com/gaptrace/gaptrace/correlate"
)

func TestProcessesInSummary(t *testing.T) {
	var p processes
	rank := 1
	w := &correlate.Workload{ContainerID: strings.Repeat("ab", 32), PodName: "train-0", PodNamespace: "ml", ContainerName: "trainer", Rank: &rank}
	for range 3 {
		p.Step(correlate.StepResult{Step: correlate.Step{PID: 7, Workload: w}})
	}
	p.Gap(correlate.Gap{PID: 7, Workload: w})
	p.Gap(correlate.Gap{PID: 3, Workload: &correlate.Workload{ContainerID: strings.Repeat("cd", 32)}})
	p.Step(correlate.StepResult{Step: correlate.Step{PID: 9}})
	ps := p.list()
	if len(ps) != 3 || ps[0].PID != 3 || ps[1].PID != 7 || ps[1].Steps != 3 || ps[1].Gaps != 1 || ps[1].Workload != w {
		t.Fatalf("processes %+v", ps)
	}
	got := where(ps)
	want := "container abababababab · pod ml/train-0 (trainer) · and 1 more container"
	if got != want {
		t.Errorf("where = %q, want %q", got, want)
	}
	if got := where([]correlate.ProcessSummary{{PID: 1, Steps: 5}}); got != "" {
		t.Errorf("a host process: where = %q, want nothing", got)
	}
}
