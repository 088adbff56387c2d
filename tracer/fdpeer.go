package tracer

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
	return info.peerAddr, info.peerPID
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
