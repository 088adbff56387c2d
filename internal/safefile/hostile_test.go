package safefile

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// nobody is the uid that owns the files another user planted.
const nobody = 65534

// An existing output of another user is refused, not truncated and
// filled (as root the sidecar did, and that user could then read it);
// Check says so before anything runs.
func TestCreateRefusesAnotherUsersFile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a file to another user")
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "gaps.jsonl")
	if err := os.WriteFile(p, []byte("theirs\n"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	if err := Check(p); !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "uid 65534") {
		t.Errorf("Check: %v, want a refusal naming the owner", err)
	}
	if _, err := Create(p); !errors.Is(err, ErrUnsafe) {
		t.Errorf("Create: %v, want a refusal", err)
	}
	if _, err := NewWriter(p); !errors.Is(err, ErrUnsafe) {
		t.Errorf("NewWriter: %v, want a refusal", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "theirs\n" {
		t.Errorf("the file was written: %q", b)
	}
	// A FIFO of another user likewise.
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(fifo, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	if err := Check(fifo); !errors.Is(err, ErrUnsafe) {
		t.Errorf("Check of another user's FIFO: %v, want a refusal", err)
	}
}

// /dev/null, /dev/stdout, /dev/stderr and a FIFO with a reader are
// written as they are, never replaced, truncated or rotated.
func TestSpecialOutputsAccepted(t *testing.T) {
	for _, p := range []string{"/dev/null", "/dev/stdout", "/dev/stderr"} {
		if err := Check(p); err != nil {
			t.Errorf("Check(%s): %v", p, err)
		}
	}
	w, err := NewWriter("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	w.MaxSize, w.Keep = 10, 2
	for range 5 {
		if err := w.WriteRecords([]byte("0123456789abcdef\n")); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	if w.Rotated != 0 {
		t.Errorf("/dev/null rotated %d times", w.Rotated)
	}
	if _, err := os.Lstat("/dev/null.1"); err == nil {
		t.Error("/dev/null.1 was made")
	}
	a, err := CreateAtomic("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = a.Write([]byte("{}\n"))
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Lstat("/dev/null"); err != nil || st.Mode()&os.ModeCharDevice == 0 {
		t.Fatalf("/dev/null is now %v %v", st.Mode(), err)
	}
	f, err := Create("/dev/stderr")
	if err != nil {
		t.Fatal(err)
	}
	f.Close() // a duplicate: stderr stays open
	if _, err := os.Stderr.Write(nil); err != nil {
		t.Errorf("stderr closed: %v", err)
	}

	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cat := exec.Command("cat", fifo)
	out, err := cat.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cat.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cat.Wait() }()
	var fw *Writer
	deadline := time.Now().Add(10 * time.Second)
	for {
		if fw, err = NewWriter(fifo); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // until cat has opened it
	}
	if err != nil {
		t.Fatalf("FIFO with a reader: %v", err)
	}
	if err := fw.WriteRecords([]byte("through the fifo\n")); err != nil {
		t.Fatal(err)
	}
	fw.Close()
	if l, err := bufio.NewReader(out).ReadString('\n'); err != nil || l != "through the fifo\n" {
		t.Errorf("reader got %q %v", l, err)
	}
}

// A directory at FILE.3 (or at every number) does not lose a record:
// rotation passes over it, or writes on in place.
func TestWriterRotatesPastObstacles(t *testing.T) {
	for _, tc := range []struct {
		name      string
		obstacles []int
		keep      int
	}{
		{"directory at FILE.3", []int{3}, 3},
		{"directories at FILE.1 and FILE.2", []int{1, 2}, 2},
		{"every number taken", func() []int {
			var all []int
			for i := 1; i <= 1+maxObstacles; i++ {
				all = append(all, i)
			}
			return all
		}(), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "spans.jsonl")
			for _, n := range tc.obstacles {
				if err := os.Mkdir(fmt.Sprintf("%s.%d", p, n), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			w, err := NewWriter(p)
			if err != nil {
				t.Fatal(err)
			}
			w.MaxSize, w.Keep = 100, tc.keep
			const n = 20
			for i := range n {
				if err := w.WriteRecords(fmt.Appendf(nil, "%039d\n", i)); err != nil {
					t.Fatalf("record %d: %v", i, err)
				}
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			// The newest records must all be somewhere: the current file
			// and the rotated ones that were kept.
			files, _ := filepath.Glob(p + "*")
			seen := map[string]bool{}
			for _, f := range files {
				if st, _ := os.Lstat(f); st == nil || !st.Mode().IsRegular() {
					continue
				}
				b, _ := os.ReadFile(f)
				for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
					seen[l] = true
				}
			}
			kept := (tc.keep + 1) * 2 // records per file: 2
			if w.RotateErr != nil {
				kept = n // written on in place
			}
			for i := n - kept; i < n; i++ {
				if !seen[fmt.Sprintf("%039d", i)] {
					t.Errorf("record %d lost (rotated %d times, %v)", i, w.Rotated, w.RotateErr)
				}
			}
			for _, o := range tc.obstacles {
				if st, err := os.Lstat(fmt.Sprintf("%s.%d", p, o)); err != nil || !st.IsDir() {
					t.Errorf("the obstacle at .%d was touched", o)
				}
			}
		})
	}
}

// The temporary file of a run killed before it finished is removed by the
// next run on the same output; a live run's is left alone.
func TestAtomicRemovesStaleTemporaries(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "trace.json")
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	stale := []string{
		filepath.Join(dir, fmt.Sprintf(".trace.json.%d.123456.tmp", dead.Process.Pid)),
		filepath.Join(dir, ".trace.json.987654321.tmp"), // the older form, without a pid
	}
	live := filepath.Join(dir, fmt.Sprintf(".trace.json.%d.555.tmp", os.Getppid()))
	other := filepath.Join(dir, ".other.json.1.2.tmp")
	for _, f := range append(stale, live, other) {
		if err := os.WriteFile(f, []byte("half"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := WriteAtomic(p, []byte("{}\n")); err != nil {
		t.Fatal(err)
	}
	for _, f := range stale {
		if _, err := os.Lstat(f); err == nil {
			t.Errorf("stale %s left", filepath.Base(f))
		}
	}
	for _, f := range []string{live, other} {
		if _, err := os.Lstat(f); err != nil {
			t.Errorf("%s removed: %v", filepath.Base(f), err)
		}
	}
}
