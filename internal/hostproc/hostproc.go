// Package hostproc is what the tracer and the command line both need to know
// about processes in gaptrace's /proc: a process's descendants, the process
// a thread belongs to, and whether gaptrace may load and attach BPF
// programs. One implementation, so that the processes the CLI reports and
// the processes the tracer traces are found the same way. It reads /proc
// through prometheus/procfs (and by hand where only one field is needed) and
// keeps no state.
package hostproc

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"

	"github.com/prometheus/procfs"
)

// Descendants returns the living descendants of pids (not pids themselves,
// unless one descends from another), parents before their children. A child forked by any thread of a process has that
// process as its parent (stat's ppid is a thread group id), so one pass over
// /proc finds every generation.
func Descendants(pids ...int) []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return nil
	}
	// Only the parent is needed of every process: read stat by hand
	// (procfs parses all 52 fields with fmt, 14% of gaptrace's CPU on a
	// GPU host where attach refreshes its process list every second).
	children := make(map[int][]int)
	buf := make([]byte, 512)
	for _, n := range names {
		p, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		if pp, ok := parentOf(p, buf); ok {
			children[pp] = append(children[pp], p)
		}
	}
	var out []int
	queue := slices.Clone(pids)
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// parentOf reads pid's parent from /proc/PID/stat ("pid (comm) state
// ppid ..."; comm may hold spaces and parentheses, so after the last ')').
func parentOf(pid int, buf []byte) (int, bool) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false // exited while we looked
	}
	n, err := io.ReadFull(f, buf)
	f.Close()
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return 0, false
	}
	b := buf[:n]
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	fields := bytes.Fields(b[i+1:])
	if len(fields) < 2 {
		return 0, false
	}
	pp, err := strconv.Atoi(string(fields[1]))
	return pp, err == nil
}

// ThreadGroup returns the process (thread group) id of tid, which may name
// any thread.
func ThreadGroup(tid int) (int, error) {
	p, err := procfs.NewProc(tid)
	if err != nil {
		return 0, err
	}
	st, err := p.NewStatus()
	if err != nil {
		return 0, err
	}
	if st.TGID <= 0 {
		return 0, fmt.Errorf("no Tgid in /proc/%d/status", tid)
	}
	return st.TGID, nil
}

// Linux capability numbers gaptrace cares about.
const (
	CapSysAdmin    = 21
	CapSysPtrace   = 19
	CapSysResource = 24
	CapPerfmon     = 38
	CapBPF         = 39
)

// CapNames names the capabilities above for messages.
var CapNames = map[int]string{CapSysAdmin: "CAP_SYS_ADMIN", CapSysPtrace: "CAP_SYS_PTRACE",
	CapSysResource: "CAP_SYS_RESOURCE", CapPerfmon: "CAP_PERFMON", CapBPF: "CAP_BPF"}

// Caps is a capability set.
type Caps uint64

// Has reports whether c holds capability n.
func (c Caps) Has(n int) bool { return c&(1<<uint(n)) != 0 }

// EffectiveCaps reads the effective capability set of this process.
func EffectiveCaps() (Caps, error) {
	p, err := procfs.NewProc(os.Getpid())
	if err != nil {
		return 0, fmt.Errorf("read own capabilities: %w", err)
	}
	st, err := p.NewStatus()
	if err != nil {
		return 0, fmt.Errorf("read own capabilities: %w", err)
	}
	return Caps(st.CapEff), nil
}

// MissingBPFCaps returns the capabilities c lacks to load BPF programs and
// attach probes: CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN, which implies
// both.
func MissingBPFCaps(c Caps) []string {
	if c.Has(CapSysAdmin) {
		return nil
	}
	var missing []string
	for _, n := range []int{CapBPF, CapPerfmon} {
		if !c.Has(n) {
			missing = append(missing, CapNames[n])
		}
	}
	return missing
}

// MissingTracingCaps is MissingBPFCaps plus CAP_SYS_PTRACE, which reading
// /proc/PID/maps and fds of another user's process requires.
func MissingTracingCaps(c Caps) []string {
	missing := MissingBPFCaps(c)
	if !c.Has(CapSysPtrace) {
		missing = append(missing, CapNames[CapSysPtrace])
	}
	return missing
}
