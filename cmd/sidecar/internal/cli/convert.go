package cli

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/config"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/proc"
	"github.com/gaptrace/gaptrace/perfetto"
)

// procNames names the processes of a live session's trace. The pipeline
// tells it each traced process's name while the process lives (Named);
// the trace asks when it first writes of the process, often after a short
// job exited, so /proc is asked only for a process never told.
type procNames struct {
	mu sync.Mutex
	m  map[uint32]string
}

// maxProcNames bounds the table on a node whose jobs fork without end.
const maxProcNames = 4096

func (n *procNames) Named(pid uint32, comm string) {
	if comm == "" {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.m == nil || len(n.m) >= maxProcNames {
		n.m = map[uint32]string{}
	}
	n.m[pid] = comm
}

func (n *procNames) name(pid uint32) string {
	n.mu.Lock()
	s, ok := n.m[pid]
	n.mu.Unlock()
	if ok {
		return s
	}
	return proc.Comm(int(pid), int(pid))
}

// threadComm names a thread's track from /proc while it exists.
func threadComm(pid, tid uint32) string { return proc.Comm(int(pid), int(tid)) }

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
	format, skipped, cerr := perfetto.ConvertCount(in, w)
	if cerr != nil {
		w.Abort()
		return fail(deps, "convert", "%s: %v", *from, cerr)
	}
	if skipped > 0 {
		fmt.Fprintf(deps.Stderr, "gaptrace convert: warning: %s: %d lines left out (a time, device or count out of range)\n", *from, skipped)
	}
	if err := w.Close(); err != nil {
		return fail(deps, "convert", "%v", err)
	}
	gaps, steps := w.Counts()
	fmt.Fprintf(deps.Stdout, "gaptrace convert: %s file %s → %s (%d gaps, %d steps); open it in ui.perfetto.dev or chrome://tracing\n",
		format, *from, *out, gaps, steps)
	return ExitOK
}
