package tracer

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// pipeReaders finds the process that reads a pipe a traced thread blocked
// writing into (stdout into a log collector, a tee, a pager): the process,
// other than the writer, that holds the pipe's inode open for reading
// (/proc/PID/fd and fdinfo). A slow reader makes every write block, and
// each write is an event: a pipe's reader is looked up at most every
// pipeTTL, and a reader other than the writer found once is then only
// checked (its fd still names the pipe: one readlink) rather than found
// again by a scan of every process's fds, which on a busy host is
// thousands of readlinks (a tenth of the sidecar's CPU on a job whose
// loader workers write batches into pipes).
type pipeReaders struct {
	procRoot string
	mu       sync.Mutex
	m        map[uint64]pipeReader
}

type pipeReader struct {
	pid  uint32
	comm string
	fd   string // the reader's fd on the pipe, under /proc/PID/fd
	at   time.Time
}

const pipeTTL = 2 * time.Second

func newPipeReaders() *pipeReaders {
	return &pipeReaders{procRoot: procRoot, m: make(map[uint64]pipeReader)}
}

// pipeInode parses "pipe:[123]".
func pipeInode(path string) (uint64, bool) {
	s, ok := strings.CutPrefix(path, "pipe:[")
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, "]")
	if !ok {
		return 0, false
	}
	ino, err := strconv.ParseUint(s, 10, 64)
	return ino, err == nil
}

// describe is the pipe's path with its reader named: "pipe:[123] read by
// pid 456 (logger)"; the path alone when no reader is found.
func (p *pipeReaders) describe(writer uint32, path string) (string, uint32) {
	ino, ok := pipeInode(path)
	if !ok || p == nil {
		return path, 0
	}
	r := p.reader(writer, ino)
	if r.pid == 0 {
		return path, 0
	}
	if r.comm != "" {
		return fmt.Sprintf("%s read by pid %d (%s)", path, r.pid, r.comm), r.pid
	}
	return fmt.Sprintf("%s read by pid %d", path, r.pid), r.pid
}

func (p *pipeReaders) reader(writer uint32, ino uint64) pipeReader {
	p.mu.Lock()
	r, ok := p.m[ino]
	p.mu.Unlock()
	switch {
	case ok && time.Since(r.at) < pipeTTL:
		return r
	case ok && r.pid != 0 && r.pid != writer && holdsPipe(p.procRoot, r, ino):
		// The writer itself, or no reader, is looked for again: another
		// process may have opened the read end since.
	default:
		r = scanPipeReader(p.procRoot, writer, ino)
	}
	r.at = time.Now()
	p.mu.Lock()
	if len(p.m) > 1024 {
		clear(p.m)
	}
	p.m[ino] = r
	p.mu.Unlock()
	return r
}

// scanPipeReader looks through every process's fds for the read end of
// pipe ino; the writer itself is the reader only when no other process is.
func scanPipeReader(root string, writer uint32, ino uint64) pipeReader {
	want := "pipe:[" + strconv.FormatUint(ino, 10) + "]"
	dirs, err := os.ReadDir(root)
	if err != nil {
		return pipeReader{}
	}
	var self pipeReader
	for _, d := range dirs {
		pid, err := strconv.ParseUint(d.Name(), 10, 32)
		if err != nil {
			continue
		}
		fdDir := filepath.Join(root, d.Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			t, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
			if err != nil || t != want || !readEnd(filepath.Join(root, d.Name(), "fdinfo", fd.Name())) {
				continue
			}
			r := pipeReader{pid: uint32(pid), comm: readComm(filepath.Join(root, d.Name(), "comm")), fd: fd.Name()}
			if uint32(pid) != writer {
				return r
			}
			self = r
			break
		}
	}
	return self
}

// holdsPipe reports whether r's process still holds the read end of pipe
// ino on the fd it was found on.
func holdsPipe(root string, r pipeReader, ino uint64) bool {
	if r.fd == "" {
		return false
	}
	pid := strconv.FormatUint(uint64(r.pid), 10)
	t, err := os.Readlink(filepath.Join(root, pid, "fd", r.fd))
	return err == nil && t == "pipe:["+strconv.FormatUint(ino, 10)+"]" &&
		readEnd(filepath.Join(root, pid, "fdinfo", r.fd))
}

// readEnd reports whether an fdinfo file says the fd was opened for reading
// only (flags' access mode O_RDONLY).
func readEnd(fdinfo string) bool {
	f, err := os.Open(fdinfo)
	if err != nil {
		return false
	}
	defer func() { _ = f.Close() }() // read-only
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "flags:"); ok {
			flags, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32)
			return err == nil && flags&3 == 0
		}
	}
	return false
}

func readComm(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// childCommands remembers the command line each traced process exec'd
// (/proc/PID/cmdline, read when its exec is seen), so that a wait for a
// child (wait4 returns its pid, after which /proc has forgotten it) names
// what the child ran.
type childCommands struct {
	procRoot string
	mu       sync.Mutex
	m        map[uint32]string
}

func newChildCommands() *childCommands {
	return &childCommands{procRoot: procRoot, m: make(map[uint32]string)}
}

// exec records pid's command line; filename stands in when /proc no longer
// has it.
func (c *childCommands) exec(pid uint32, filename string) {
	if c == nil {
		return // a tracer fed recorded records
	}
	cmd := filename
	if b, err := os.ReadFile(filepath.Join(c.procRoot, strconv.Itoa(int(pid)), "cmdline")); err == nil && len(b) > 0 {
		cmd = strings.TrimSpace(strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " "))
	}
	if len(cmd) > 256 {
		cmd = cmd[:256]
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= 4096 {
		clear(c.m)
	}
	c.m[pid] = cmd
}

// reaped returns and forgets pid's command line.
func (c *childCommands) reaped(pid uint32) string {
	if c == nil {
		return ""
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	cmd := c.m[pid]
	delete(c.m, pid)
	return cmd
}
