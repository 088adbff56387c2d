package tracer

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/event"
)

// fdOf returns the fd number behind a net.Conn / net.Listener / *os.File.
func fdOf(t *testing.T, c interface {
	File() (*os.File, error)
}) (int32, func()) {
	t.Helper()
	// File() dups the fd; the dup refers to the same socket inode, which is
	// what resolution is about.
	f, err := c.File()
	if err != nil {
		t.Fatal(err)
	}
	return int32(f.Fd()), func() { f.Close() }
}

func TestFDResolveFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data.bin")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := newFDResolver()
	pid := uint32(os.Getpid())
	info := r.resolve(pid, int32(f.Fd()))
	if info.kind != event.FDFile || info.path != path {
		t.Fatalf("file: got %+v, want %s", info, path)
	}
	// cached until invalidated
	if _, ok := r.cached(pid, int32(f.Fd())); !ok {
		t.Fatal("resolution not cached")
	}
	r.invalidate(pid, int32(f.Fd()))
	if _, ok := r.cached(pid, int32(f.Fd())); ok {
		t.Fatal("invalidate kept the entry")
	}
	if info := r.resolve(pid, 1<<20); info.kind != event.FDUnknown {
		t.Fatalf("closed fd resolved to %+v", info)
	}
}

func TestFDResolvePipe(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	info := newFDResolver().resolve(uint32(os.Getpid()), int32(pr.Fd()))
	if info.kind != event.FDPipe || len(info.path) < 6 || info.path[:6] != "pipe:[" {
		t.Fatalf("pipe: got %+v", info)
	}
}

func TestFDResolveTCPLoopback(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pid := uint32(os.Getpid())
	r := newFDResolver()

	// Not accepted yet: the peer is whoever listens.
	fd, done := fdOf(t, c.(*net.TCPConn))
	info := r.resolve(pid, fd)
	done()
	if info.kind != event.FDSocket || info.peerAddr != ln.Addr().String() || info.peerPID != pid {
		t.Fatalf("before accept: got %+v, want peer %s pid %d", info, ln.Addr(), pid)
	}

	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fd, done = fdOf(t, c.(*net.TCPConn))
	defer done()
	r2 := newFDResolver()
	info = r2.resolve(pid, fd)
	if info.peerAddr != ln.Addr().String() || info.peerPID != pid {
		t.Fatalf("after accept: got %+v, want peer %s pid %d", info, ln.Addr(), pid)
	}
}

func TestFDResolveUnixSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	fd, done := fdOf(t, ln.(*net.UnixListener))
	defer done()
	info := newFDResolver().resolve(uint32(os.Getpid()), fd)
	if info.kind != event.FDSocket || info.path != path {
		t.Fatalf("unix listener: got %+v, want path %s", info, path)
	}
}

func TestFDOpenedCache(t *testing.T) {
	r := newFDResolver()
	r.opened(7, 3, "/data/shard-1")
	if info, ok := r.cached(7, 3); !ok || info.path != "/data/shard-1" || info.kind != event.FDFile {
		t.Fatalf("opened: %+v %v", info, ok)
	}
	r.opened(7, 4, "relative/path")
	if _, ok := r.cached(7, 4); ok {
		t.Fatal("relative path cached")
	}
	r.forgetProcess(7)
	if _, ok := r.cached(7, 3); ok {
		t.Fatal("forgetProcess kept an entry")
	}
}

// A path longer than the probe copies is restored from /proc, or marked
// truncated when it cannot be, never passed off as whole.
func TestFDOpenedLongPath(t *testing.T) {
	dir := t.TempDir()
	for len(dir) < 300 {
		dir = filepath.Join(dir, strings.Repeat("d", 60))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	full := filepath.Join(dir, "shard.bin")
	f, err := os.Create(full)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := newFDResolver()
	pid, fd := uint32(os.Getpid()), int32(f.Fd())
	r.opened(pid, fd, full[:probePathMax])
	if info, ok := r.cached(pid, fd); !ok || info.path != full {
		t.Errorf("cut path restored as %q, want %q", info.path, full)
	}
	r.opened(pid, 9999, full[:probePathMax]) // no such fd: /proc cannot help
	if info, _ := r.cached(pid, 9999); info.path != full[:probePathMax]+TruncatedMark {
		t.Errorf("unrestorable cut path cached as %q, want it marked", info.path)
	}
}

// A poll or select record takes the socket it waited on when every fd it
// names is one (fds the kernel ignores aside): the fd, the peer and, on
// loopback, the process at the other end, as a recv on it would. Any other
// fd in the set, or fds the program could not list, leave it a plain wait.
func TestWaitedSocket(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sock, done := fdOf(t, c.(*net.TCPConn))
	defer done()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	pipe := int32(pr.Fd())
	const gone = int32(1 << 20) // no such fd: a socket closed before it was resolved
	pid := uint32(os.Getpid())

	tests := []struct {
		name   string
		nr     int32
		fds    []int32
		nfds   uint32
		socks  uint32
		fd     int32
		kind   event.FDKind
		peered bool
	}{
		{"poll on a socket", 7, []int32{sock}, 1, 1, sock, event.FDSocket, true},
		{"ppoll on a socket and an ignored entry", 271, []int32{-1, sock}, 2, 2, sock, event.FDSocket, true},
		{"select on a closed socket", 23, []int32{gone}, 1, 1, gone, event.FDSocket, false},
		{"socket and pipe", 7, []int32{sock, pipe}, 2, 1, -1, event.FDUnknown, false},
		{"pipe only", 7, []int32{pipe}, 1, 0, -1, event.FDUnknown, false},
		{"more fds than listed", 7, []int32{sock, sock, sock, sock}, 9, 15, -1, event.FDUnknown, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := rawSyscall{Hdr: hdr(evSyscall, uint32(event.KindSyscall), pid, pid, tEnd), StartNs: tStart, Ret: 1,
				Nr: tc.nr, Fd: -1, Class: uint32(event.SysPoll), WaitNfds: tc.nfds, WaitSocks: tc.socks, StackId: -1}
			copy(r.WaitFds[:], tc.fds)
			var d decoded
			if err := decodeRecord(asBytes(&r), &d); err != nil {
				t.Fatal(err)
			}
			if want := tc.fds[:min(len(tc.fds), int(tc.nfds))]; !slices.Equal(d.waitFDs, want) {
				t.Fatalf("decoded fds %v, want %v", d.waitFDs, want)
			}
			tr := newUnloadedTracer()
			tr.handle(&d)
			ev := d.ev
			if ev.FD != tc.fd || ev.FDKind != tc.kind {
				t.Fatalf("fd %d kind %d, want %d %d (%+v)", ev.FD, ev.FDKind, tc.fd, tc.kind, ev)
			}
			if peered := ev.PeerAddr == ln.Addr().String() && ev.PeerPID == pid; peered != tc.peered {
				t.Errorf("peer %q pid %d, want peer %v", ev.PeerAddr, ev.PeerPID, tc.peered)
			}
		})
	}
}

// socketPair is a connected pair of unnamed unix sockets, closed when the
// test ends.
func socketPair(tb testing.TB) [2]int {
	tb.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		syscall.Close(fds[0])
		syscall.Close(fds[1])
	})
	return [2]int{fds[0], fds[1]}
}

// An unnamed unix socket (socketpair: a DataLoader worker's connection) is
// resolved once: each lookup reads every socket table of the namespace.
func TestFDResolveUnnamedUnixSocketCached(t *testing.T) {
	fds := socketPair(t)
	pid := uint32(os.Getpid())
	r := newFDResolver()
	info := r.resolve(pid, int32(fds[0]))
	if info.kind != event.FDSocket || !strings.HasPrefix(info.path, "socket:[") || info.recheck != 0 {
		t.Fatalf("socketpair: got %+v", info)
	}
	if c, ok := r.cached(pid, int32(fds[0])); !ok || c.recheck != 0 {
		t.Fatalf("socketpair not kept as final: %+v %v", c, ok)
	}
	// A kept entry answers without /proc: a wrong root would fail a lookup.
	r.procRoot = t.TempDir()
	if again := r.resolve(pid, int32(fds[0])); again.path != info.path {
		t.Fatalf("second resolve: %+v, want %+v", again, info)
	}
}

// A socket in no table yet (created, not connected) is kept for
// socketRecheck, then looked up again: it finds its peer once connected.
func TestFDResolveSocketRecheck(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	pid := uint32(os.Getpid())
	r := newFDResolver()
	info := r.resolve(pid, int32(fd))
	if info.kind != event.FDSocket || info.peerAddr != "" {
		t.Fatalf("unconnected: got %+v", info)
	}
	kept, ok := r.cached(pid, int32(fd))
	if !ok || kept.recheck == 0 {
		t.Fatalf("unconnected socket kept without a recheck: %+v %v", kept, ok)
	}
	addr := ln.Addr().(*net.TCPAddr)
	if err := syscall.Connect(fd, &syscall.SockaddrInet4{Port: addr.Port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if again := r.resolve(pid, int32(fd)); again.peerAddr != "" {
		t.Fatalf("looked up again before the recheck: %+v", again)
	}
	kept.recheck = time.Now().Add(-time.Millisecond).UnixNano()
	r.mu.Lock()
	r.cache[fdKey{pid, int32(fd)}] = kept
	r.mu.Unlock()
	if again := r.resolve(pid, int32(fd)); again.peerAddr != ln.Addr().String() {
		t.Fatalf("after the recheck: got %+v, want peer %s", again, ln.Addr())
	}
	if c, _ := r.cached(pid, int32(fd)); c.recheck != 0 {
		t.Fatalf("connected socket still rechecked: %+v", c)
	}
}

// The kernel names each socket's protocol; only that socket's table is
// read, and a socket no table lists (netlink) needs none.
func TestSockProto(t *testing.T) {
	pid := os.Getpid()
	for _, tc := range []struct {
		domain, typ int
		want        string
	}{
		{syscall.AF_UNIX, syscall.SOCK_STREAM, "UNIX-STREAM"},
		{syscall.AF_INET, syscall.SOCK_STREAM, "TCP"},
		{syscall.AF_INET6, syscall.SOCK_DGRAM, "UDPv6"},
		{syscall.AF_NETLINK, syscall.SOCK_RAW, "NETLINK"},
	} {
		fd, err := syscall.Socket(tc.domain, tc.typ|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		link := filepath.Join("/proc", strconv.Itoa(pid), "fd", strconv.Itoa(fd))
		if got := sockProto(link); got != tc.want {
			t.Errorf("socket(%d, %d): %q, want %q", tc.domain, tc.typ, got, tc.want)
		}
		if tc.domain == syscall.AF_NETLINK {
			info := newFDResolver().resolve(uint32(pid), int32(fd))
			if info.kind != event.FDSocket || info.recheck != 0 {
				t.Errorf("netlink socket: %+v, want a final socket", info)
			}
		}
		syscall.Close(fd)
	}
	if got := sockProto(filepath.Join(t.TempDir(), "none")); got != "" {
		t.Errorf("no such link: %q", got)
	}
}

// BenchmarkResolveUnixSocket: a fresh unix socket's first lookup, with the
// protocol the kernel names and without it (every table, as before).
func BenchmarkResolveUnixSocket(b *testing.B) {
	fds := socketPair(b)
	pid := uint32(os.Getpid())
	target, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(int(pid)), "fd", strconv.Itoa(fds[0])))
	if err != nil {
		b.Fatal(err)
	}
	ino, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]"), 10, 64)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("named", func(b *testing.B) {
		for b.Loop() {
			newFDResolver().resolve(pid, int32(fds[0]))
		}
	})
	b.Run("every-table", func(b *testing.B) {
		r := newFDResolver()
		for b.Loop() {
			r.socket(pid, ino, target, "")
		}
	})
}

// A file in /dev/shm is a file (a dataset or checkpoint kept in memory:
// its reads and writes are io.read and io.write); a device node is not.
func TestFDResolveShmFile(t *testing.T) {
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skip("no /dev/shm")
	}
	f, err := os.CreateTemp("/dev/shm", "gaptrace-fds-*")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	null, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	pid := uint32(os.Getpid())
	r := newFDResolver()
	if info := r.resolve(pid, int32(f.Fd())); info.kind != event.FDFile || info.path != f.Name() {
		t.Errorf("/dev/shm file: %+v, want a file", info)
	}
	if info := r.resolve(pid, int32(null.Fd())); info.kind != event.FDOther {
		t.Errorf("/dev/null: %+v, want other", info)
	}
	r.opened(9, 4, "/dev/shm/batch-1")
	r.opened(9, 5, "/dev/nvidia0")
	if info, _ := r.cached(9, 4); info.kind != event.FDFile {
		t.Errorf("opened /dev/shm file: %+v, want a file", info)
	}
	if info, _ := r.cached(9, 5); info.kind != event.FDOther {
		t.Errorf("opened device: %+v, want other", info)
	}
}
