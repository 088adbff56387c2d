package tracer

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"

	"github.com/gaptrace/gaptrace/event"
)

// fdInfo is what an fd referred to when it was resolved.
type fdInfo struct {
	kind     event.FDKind
	path     string // file path, "pipe:[ino]", unix socket path or "socket:[ino]"
	peerAddr string // tcp/udp peer "ip:port"
	peerPID  uint32 // loopback tcp: the process that owns the other end
	// recheck, when not zero, is when a socket that may still change
	// (not connected yet, or in no table) is looked up again (unix ns).
	recheck int64
}

type fdKey struct {
	pid uint32
	fd  int32
}

// fdResolver resolves (pid, fd) to a file path or socket peer through /proc.
// Results are cached until an openat/close event for that fd invalidates
// them, so a hot read loop costs one readlink per fd, not one per event.
type fdResolver struct {
	procRoot string

	mu    sync.Mutex
	cache map[fdKey]fdInfo
	// socket inode → owning pid, rebuilt from /proc/*/fd at most once per
	// inodeTTL when a loopback peer is not found in it.
	inodes      map[uint64]uint32
	inodesBuilt time.Time
}

// inodeRescan rate-limits rescans of every /proc/PID/fd after a miss.
const inodeTTL = 20 * time.Millisecond

// socketRecheck is how long the resolution of a socket that may still
// connect is kept: each lookup reads the namespace's tcp, udp and unix
// tables, and a loop on such a socket (a DataLoader's connection, a
// client polling before it connects) would otherwise read them per event.
const socketRecheck = 200 * time.Millisecond

// newFDResolver resolves fds through gaptrace's /proc (procRoot).
func newFDResolver() *fdResolver {
	return &fdResolver{procRoot: procRoot, cache: make(map[fdKey]fdInfo)}
}

func (r *fdResolver) invalidate(pid uint32, fd int32) {
	r.mu.Lock()
	delete(r.cache, fdKey{pid, fd})
	r.mu.Unlock()
}

func (r *fdResolver) forgetProcess(pid uint32) {
	r.mu.Lock()
	for k := range r.cache {
		if k.pid == pid {
			delete(r.cache, k)
		}
	}
	r.mu.Unlock()
}

// opened records the path an openat returned fd for. A relative path is
// left to the lazy /proc lookup, which yields the absolute one.
func (r *fdResolver) opened(pid uint32, fd int32, path string) {
	if len(path) >= probePathMax {
		path = r.untruncate(pid, fd, path)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	k := fdKey{pid, fd}
	if !strings.HasPrefix(path, "/") {
		delete(r.cache, k)
		return
	}
	r.cache[k] = fdInfo{kind: pathKind(path), path: path}
}

// pathKind is the kind of an fd on an absolute path: a file, but a device
// node under /dev is other, except the files of /dev/shm (POSIX shared
// memory, and datasets or checkpoints kept in memory), which are files.
func pathKind(path string) event.FDKind {
	if strings.HasPrefix(path, "/dev/") && !strings.HasPrefix(path, "/dev/shm/") {
		return event.FDOther
	}
	return event.FDFile
}

// probePathMax is the longest path the probe copies (PATH_LEN in
// bpf/events.h, less the NUL); a path this long may have been cut.
const probePathMax = 255

// TruncatedMark ends a path the probe cut that /proc could not restore.
const TruncatedMark = "…[truncated]"

// untruncate replaces a path the probe may have cut with the full one
// from /proc/PID/fd (the fd is normally still open this soon after
// openat); when /proc cannot confirm it, the path is marked truncated
// rather than passed off as whole.
func (r *fdResolver) untruncate(pid uint32, fd int32, path string) string {
	target, err := os.Readlink(filepath.Join(r.procRoot, strconv.Itoa(int(pid)), "fd", strconv.Itoa(int(fd))))
	if err == nil && strings.HasPrefix(target, path) {
		return target
	}
	return path + TruncatedMark
}

// cached returns the cached resolution without touching /proc (close events
// report what the fd was before it is forgotten).
func (r *fdResolver) cached(pid uint32, fd int32) (fdInfo, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	info, ok := r.cache[fdKey{pid, fd}]
	return info, ok
}

func (r *fdResolver) resolve(pid uint32, fd int32) fdInfo {
	if fd < 0 {
		return fdInfo{}
	}
	k := fdKey{pid, fd}
	now := time.Now().UnixNano()
	r.mu.Lock()
	if info, ok := r.cache[k]; ok && (info.recheck == 0 || now < info.recheck) {
		r.mu.Unlock()
		info.recheck = 0
		return info
	}
	r.mu.Unlock()

	info := r.lookup(pid, fd)
	if info.kind == event.FDUnknown {
		return info // the fd is gone (or not readable): nothing to keep
	}
	r.mu.Lock()
	r.cache[k] = info
	r.mu.Unlock()
	info.recheck = 0
	return info
}

func (r *fdResolver) lookup(pid uint32, fd int32) fdInfo {
	link := filepath.Join(r.procRoot, strconv.Itoa(int(pid)), "fd", strconv.Itoa(int(fd)))
	target, err := os.Readlink(link)
	if err != nil {
		return fdInfo{}
	}
	switch {
	case strings.HasPrefix(target, "socket:["):
		ino, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]"), 10, 64)
		if err != nil {
			return fdInfo{kind: event.FDSocket, path: target}
		}
		return r.socket(pid, ino, target, sockProto(link))
	case strings.HasPrefix(target, "pipe:["):
		return fdInfo{kind: event.FDPipe, path: target}
	case strings.HasPrefix(target, "/"):
		return fdInfo{kind: pathKind(target), path: target}
	default: // anon_inode:[eventfd], ...
		return fdInfo{kind: event.FDOther, path: target}
	}
}

// socket finds the socket inode in the process's network namespace tables.
// What may still change is marked for a recheck: a socket in no table (not
// connected yet, or gone) and an IP socket without a peer (listening, or a
// UDP socket that may connect). A unix socket's entry is final, named or
// not (socketpair, a DataLoader worker's connection).
//
// proto is the socket's protocol as the kernel names it (sockProto): only
// its table is read ("" when unknown: all of them). A DataLoader makes a
// unix socket connection for every batch whose storage it passes on; each
// read the four IP tables before the unix one.
func (r *fdResolver) socket(pid uint32, ino uint64, target, proto string) fdInfo {
	info := fdInfo{kind: event.FDSocket, path: target, recheck: time.Now().Add(socketRecheck).UnixNano()}
	unixSock := strings.HasPrefix(proto, "UNIX")
	if proto != "" && !unixSock && !slices.Contains([]string{"TCP", "TCPv6", "UDP", "UDPv6"}, proto) {
		info.recheck = 0 // netlink, packet, ...: in none of the tables
		return info
	}
	fs, err := procfs.NewFS(filepath.Join(r.procRoot, strconv.Itoa(int(pid))))
	if err != nil {
		return info
	}
	type table struct {
		proto string
		read  func() ([]ipSocket, error)
		tcp   bool
	}
	tables := []table{
		// /proc/net/tcp{,6} stay in every kernel; the netlink query procfs
		// recommends instead would be a second resolver to maintain.
		{"TCP", func() ([]ipSocket, error) { return fromTCP(fs.NetTCP()) }, true},    //nolint:staticcheck // see above
		{"TCPv6", func() ([]ipSocket, error) { return fromTCP(fs.NetTCP6()) }, true}, //nolint:staticcheck // see above
		{"UDP", func() ([]ipSocket, error) { return fromUDP(fs.NetUDP()) }, false},
		{"UDPv6", func() ([]ipSocket, error) { return fromUDP(fs.NetUDP6()) }, false},
	}
	for _, tb := range tables {
		if unixSock || proto != "" && proto != tb.proto {
			continue
		}
		rows, err := tb.read()
		if err != nil {
			continue
		}
		for _, s := range rows {
			if s.inode != ino {
				continue
			}
			if s.remPort != 0 {
				info.peerAddr = net.JoinHostPort(s.remIP.String(), strconv.FormatUint(s.remPort, 10))
				info.recheck = 0
			}
			if tb.tcp && s.remIP.IsLoopback() {
				info.peerPID = r.loopbackPeer(rows, s)
			}
			return info
		}
	}
	if proto != "" && !unixSock {
		return info
	}
	if u, err := fs.NetUNIX(); err == nil {
		for _, row := range u.Rows {
			if row.Inode == ino {
				if row.Path != "" {
					info.path = row.Path
				}
				info.recheck = 0
				return info
			}
		}
	}
	return info
}

type ipSocket struct {
	localIP, remIP     net.IP
	localPort, remPort uint64
	inode              uint64
	state              uint64
}

func fromTCP(t procfs.NetTCP, err error) ([]ipSocket, error) {
	if err != nil {
		return nil, err
	}
	out := make([]ipSocket, 0, len(t))
	for _, l := range t {
		out = append(out, ipSocket{localIP: l.LocalAddr, remIP: l.RemAddr, localPort: l.LocalPort, remPort: l.RemPort, inode: l.Inode, state: l.St})
	}
	return out, nil
}

func fromUDP(t procfs.NetUDP, err error) ([]ipSocket, error) {
	if err != nil {
		return nil, err
	}
	out := make([]ipSocket, 0, len(t))
	for _, l := range t {
		out = append(out, ipSocket{localIP: l.LocalAddr, remIP: l.RemAddr, localPort: l.LocalPort, remPort: l.RemPort, inode: l.Inode, state: l.St})
	}
	return out, nil
}

// loopbackPeer finds the other end of a loopback TCP connection (the socket
// whose local address is our remote one and vice versa) and the process
// that holds it.
func (r *fdResolver) loopbackPeer(rows []ipSocket, s ipSocket) uint32 {
	for _, o := range rows {
		if o.inode == 0 || o.inode == s.inode {
			continue
		}
		if o.localPort == s.remPort && o.remPort == s.localPort && o.localIP.Equal(s.remIP) && o.remIP.Equal(s.localIP) {
			if pid := r.inodeOwner(o.inode); pid != 0 {
				return pid
			}
			break
		}
	}
	// Not accepted yet (an unaccepted socket has no inode) or its holder
	// not found: the server is whoever holds the listening socket.
	for _, o := range rows {
		if o.state == tcpListen && o.inode != 0 && o.localPort == s.remPort && (o.localIP.Equal(s.remIP) || o.localIP.IsUnspecified()) {
			return r.inodeOwner(o.inode)
		}
	}
	return 0
}

const tcpListen = 0x0a

func (r *fdResolver) inodeOwner(ino uint64) uint32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if pid, ok := r.inodes[ino]; ok {
		return pid
	}
	if time.Since(r.inodesBuilt) < inodeTTL && r.inodes != nil {
		return 0
	}
	r.inodes = scanSocketInodes(r.procRoot)
	r.inodesBuilt = time.Now()
	return r.inodes[ino]
}

// scanSocketInodes maps every socket inode on the host to the pid that holds
// it (the lowest pid when shared, usually the process that created it).
func scanSocketInodes(procRoot string) map[uint64]uint32 {
	m := make(map[uint64]uint32)
	dirs, err := os.ReadDir(procRoot)
	if err != nil {
		return m
	}
	for _, d := range dirs {
		pid, err := strconv.ParseUint(d.Name(), 10, 32)
		if err != nil {
			continue
		}
		fdDir := filepath.Join(procRoot, d.Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			t, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
			if err != nil || !strings.HasPrefix(t, "socket:[") {
				continue
			}
			ino, err := strconv.ParseUint(t[len("socket:["):len(t)-1], 10, 64)
			if err != nil {
				continue
			}
			if old, ok := m[ino]; !ok || uint32(pid) < old {
				m[ino] = uint32(pid)
			}
		}
	}
	return m
}

// taskComms caches thread names (/proc/PID/task/TID/comm).
type taskComms struct {
	procRoot string
	mu       sync.Mutex
	m        map[uint32]string
}

func (c *taskComms) get(pid, tid uint32) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.m[tid]; ok {
		return s
	}
	b, err := os.ReadFile(fmt.Sprintf("%s/%d/task/%d/comm", c.procRoot, pid, tid))
	if err != nil {
		return ""
	}
	s := strings.TrimSpace(string(b))
	if c.m == nil {
		c.m = make(map[uint32]string)
	}
	c.m[tid] = s
	return s
}

func (c *taskComms) set(tid uint32, comm string) {
	c.mu.Lock()
	if c.m == nil {
		c.m = make(map[uint32]string)
	}
	c.m[tid] = comm
	c.mu.Unlock()
}

func (c *taskComms) forget(tid uint32) {
	c.mu.Lock()
	delete(c.m, tid)
	c.mu.Unlock()
}

// sockProto is the protocol of the socket an fd link names, as the kernel
// gives it in the socket's system.sockprotoname attribute: "UNIX-STREAM",
// "TCP", "TCPv6", "UDP", "NETLINK", ...; "" when it cannot be read.
func sockProto(fdLink string) string {
	var b [32]byte
	n, err := unix.Getxattr(fdLink, "system.sockprotoname", b[:])
	if err != nil || n <= 0 || n > len(b) {
		return ""
	}
	return strings.TrimRight(string(b[:n]), "\x00")
}
