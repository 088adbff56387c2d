package tracer

import "testing"

// TestSourceName: a compiler clone's suffixes are cut, any other dot kept.
func TestSourceName(t *testing.T) {
	for in, want := range map[string]string{
		"augment_batch.constprop.0":       "augment_batch",
		"step.part.0.cold":                "step",
		"load.isra.0":                     "load",
		"main.cold":                       "main",
		"f.lto_priv.0":                    "f",
		"g.llvm.12345678901234567":        "g",
		"_ZN5torch4stepEv.constprop.3":    "_ZN5torch4stepEv",
		"plain":                           "plain",
		"version.2":                       "version.2",
		"a.b":                             "a.b",
		".cold":                           ".cold",
		"PyEval_EvalFrameDefault.cold.12": "PyEval_EvalFrameDefault",
	} {
		if got := sourceName(in); got != want {
			t.Errorf("sourceName(%q) = %q, want %q", in, got, want)
		}
	}
}
