package safefile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func plantVictim(t *testing.T) string {
	t.Helper()
	v := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(v, []byte("precious\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return v
}

func assertVictim(t *testing.T, v string) {
	t.Helper()
	b, err := os.ReadFile(v)
	if err != nil || string(b) != "precious\n" {
		t.Fatalf("victim changed: %q %v", b, err)
	}
}

func TestCreateRefusesSymlinkHardlinkFIFO(t *testing.T) {
	dir := t.TempDir()
	victim := plantVictim(t)

	link := filepath.Join(dir, "out.jsonl")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	if _, err := Create(link); !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("Create through a symlink: %v, want a refusal", err)
	}
	if err := Check(link); !errors.Is(err, ErrUnsafe) {
		t.Errorf("Check of a symlink: %v", err)
	}

	hard := filepath.Join(dir, "hard.jsonl")
	if err := os.Link(victim, hard); err != nil {
		t.Fatal(err)
	}
	if _, err := Create(hard); !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "hard links") {
		t.Errorf("Create of a hard link: %v, want a refusal", err)
	}
	assertVictim(t, victim)

	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// Must return at once (no reader would ever come), refusing.
	if _, err := Create(fifo); !errors.Is(err, ErrUnsafe) {
		t.Errorf("Create of a FIFO: %v, want a refusal", err)
	}
}

func TestCreateModeAndTruncate(t *testing.T) {
	p := filepath.Join(t.TempDir(), "out")
	if err := os.WriteFile(p, []byte("old content"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o666); err != nil {
		t.Fatal(err)
	}
	f, err := Create(p)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	st, _ := os.Stat(p)
	if st.Size() != 0 || st.Mode().Perm()&0o007 != 0 {
		t.Errorf("size %d mode %v: want truncated, no access for others", st.Size(), st.Mode())
	}
	q := filepath.Join(t.TempDir(), "new")
	f, err = Create(q)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if st, _ := os.Stat(q); st.Mode().Perm()&0o007 != 0 {
		t.Errorf("new file mode %v", st.Mode())
	}
}

func TestWriteAtomicReplacesLinkNotTarget(t *testing.T) {
	dir := t.TempDir()
	victim := plantVictim(t)
	p := filepath.Join(dir, "summary.json")
	// The old fixed temporary name is planted too: it must not matter.
	for _, link := range []string{p, p + ".tmp"} {
		if err := os.Symlink(victim, link); err != nil {
			t.Fatal(err)
		}
	}
	if err := WriteAtomic(p, []byte("{}\n")); err != nil {
		t.Fatal(err)
	}
	assertVictim(t, victim)
	st, err := os.Lstat(p)
	if err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != Perm {
		t.Fatalf("summary is %v %v, want a regular file mode %v", st.Mode(), err, Perm)
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".summary.json.*"))
	if len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

func TestWriterCutsBackToWholeRecords(t *testing.T) {
	// /dev/full fails every write with ENOSPC, like a full disk; a
	// regular file is needed, so emulate with a file whose writes fail by
	// closing its descriptor under the writer.
	p := filepath.Join(t.TempDir(), "out.jsonl")
	w, err := NewWriter(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteRecords([]byte("{\"a\":1}\n")); err != nil {
		t.Fatal(err)
	}
	w.f.Close()
	if err := w.WriteRecords([]byte("{\"b\":2}\n")); err == nil {
		t.Fatal("write to a closed file succeeded")
	}
	if err := w.WriteRecords([]byte("{\"c\":3}\n")); err == nil {
		t.Fatal("writer is not sticky after a failure")
	}
	if err := w.Close(); err == nil {
		t.Fatal("Close hid the write error")
	}
	b, _ := os.ReadFile(p)
	if string(b) != "{\"a\":1}\n" {
		t.Errorf("file holds %q, want the whole first record only", b)
	}
}

func TestWriterRotates(t *testing.T) {
	p := filepath.Join(t.TempDir(), "spans.jsonl")
	w, err := NewWriter(p)
	if err != nil {
		t.Fatal(err)
	}
	w.MaxSize, w.Keep = 100, 2
	rec := []byte(strings.Repeat("x", 39) + "\n") // 40 bytes
	for range 20 {
		if err := w.WriteRecords(rec); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{p, p + ".1", p + ".2"} {
		st, err := os.Lstat(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if st.Size() > 100 || st.Size()%40 != 0 || st.Mode().Perm() != Perm {
			t.Errorf("%s: %d bytes mode %v, want whole records within the 100-byte cap", name, st.Size(), st.Mode())
		}
	}
	if _, err := os.Lstat(p + ".3"); err == nil {
		t.Error("more rotated files kept than Keep")
	}
	if w.Rotated != 9 {
		t.Errorf("rotated %d times, want 9 (20 records, 2 per file)", w.Rotated)
	}
}

func TestAtomicAppearsWholeOrNotAtAll(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "trace.json")
	if err := os.WriteFile(p, []byte("earlier run\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := CreateAtomic(p)
	if err != nil {
		t.Fatal(err)
	}
	var heard []error
	a.OnError = func(err error) { heard = append(heard, err) }
	if _, err := a.Write([]byte(`{"part":`)); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "earlier run\n" {
		t.Fatalf("path changed before Close: %q", b)
	}
	a.f.Close() // every later write fails, as on a full disk
	if _, err := a.Write([]byte(`1}`)); err == nil {
		t.Fatal("write to a closed file succeeded")
	}
	a.Write([]byte("more")) //nolint:errcheck // sticky: checked below
	err = a.Close()
	var we *WriteError
	if !errors.As(err, &we) || !we.NotWritten || we.Path != p || !strings.Contains(err.Error(), "not written") {
		t.Errorf("Close: %v, want a WriteError saying %s was not written", err, p)
	}
	if len(heard) != 1 {
		t.Errorf("OnError called %d times, want once, at the failed write", len(heard))
	}
	if b, _ := os.ReadFile(p); string(b) != "earlier run\n" {
		t.Errorf("a failed atomic write changed the earlier file: %q", b)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".trace.json.*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}

	// A successful one replaces the file, mode Perm; Abort leaves nothing.
	a, err = CreateAtomic(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write([]byte("new\n")); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Lstat(p); err != nil || st.Mode().Perm() != Perm {
		t.Errorf("%s: %v %v, want mode %v", p, st.Mode(), err, Perm)
	}
	a, err = CreateAtomic(p)
	if err != nil {
		t.Fatal(err)
	}
	a.Abort()
	if b, _ := os.ReadFile(p); string(b) != "new\n" {
		t.Errorf("Abort changed the file: %q", b)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".trace.json.*")); len(left) != 0 {
		t.Errorf("temporary files left after Abort: %v", left)
	}
}

func TestStreamKeepsTheFirstError(t *testing.T) {
	p := filepath.Join(t.TempDir(), "run.rec")
	s, err := CreateStream(p)
	if err != nil {
		t.Fatal(err)
	}
	var heard int
	s.OnError = func(error) { heard++ }
	if _, err := s.Write([]byte("head")); err != nil {
		t.Fatal(err)
	}
	s.f.Close() // every later write fails, as on a full disk
	for range 2 {
		if _, err := s.Write([]byte("more")); err == nil {
			t.Fatal("write to a closed file succeeded")
		}
	}
	var we *WriteError
	if err := s.Close(); !errors.As(err, &we) || we.Path != p || we.NotWritten {
		t.Errorf("Close: %v, want the WriteError of %s", err, p)
	}
	if heard != 1 {
		t.Errorf("OnError called %d times, want once", heard)
	}
	if b, _ := os.ReadFile(p); string(b) != "head" {
		t.Errorf("file holds %q, want what was written before the failure", b)
	}
	if st, _ := os.Stat(p); st.Mode().Perm() != Perm {
		t.Errorf("mode %v, want %v", st.Mode(), Perm)
	}
}
