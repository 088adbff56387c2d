package main_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gaptrace/gaptrace/internal/testutil"
)

// stallFS is a FUSE filesystem of one read-only file whose reads the test
// can stall: while stalled, the reads the kernel sends it wait unanswered,
// and a process reading the file (through the page cache) waits for the
// page in uninterruptible sleep, D, as on a stuck network filesystem. It
// speaks the kernel's FUSE protocol on /dev/fuse itself (no libfuse, no
// fusermount: the tests run as root).
type stallFS struct {
	dir  string
	name string
	size uint64
	fd   int // /dev/fuse, read and written as a raw fd (Go's poller cannot take it)

	mu      sync.Mutex
	stalled bool
	held    []heldRead
	done    chan struct{}
	err     error // why serve stopped
}

type heldRead struct {
	unique uint64
	size   uint32
}

// FUSE opcodes and sizes the file needs (linux/fuse.h).
const (
	fuseLookup    = 1
	fuseForget    = 2
	fuseGetattr   = 3
	fuseOpen      = 14
	fuseRead      = 15
	fuseRelease   = 18
	fuseFlush     = 25
	fuseInit      = 26
	fuseInterrupt = 36
	fuseDestroy   = 38
	fuseBatchFgt  = 42

	fuseInHeader = 40
	fuseAttrSize = 88
	fuseRootID   = 1
	fuseFileID   = 2
)

// mountStallFS mounts a stallFS holding one file, name, of size bytes, at
// a new directory; it is unmounted when the test ends. It skips the test
// where FUSE cannot be mounted.
func mountStallFS(t *testing.T, name string, size uint64) *stallFS {
	t.Helper()
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no FUSE here: %v", err)
	}
	s := &stallFS{dir: t.TempDir(), name: name, size: size, fd: fd, done: make(chan struct{})}
	opts := "fd=" + strconv.Itoa(fd) + ",rootmode=40000,user_id=0,group_id=0,allow_other"
	if err := unix.Mount("stallfs", s.dir, "fuse.stallfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		_ = unix.Close(fd)
		t.Skipf("cannot mount FUSE: %v", err)
	}
	go s.serve()
	t.Cleanup(func() {
		s.setStalled(false)
		_ = unix.Unmount(s.dir, unix.MNT_DETACH)
		// The server's read ends once the filesystem is gone (its last
		// reader killed); a test does not wait longer for it.
		select {
		case <-s.done:
		case <-time.After(5 * time.Second):
		}
		_ = unix.Close(s.fd)
	})
	errc := make(chan error, 1)
	go func() { _, err := os.Stat(filepath.Join(s.dir, name)); errc <- err }()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("stallfs: %v (server: %v)", err, s.serveErr())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("stallfs: no answer within 10 s (server: %v)", s.serveErr())
	}
	return s
}

// setStalled stalls the reads from now on, or answers those held and
// serves the next ones.
func (s *stallFS) setStalled(on bool) {
	s.mu.Lock()
	s.stalled = on
	held := s.held
	s.held = nil
	s.mu.Unlock()
	for _, r := range held {
		s.reply(r.unique, 0, make([]byte, r.size))
	}
}

// serveErr is why the server stopped (nil while it serves).
func (s *stallFS) serveErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// heldReads is how many reads wait unanswered.
func (s *stallFS) heldReads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held)
}

func (s *stallFS) serve() {
	defer close(s.done)
	buf := make([]byte, 1<<20+4096)
	for {
		n, err := unix.Read(s.fd, buf)
		if err != nil {
			if errors.Is(err, syscall.EINTR) || errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.ENOENT) {
				continue // an interrupted or vanished request
			}
			s.mu.Lock()
			s.err = err // unmounted (ENODEV) or closed
			s.mu.Unlock()
			return
		}
		if n < fuseInHeader {
			continue
		}
		s.handle(buf[:n])
	}
}

func (s *stallFS) handle(req []byte) {
	le := binary.LittleEndian
	op, unique, node := le.Uint32(req[4:]), le.Uint64(req[8:]), le.Uint64(req[16:])
	body := req[fuseInHeader:]
	switch op {
	case fuseInit:
		out := make([]byte, 64)
		le.PutUint32(out[0:], 7)       // major
		le.PutUint32(out[4:], 31)      // minor
		le.PutUint32(out[8:], 128<<10) // max_readahead
		le.PutUint32(out[12:], 1)      // FUSE_ASYNC_READ: reads through the page cache
		le.PutUint16(out[16:], 16)     // max_background
		le.PutUint16(out[18:], 12)     // congestion_threshold
		le.PutUint32(out[20:], 128<<10)
		le.PutUint32(out[24:], 1) // time_gran
		le.PutUint16(out[28:], 32)
		s.reply(unique, 0, out)
	case fuseLookup:
		name := string(body)
		if i := indexZero(body); i >= 0 {
			name = string(body[:i])
		}
		if node != fuseRootID || name != s.name {
			s.reply(unique, -int32(syscall.ENOENT), nil)
			return
		}
		out := make([]byte, 40, 40+fuseAttrSize)
		le.PutUint64(out[0:], fuseFileID)
		le.PutUint64(out[16:], 3600) // entry_valid
		le.PutUint64(out[24:], 3600) // attr_valid
		s.reply(unique, 0, append(out, s.attr(fuseFileID)...))
	case fuseGetattr:
		out := make([]byte, 16, 16+fuseAttrSize)
		le.PutUint64(out[0:], 3600)
		s.reply(unique, 0, append(out, s.attr(node)...))
	case fuseOpen:
		if len(body) >= 4 && le.Uint32(body)&syscall.O_DIRECT != 0 {
			s.reply(unique, -int32(syscall.EINVAL), nil) // through the page cache only
			return
		}
		s.reply(unique, 0, make([]byte, 16))
	case fuseRead:
		if len(body) < 24 {
			s.reply(unique, -int32(syscall.EIO), nil)
			return
		}
		off, size := le.Uint64(body[8:]), le.Uint32(body[16:])
		size = uint32(min(uint64(size), s.size-min(off, s.size)))
		s.mu.Lock()
		if s.stalled {
			s.held = append(s.held, heldRead{unique, size})
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		s.reply(unique, 0, make([]byte, size))
	case fuseRelease, fuseFlush, fuseDestroy:
		s.reply(unique, 0, nil)
	case fuseForget, fuseBatchFgt, fuseInterrupt:
		// no answer
	default:
		s.reply(unique, -int32(syscall.ENOSYS), nil)
	}
}

// attr is node's fuse_attr: the root directory or the file.
func (s *stallFS) attr(node uint64) []byte {
	le := binary.LittleEndian
	a := make([]byte, fuseAttrSize)
	le.PutUint64(a[0:], node)
	mode, nlink := uint32(syscall.S_IFDIR|0o755), uint32(2)
	if node == fuseFileID {
		mode, nlink = syscall.S_IFREG|0o444, 1
		le.PutUint64(a[8:], s.size)
		le.PutUint64(a[16:], (s.size+511)/512)
	}
	le.PutUint32(a[60:], mode)
	le.PutUint32(a[64:], nlink)
	le.PutUint32(a[80:], 4096) // blksize
	return a
}

func (s *stallFS) reply(unique uint64, errno int32, body []byte) {
	out := make([]byte, 16+len(body))
	binary.LittleEndian.PutUint32(out[0:], uint32(len(out)))
	binary.LittleEndian.PutUint32(out[4:], uint32(errno))
	binary.LittleEndian.PutUint64(out[8:], unique)
	copy(out[16:], body)
	_, _ = unix.Write(s.fd, out)
}

func indexZero(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}

// TestStallFSDState: a read of a stalled stallFS file puts the reader in
// D, and it goes on once the reads are answered.
func TestStallFSDState(t *testing.T) {
	testutil.NeedRoot(t, "mounts FUSE")
	fs := mountStallFS(t, "data.bin", 64<<20)
	path := filepath.Join(fs.dir, "data.bin")
	fs.setStalled(true)
	cmd := exec.Command("dd", "if="+path, "of=/dev/null", "bs=256k", "skip=100", "count=1", "iflag=skip_bytes")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	stat := fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid)
	if !testutil.Poll(10*time.Second, 20*time.Millisecond, func() bool {
		b, _ := os.ReadFile(stat)
		i := strings.LastIndexByte(string(b), ')')
		return i > 0 && len(b) > i+2 && b[i+2] == 'D'
	}) {
		b, _ := os.ReadFile(stat)
		t.Fatalf("the reader is not in D with %d reads held (server: %v): %s", fs.heldReads(), fs.serveErr(), b)
	}
	fs.setStalled(false)
	if err := cmd.Wait(); err != nil {
		t.Errorf("the read did not go on once answered: %v", err)
	}
}
