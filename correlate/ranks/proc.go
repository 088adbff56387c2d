package ranks

import (
	"fmt"
	"slices"
	"unicode"
	"unicode/utf8"
)

// A KindProc record tells the other sidecars of a job what a process
// traced here is doing, so that a rank waiting in a collective for a rank
// traced elsewhere can name that rank's state: running, stopped, asleep in
// uninterruptible sleep on a file, exited with its status. Engines take no
// part: they ignore it, and a recording holds it as it came.

// States are the process states a KindProc record may carry (those of
// package hang).
var States = []string{"running", "sleeping", "stopped", "disk-sleep", "zombie", "exited", "unknown"}

// Bounds of a KindProc record's strings, in bytes.
const (
	maxProcFile  = 512 // a path, a socket's peer, with the syscall's name
	maxProcWChan = 64  // a kernel function's name
	maxProcExit  = 64  // "killed by SIGKILL", "exit status 1"
)

// checkProc checks a KindProc record's state and strings: a known state,
// and short, printable UTF-8 text.
func (r *Record) checkProc() error {
	if !slices.Contains(States, r.State) {
		return fmt.Errorf("peer record: unknown process state %.32q", r.State)
	}
	for _, f := range []struct {
		name, s string
		max     int
	}{{"file", r.File, maxProcFile}, {"wait channel", r.WChan, maxProcWChan}, {"exit", r.Exit, maxProcExit}} {
		if len(f.s) > f.max {
			return fmt.Errorf("peer record: %s of %d bytes, at most %d", f.name, len(f.s), f.max)
		}
		if !printable(f.s) {
			return fmt.Errorf("peer record: %s %.32q is not printable text", f.name, f.s)
		}
	}
	return nil
}

// printable reports whether s is valid UTF-8 without control characters.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, c := range s {
		if !unicode.IsPrint(c) {
			return false
		}
	}
	return true
}
