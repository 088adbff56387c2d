package cli

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/config"
)

// commands are gaptrace's subcommands, for suggestions.
var commands = []string{"run", "attach", "check", "demo", "convert", "replay", "version", "help"}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// nearest is the candidate closest to s: within a third of its length in
// edits (at least 2), or one that s is a prefix of or that is a prefix of
// s. "" when none is close.
func nearest(s string, candidates []string) string {
	best, bestD := "", 0
	for _, c := range candidates {
		d := editDistance(s, c)
		if len(s) >= 3 && (strings.HasPrefix(c, s) || strings.HasPrefix(s, c)) {
			d = min(d, 1)
		}
		if best == "" || d < bestD {
			best, bestD = c, d
		}
	}
	if best == "" || bestD > max(2, len(s)/3) {
		return ""
	}
	return best
}

// flagNames lists the flags of cmd.
func flagNames(cmd config.Command) []string {
	var cfg config.Config
	var p config.Problems
	var names []string
	config.FlagSet(cmd, &cfg, &p, io.Discard).VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	return names
}

// usageError says what is wrong with a command line in a line or two:
// the flag package's message, the nearest flag when one is unknown, and
// where the full list is. The 60 lines of every option's usage are for
// --help.
func usageError(w io.Writer, cmd config.Command, err error) {
	msg := err.Error()
	var line string
	switch {
	case strings.HasPrefix(msg, "flag provided but not defined: "):
		name := strings.TrimLeft(strings.TrimPrefix(msg, "flag provided but not defined: "), "-")
		line = fmt.Sprintf("unknown flag --%s", name)
		if s := nearest(name, flagNames(cmd)); s != "" {
			line += fmt.Sprintf("; did you mean --%s?", s)
		}
	case strings.HasPrefix(msg, "flag needs an argument: "):
		line = "flag --" + strings.TrimLeft(strings.TrimPrefix(msg, "flag needs an argument: "), "-") + " needs a value"
	default:
		line = msg
	}
	fmt.Fprintf(w, "gaptrace %s: %s\nrun 'gaptrace %s --help' for every option\n", cmd, line, cmd)
}

// unknownCommand says a command does not exist, with the nearest one.
func unknownCommand(w io.Writer, name string) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "gaptrace: unknown command %q", name)
	if s := nearest(strings.TrimLeft(name, "-"), commands); s != "" {
		fmt.Fprintf(&b, "; did you mean %s?", s)
	}
	b.WriteString("\nrun 'gaptrace help' for the commands\n")
	w.Write(b.Bytes()) //nolint:errcheck // stderr
}
