package cli

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/config"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/proc"
)

// wholeHost explains why tracing pid and its descendants would trace far
// more than a job: the host's init (every process of the machine), or
// gaptrace itself or one of its ancestors (gaptrace would trace itself).
// Pid 1 of a container's namespace is usually the job itself (compose's
// pid: service:trainer, docker run --pid container:trainer) and is traced
// unless gaptrace runs under it.
func wholeHost(pid int) error {
	self := os.Getpid()
	switch {
	case pid == 1 && hostInit():
		return errors.New("pid 1 is the host's init: its descendants are every process of the machine, not a training job")
	case pid == self:
		return errors.New("that is gaptrace itself")
	case slices.Contains(proc.Ancestors(self), pid):
		return fmt.Errorf("pid %d is an ancestor of gaptrace: tracing it traces gaptrace and everything beside it", pid)
	}
	return nil
}

// hostInit reports whether /proc/1 is the host's init: its PID namespace is
// the initial one, whose inode the kernel fixes (PROC_PID_INIT_INO).
func hostInit() bool {
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/1/ns/pid", &st); err != nil {
		return true // cannot tell: be careful
	}
	return st.Ino == 0xEFFFFFFC
}

// tracerSkip keeps attach --match off gaptrace processes and their
// wrappers. Another gaptrace's command line holds the same pattern, and so
// does that of a process that started it (timeout 20 gaptrace attach
// --match P, sh -c "gaptrace run ..."); tracing one traces the other
// gaptrace and everything it does, which is never what was asked.
// gaptrace's own ancestors are left out by proc.FindMatching already.
//
// A verdict stands while the process lives, looked at again every
// walkEvery scans (a gaptrace under it may have exited): finding a
// gaptrace among a process's descendants walks all of /proc.
type tracerSkip struct {
	log     *slog.Logger
	scans   int
	skipped map[int]skippedTracer
}

type skippedTracer struct {
	w    *proc.Watch
	scan int
}

func newTracerSkip(log *slog.Logger) *tracerSkip {
	return &tracerSkip{log: log, skipped: map[int]skippedTracer{}}
}

// scan starts a scan: processes that exited, or whose verdict is old, are
// forgotten.
func (t *tracerSkip) scan() {
	t.scans++
	for pid, s := range t.skipped {
		if s.w.Exited() || t.scans-s.scan >= walkEvery {
			s.w.Close()
			delete(t.skipped, pid)
		}
	}
}

// skip reports whether pid must not be traced; the first time it says so
// for a process, it logs why.
func (t *tracerSkip) skip(pid int) bool {
	if _, ok := t.skipped[pid]; ok {
		return true
	}
	if !isGaptrace(pid) && !startsGaptrace(pid) && !slices.ContainsFunc(proc.Descendants(pid), isGaptrace) {
		return false
	}
	w, err := proc.Open(pid)
	if err != nil {
		return true // gone
	}
	t.skipped[pid] = skippedTracer{w: w, scan: t.scans}
	t.log.Info("not tracing a matching process: gaptrace runs it, or under it", "pid", pid)
	return true
}

func (t *tracerSkip) close() {
	for _, s := range t.skipped {
		s.w.Close()
	}
}

// gaptraceCommands are the commands of gaptrace that trace.
var gaptraceCommands = []string{string(config.CmdRun), string(config.CmdAttach), string(config.CmdDemo)}

// startsGaptrace reports whether pid's command line starts a gaptrace
// that traces: an argument, or a word of one (a shell script), naming a
// gaptrace binary (base name gaptrace, or this binary's path) followed by
// one of its tracing commands. This holds for timeout's child between its
// fork and exec too, whose command line is still timeout's.
func startsGaptrace(pid int) bool {
	argv, err := proc.Argv(pid)
	if err != nil {
		return false
	}
	self, _ := os.Executable()
	var ws []string
	for _, a := range argv {
		ws = append(ws, strings.Fields(a)...)
	}
	for i := 0; i+1 < len(ws); i++ {
		w := strings.Trim(ws[i], `"'`)
		if filepath.Base(w) != "gaptrace" && (self == "" || w != self) {
			continue
		}
		if slices.Contains(gaptraceCommands, strings.Trim(ws[i+1], `"'`)) {
			return true
		}
	}
	return false
}

// isGaptrace reports whether pid runs gaptrace (this binary, or one named
// gaptrace).
func isGaptrace(pid int) bool {
	self, err1 := os.Stat("/proc/self/exe")
	other, err2 := os.Stat(fmt.Sprintf("/proc/%d/exe", pid))
	if err1 == nil && err2 == nil && os.SameFile(self, other) {
		return true
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return err == nil && strings.TrimSpace(string(comm)) == "gaptrace"
}
