package tracer

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

// TestInGC: a native stack is in the collector when a collector function
// comes before the interpreter's eval loop; a collector symbol past the
// eval loop belongs to an outer call, and a frame of another library ends
// the look.
func TestInGC(t *testing.T) {
	py := "/usr/bin/python3.11"
	for _, c := range []struct {
		name  string
		stack []event.Frame
		want  bool
	}{
		{"pass", []event.Frame{{Function: "visit_decref", File: py}, {Function: "subtract_refs", File: py}, {Function: "gc_collect_main", File: py}}, true},
		{"eval first", []event.Frame{{Function: "_PyEval_EvalFrameDefault", File: py}, {Function: "gc_collect_main", File: py}}, false},
		{"other library", []event.Frame{{Function: "memcpy", File: "/usr/lib/libc.so.6"}, {Function: "gc_collect_main", File: py}}, false},
		{"none", []event.Frame{{Function: "PyObject_Malloc", File: py}}, false},
	} {
		if got := inGC(c.stack, py); got != c.want {
			t.Errorf("%s: inGC = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestParseFileMapping keeps every file mapping, read-only data included,
// and leaves anonymous memory out.
func TestParseFileMapping(t *testing.T) {
	m, ok := parseFileMapping("7f0000000000-7f0000100000 r--s 00000000 08:01 1234 /data/shard-0.bin")
	if !ok || m.path != "/data/shard-0.bin" || m.start != 0x7f0000000000 || m.end != 0x7f0000100000 {
		t.Fatalf("file mapping: %+v %v", m, ok)
	}
	if _, ok := parseFileMapping("7f0000000000-7f0000100000 rw-p 00000000 00:00 0 "); ok {
		t.Error("anonymous mapping kept")
	}
	if _, ok := parseFileMapping("7f0000000000-7f0000100000 rw-p 00000000 00:00 0 [heap]"); ok {
		t.Error("[heap] kept")
	}
}

// TestScanPipeReader: the reader of a pipe is the other process holding
// its read end; the writer's own read end counts only when no other holds
// one, and a write end is no reader.
func TestScanPipeReader(t *testing.T) {
	root := t.TempDir()
	fd := func(pid, fd, target, flags, comm string) {
		t.Helper()
		fakeFD(t, root, pid, fd, target, "pos:\t0\nflags:\t"+flags+"\nmnt_id:\t15\n")
		if err := os.WriteFile(filepath.Join(root, pid, "comm"), []byte(comm+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fd("100", "1", "pipe:[77]", "01", "train")       // the writer's stdout
	fd("100", "5", "pipe:[77]", "0100000", "train")  // and a read end it kept
	fd("200", "0", "pipe:[77]", "0100000", "logger") // the collector's stdin
	fd("300", "1", "pipe:[77]", "01", "other")       // another writer
	r := scanPipeReader(root, 100, 77)
	if r.pid != 200 || r.comm != "logger" {
		t.Errorf("reader %+v, want pid 200 logger", r)
	}
	if r := scanPipeReader(root, 100, 78); r.pid != 0 {
		t.Errorf("reader of an unknown pipe %+v, want none", r)
	}
	if err := os.RemoveAll(filepath.Join(root, "200")); err != nil {
		t.Fatal(err)
	}
	if r := scanPipeReader(root, 100, 77); r.pid != 100 {
		t.Errorf("reader %+v, want the writer itself (its own read end)", r)
	}
	p := &pipeReaders{procRoot: root, m: map[uint64]pipeReader{}}
	if s, pid := p.describe(300, "pipe:[77]"); s != "pipe:[77] read by pid 100 (train)" || pid != 100 {
		t.Errorf("describe: %q %d", s, pid)
	}
	if s, pid := p.describe(300, "/tmp/f"); s != "/tmp/f" || pid != 0 {
		t.Errorf("describe of a file: %q %d", s, pid)
	}
}

// TestPipeReaderChecked: a reader found once is checked, not looked for
// again, once its lookup is pipeTTL old: while it still holds the read end
// it stays the reader (a scan would now find another first); once it closed
// it, a scan finds the next.
func TestPipeReaderChecked(t *testing.T) {
	root := t.TempDir()
	fd := func(pid, fd, target, flags string) {
		t.Helper()
		fakeFD(t, root, pid, fd, target, "flags:\t"+flags+"\n")
	}
	age := func(p *pipeReaders) {
		p.mu.Lock()
		defer p.mu.Unlock()
		for ino, r := range p.m {
			r.at = r.at.Add(-2 * pipeTTL)
			p.m[ino] = r
		}
	}
	fd("100", "1", "pipe:[77]", "01")
	fd("200", "4", "pipe:[77]", "0")
	p := &pipeReaders{procRoot: root, m: map[uint64]pipeReader{}}
	if _, pid := p.describe(100, "pipe:[77]"); pid != 200 {
		t.Fatalf("reader %d, want 200", pid)
	}
	fd("150", "3", "pipe:[77]", "0") // a scan would find it first
	age(p)
	if _, pid := p.describe(100, "pipe:[77]"); pid != 200 {
		t.Errorf("reader %d after its lookup aged, want 200 (checked, still holding the read end)", pid)
	}
	if err := os.Remove(filepath.Join(root, "200", "fd", "4")); err != nil {
		t.Fatal(err)
	}
	if _, pid := p.describe(100, "pipe:[77]"); pid != 200 {
		t.Errorf("reader %d within pipeTTL of the check, want 200 (cached)", pid)
	}
	age(p)
	if _, pid := p.describe(100, "pipe:[77]"); pid != 150 {
		t.Errorf("reader %d after 200 closed its end, want 150", pid)
	}
}

// fakeFD makes fd of pid, under a fake /proc at root, a link to target
// with info as its fdinfo.
func fakeFD(t *testing.T, root, pid, fd, target, info string) {
	t.Helper()
	for _, d := range []string{"fd", "fdinfo"} {
		if err := os.MkdirAll(filepath.Join(root, pid, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(target, filepath.Join(root, pid, "fd", fd)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, pid, "fdinfo", fd), []byte(info), 0o644); err != nil {
		t.Fatal(err)
	}
}
