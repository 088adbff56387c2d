package main_test

import (
	"strings"
	"testing"
)

// TestAutoScheduleFlagsRejected: a bad --auto-window or --auto-every stops
// gaptrace before anything loads, with exit 2 and the flag named.
func TestAutoScheduleFlagsRejected(t *testing.T) {
	need(t)
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"--auto-window", "1ms"}, "--auto-window"},
		{[]string{"--auto-window", "2s", "--auto-every", "3s"}, "--auto-every"},
		{[]string{"--auto-every", "later"}, "--auto-every"},
	} {
		args := append(append([]string{"run", "--live", "off"}, c.args...), "--", "true")
		code, _, stderr := runGaptrace(t, env(t), args...)
		if code != 2 || !strings.Contains(stderr, c.flag) || strings.Contains(stderr, "probes attached") {
			t.Errorf("%v: exit %d, want 2 naming %s\n%s", c.args, code, c.flag, stderr)
		}
	}
}
