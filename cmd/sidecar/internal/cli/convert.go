package cli

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/config"
	"github.com/gaptrace/gaptrace/perfetto"
)

// procComm and threadComm name the tracks of a live session's trace from
// /proc while the traced processes still exist; "" once they are gone.
func procComm(pid uint32) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.FormatUint(uint64(pid), 10), "comm"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func threadComm(pid, tid uint32) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.FormatUint(uint64(pid), 10), "task",
		strconv.FormatUint(uint64(tid), 10), "comm"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

const convertUsage = `Usage: gaptrace convert --from FILE --perfetto-out FILE

Turn a gaps file (--gaps-out) or a spans file (--spans-out) of an earlier
run into a Chrome trace-event JSON file for ui.perfetto.dev or
chrome://tracing. The format is recognised from the file's first line. A
gaps file holds no steps: its trace shows GPU idle and host threads only;
a spans file's trace has steps and busy time too.

Flags:
`

func convertCmd(args []string, deps Deps) int {
	fs := flag.NewFlagSet("gaptrace convert", flag.ContinueOnError)
	fs.SetOutput(deps.Stderr)
	from := fs.String("from", "", "gaps or spans JSON-lines `FILE` written by gaptrace")
	out := fs.String("perfetto-out", "", "trace-event JSON `FILE` to write")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), convertUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	var problems []string
	if *from == "" {
		problems = append(problems, "--from FILE is required (a file written by --gaps-out or --spans-out)")
	}
	if *out == "" {
		problems = append(problems, "--perfetto-out FILE is required")
	}
	if fs.NArg() > 0 {
		problems = append(problems, "unexpected arguments: "+strings.Join(fs.Args(), " "))
	}
	if msg := config.CheckOutput("perfetto-out", *out); msg != "" {
		problems = append(problems, msg)
	}
	if len(problems) > 0 {
		fmt.Fprintf(deps.Stderr, "gaptrace convert: invalid arguments:\n")
		for _, p := range problems {
			fmt.Fprintf(deps.Stderr, "  - %s\n", p)
		}
		return ExitUsage
	}
	in, err := os.Open(*from)
	if err != nil {
		return fail(deps, "convert", "%v", err)
	}
	defer in.Close()
	// Written to a new temporary file renamed over the name once whole: a
	// failed conversion leaves an earlier good trace where it was.
	w, err := perfetto.Create(*out, perfetto.Options{})
	if err != nil {
		return fail(deps, "convert", "%v", err)
	}
	format, cerr := perfetto.Convert(in, w)
	if cerr != nil {
		w.Abort()
		return fail(deps, "convert", "%s: %v", *from, cerr)
	}
	if err := w.Close(); err != nil {
		return fail(deps, "convert", "%v", err)
	}
	gaps, steps := w.Counts()
	fmt.Fprintf(deps.Stdout, "gaptrace convert: %s file %s → %s (%d gaps, %d steps); open it in ui.perfetto.dev or chrome://tracing\n",
		format, *from, *out, gaps, steps)
	return ExitOK
}
