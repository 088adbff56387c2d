package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/live"
)

func TestNearest(t *testing.T) {
	flags := []string{"gaps-out", "spans-out", "summary-json", "live", "pid", "probes", "perfetto-out"}
	for in, want := range map[string]string{
		"gap-out": "gaps-out", "span-out": "spans-out", "summary": "summary-json", "liv": "live",
		"probe": "probes", "perfeto-out": "perfetto-out", "frobnicate": "", "x": "", "out-gaps": "",
	} {
		if got := nearest(in, flags); got != want {
			t.Errorf("nearest(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestUnknownFlagOneLine: a mistyped flag is answered with the nearest
// one and where the options are listed, not with every option's usage.
func TestUnknownFlagOneLine(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--gap-out", "x", "--", "true"}, "gaptrace run: unknown flag --gap-out; did you mean --gaps-out?\n"},
		{[]string{"demo", "-live-of", "off"}, "gaptrace demo: unknown flag --live-of; did you mean --live?\n"},
		{[]string{"attach", "--frobnicate"}, "gaptrace attach: unknown flag --frobnicate\n"},
		{[]string{"run", "--gaps-out"}, "gaptrace run: flag --gaps-out needs a value\n"},
	} {
		var out, errb bytes.Buffer
		code := Main(context.Background(), c.args, Deps{Stdout: &out, Stderr: &errb})
		lines := strings.Split(strings.TrimSuffix(errb.String(), "\n"), "\n")
		if code != ExitUsage || !strings.HasPrefix(errb.String(), c.want) || len(lines) != 2 ||
			!strings.Contains(lines[1], "gaptrace "+c.args[0]+" --help") {
			t.Errorf("%v: exit %d, stderr:\n%s\nwant first line %q, then a pointer to --help", c.args, code, errb.String(), c.want)
		}
	}
	// --help itself still lists every option.
	var errb bytes.Buffer
	if code := Main(context.Background(), []string{"run", "--help"}, Deps{Stdout: &errb, Stderr: &errb}); code != ExitOK ||
		!strings.Contains(errb.String(), "-gaps-out FILE") {
		t.Errorf("run --help: exit %d\n%s", code, errb.String())
	}
}

func TestUnknownCommandSuggests(t *testing.T) {
	var errb bytes.Buffer
	if code := Main(context.Background(), []string{"rnu"}, Deps{Stdout: &errb, Stderr: &errb}); code != ExitUsage ||
		errb.String() != "gaptrace: unknown command \"rnu\"; did you mean run?\nrun 'gaptrace help' for the commands\n" {
		t.Errorf("exit %d:\n%s", code, errb.String())
	}
}

func TestOTLPNote(t *testing.T) {
	for _, c := range []struct {
		e    live.ExportStats
		want string
	}{
		{live.ExportStats{Exported: 10}, ""},
		{live.ExportStats{}, ""},
		{live.ExportStats{Errors: 3, Dropped: 882, Failing: true}, " (NOT reached: 3 failed exports, 882 spans dropped; see the warning above)"},
		{live.ExportStats{Exported: 100, Errors: 1, Dropped: 16}, " (INCOMPLETE: 100 spans exported, 16 dropped, 1 failed exports)"},
	} {
		if got := otlpNote(c.e); got != c.want {
			t.Errorf("%+v: %q, want %q", c.e, got, c.want)
		}
	}
}
