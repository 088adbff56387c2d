package cli

import (
	"bytes"
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestHelpListsEveryCommand: the commands that --help names are exactly
// the ones Main dispatches, and each answers -h without error.
func TestHelpListsEveryCommand(t *testing.T) {
	var out bytes.Buffer
	if code := Main(context.Background(), []string{"--help"}, Deps{Stdout: &out, Stderr: &out}); code != ExitOK {
		t.Fatalf("--help: exit %d", code)
	}
	var listed []string
	for _, m := range regexp.MustCompile(`(?m)^  gaptrace ([a-z]+)`).FindAllStringSubmatch(out.String(), -1) {
		if !slices.Contains(listed, m[1]) {
			listed = append(listed, m[1])
		}
	}
	want := []string{"run", "attach", "check", "demo", "convert", "version"}
	for _, c := range want {
		if !slices.Contains(listed, c) {
			t.Errorf("--help does not list %q:\n%s", c, out.String())
		}
	}
	for _, c := range listed {
		var o bytes.Buffer
		code := Main(context.Background(), []string{c, "-h"}, Deps{Stdout: &o, Stderr: &o})
		if code != ExitOK || strings.Contains(o.String(), "unknown command") {
			t.Errorf("gaptrace %s -h: exit %d\n%s", c, code, o.String())
		}
	}
	var o bytes.Buffer
	if code := Main(context.Background(), []string{"frobnicate"}, Deps{Stdout: &o, Stderr: &o}); code != ExitUsage ||
		!strings.Contains(o.String(), "unknown command") {
		t.Errorf("an unknown command: exit %d\n%s", code, o.String())
	}
}
