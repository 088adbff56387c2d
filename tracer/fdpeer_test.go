package tracer

import (
	"bufio"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// SocketPeer names the traced process at the other end of a TCP
// connection between two processes of this host, over loopback or over
// one of its other addresses.
func TestSocketPeerLocal(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	addrs := []string{"127.0.0.1"}
	if ifs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range ifs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
				addrs = append(addrs, n.IP.String())
				break
			}
		}
	}
	for _, host := range addrs {
		t.Run(host, func(t *testing.T) {
			l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
			if err != nil {
				t.Skip(err)
			}
			defer l.Close()
			src := `import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
print(s.fileno(), flush=True)
time.sleep(60)
`
			cmd := exec.Command(py, "-c", src, host, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
			stdout, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
			c, err := l.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			line, err := bufio.NewReader(stdout).ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			fd, _ := strconv.Atoi(strings.TrimSpace(line))
			me := uint32(os.Getpid())
			tr := &Tracer{fds: newFDResolver(), procs: map[uint32]*procState{me: {}, uint32(cmd.Process.Pid): {}}}
			addr, peer := tr.SocketPeer(uint32(cmd.Process.Pid), int32(fd))
			if peer != me || !strings.HasPrefix(addr, host+":") {
				t.Errorf("peer %d at %q, want this test's process %d at %s", peer, addr, me, host)
			}
			peers := tr.SocketPeers(uint32(cmd.Process.Pid))
			if _, ok := peers[me]; !ok || len(peers) != 1 {
				t.Errorf("socket peers %v, want this test's process", peers)
			}
		})
	}
}
