package otel

import (
	"go.opentelemetry.io/otel/attribute"

	"github.com/gaptrace/gaptrace/correlate"
)

// codeAttributes adds the code behind the gap: for a gap the CPU burned,
// the most sampled code of its own thread (semconv code.*, the blocking
// stack beside it); otherwise the blocking call's stack. Every sampled
// site, with its samples and the role of the thread that ran it, goes into
// gpu.gap.code.*.
func codeAttributes(a []attribute.KeyValue, g *correlate.Gap) []attribute.KeyValue {
	if len(g.Code) == 0 {
		return stackAttributes(a, &g.Evidence)
	}
	sites := make([]string, len(g.Code))
	counts := make([]int64, len(g.Code))
	roles := make([]string, len(g.Code))
	for i, c := range g.Code {
		sites[i], counts[i], roles[i] = c.Site(), int64(c.Samples), c.Role
	}
	a = append(a, attribute.StringSlice("gpu.gap.code.sites", sites), attribute.Int64Slice("gpu.gap.code.samples", counts),
		attribute.StringSlice("gpu.gap.code.roles", roles))
	top := g.Code[0]
	if top.Role != correlate.RoleFeeder || (g.Cause != correlate.CauseCPU && g.Cause != correlate.CauseCPUContention) {
		return stackAttributes(a, &g.Evidence)
	}
	a = append(a, attribute.String("code.function.name", top.Function), attribute.Int("gpu.gap.code.top_samples", top.Samples))
	if top.File != "" {
		a = append(a, attribute.String("code.file.path", top.File))
	}
	if top.Line > 0 {
		a = append(a, attribute.Int("code.line.number", top.Line))
	}
	if len(g.Evidence.Stack) > 0 {
		a = append(a, attribute.String("code.stacktrace", correlate.FormatStack(g.Evidence.Stack, g.Evidence.StackTruncated)))
	}
	return a
}
