package tracer

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/prometheus/procfs"
)

// Socket peers for the hang watch: a rank whose collective is not an NCCL
// call (gloo, a hand-written all-reduce over TCP) waits in a socket, and
// the process at the other end is the rank it waits for. Both are read on
// demand, for a call already long in flight, through the fd resolver's
// cache: nothing is done per event.

// SocketPeer is the other end of socket fd of pid: its address and, for a
// loopback TCP connection, the pid that holds it (0: unknown or not a
// socket).
func (t *Tracer) SocketPeer(pid uint32, fd int32) (addr string, peer uint32) {
	info := t.fds.resolve(pid, fd)
	if info.peerPID == 0 && info.peerAddr != "" {
		// A connection between two processes of this host over one of
		// its other addresses (gloo binds to the host name's).
		info.peerPID = t.localPeer(pid, info.path)
	}
	return info.peerAddr, info.peerPID
}

// localPeer finds the traced process at the other end of a TCP
// connection of pid that stays on this host (its socket target
// "socket:[ino]"): the row of pid's network namespace whose addresses are
// the connection's, swapped.
func (t *Tracer) localPeer(pid uint32, target string) uint32 {
	ino, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]"), 10, 64)
	if err != nil {
		return 0
	}
	fs, err := procfs.NewFS(filepath.Join(procRoot, strconv.Itoa(int(pid))))
	if err != nil {
		return 0
	}
	for _, read := range []func() ([]ipSocket, error){
		func() ([]ipSocket, error) { return fromTCP(fs.NetTCP()) },  //nolint:staticcheck // as fds.go
		func() ([]ipSocket, error) { return fromTCP(fs.NetTCP6()) }, //nolint:staticcheck // as fds.go
	} {
		rows, err := read()
		if err != nil {
			continue
		}
		for _, s := range rows {
			if s.inode != ino {
				continue
			}
			for _, o := range rows {
				if o.inode != 0 && o.inode != ino && o.localPort == s.remPort && o.remPort == s.localPort &&
					o.localIP.Equal(s.remIP) && o.remIP.Equal(s.localIP) {
					return t.tracedOwner(o.inode)
				}
			}
			return 0
		}
	}
	return 0
}

// tracedOwner is the traced process holding socket inode ino (0: none).
func (t *Tracer) tracedOwner(ino uint64) uint32 {
	want := "socket:[" + strconv.FormatUint(ino, 10) + "]"
	for _, p := range t.Processes() {
		dir := filepath.Join(procRoot, strconv.Itoa(p), "fd")
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for i, e := range ents {
			if i >= maxPeerFDs {
				break
			}
			if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && l == want {
				return uint32(p)
			}
		}
	}
	return 0
}

// maxPeerFDs bounds the fds of one process looked at by SocketPeers.
const maxPeerFDs = 4096

// SocketPeers maps the processes at the other end of pid's loopback TCP
// connections to the address pid reaches each at.
func (t *Tracer) SocketPeers(pid uint32) map[uint32]string {
	dir := filepath.Join(procRoot, strconv.Itoa(int(pid)), "fd")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out map[uint32]string
	for i, e := range ents {
		if i >= maxPeerFDs {
			break
		}
		fd, err := strconv.ParseInt(e.Name(), 10, 32)
		if err != nil {
			continue
		}
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err != nil || !strings.HasPrefix(l, "socket:[") {
			continue
		}
		if addr, peer := t.SocketPeer(pid, int32(fd)); peer != 0 && peer != pid {
			if out == nil {
				out = map[uint32]string{}
			}
			out[peer] = addr
		}
	}
	return out
}
