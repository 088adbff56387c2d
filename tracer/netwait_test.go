package tracer

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/event"
	"github.com/gaptrace/gaptrace/internal/testutil"
)

// TestSocketWaitsCarryPeer traces testdata/netwait.py, a real CPython
// doing what a training loop's metrics client does: an HTTP request through
// http.client with a socket timeout (CPython waits in poll on the socket,
// then reads without blocking) and a select() on a socket, each to a server
// in this process that answers 40 ms late, then a poll on a pipe a thread
// writes 40 ms later. The socket waits are emitted with the socket's fd,
// its peer address and, on loopback, this process as the peer; the pipe's
// stays a wait on no resolved fd.
func TestSocketWaitsCarryPeer(t *testing.T) {
	testutil.NeedRoot(t, "traces with eBPF")
	py := testutil.Pythons(t)[0]
	const delay = 40 * time.Millisecond
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		time.Sleep(time.Duration(ms) * time.Millisecond)
		fmt.Fprintln(w, "ok")
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")

	tr := newTestTracer(t, Config{Probes: ProbesLite})
	script, err := filepath.Abs(filepath.Join("testdata", "netwait.py"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", "-c", `read _ && exec "$0" "$@"`, py, script, addr, strconv.Itoa(int(delay/time.Millisecond)))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := uint32(cmd.Process.Pid)
	defer func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	}()
	if err := tr.Trace(int(pid)); err != nil {
		_ = cmd.Process.Kill()
		t.Fatalf("Trace: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	evc := make(chan event.Event, 4096)
	runErr := make(chan error, 1)
	go func() { runErr <- tr.Run(ctx, evc) }()
	var mu sync.Mutex
	var events []event.Event
	go func() {
		for ev := range evc {
			mu.Lock()
			events = append(events, ev)
			mu.Unlock()
		}
	}()
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}

	var waits []netWait
	sc := bufio.NewScanner(stdout)
	for len(waits) < 3 && sc.Scan() {
		var w netWait
		if err := json.Unmarshal(sc.Bytes(), &w); err != nil {
			t.Fatalf("netwait.py line %q: %v", sc.Text(), err)
		}
		waits = append(waits, w)
	}
	if len(waits) < 3 {
		t.Fatalf("netwait.py reported %d waits: %s", len(waits), stderr.String())
	}
	// The waits ended while the script still holds its sockets: find each
	// one's event before letting it exit.
	found := findNetWaits(&mu, &events, waits, delay)
	_ = stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("netwait.py: %v\n%s", err, stderr.String())
	}
	cancel()
	if err := <-runErr; err != nil {
		t.Fatalf("Run: %v", err)
	}
	checkSocketWaits(t, waits, found, addr, delay)
}

// netWait is one wait testdata/netwait.py reports having made.
type netWait struct {
	What string `json:"what"`
	PID  uint32 `json:"pid"`
	TID  uint32 `json:"tid"`
	FD   int32  `json:"fd"`
}

// findNetWaits finds, within 30 s, the event of each of waits among the
// traced events (appended under mu): the first readiness wait of the
// thread that lasted most of delay, after the previous wait's.
func findNetWaits(mu *sync.Mutex, events *[]event.Event, waits []netWait, delay time.Duration) map[string]event.Event {
	long := func(ev event.Event, w netWait) bool {
		return ev.Kind == event.KindSyscall && ev.Syscall == event.SysPoll && ev.PID == w.PID && ev.TID == w.TID &&
			ev.Duration() >= int64(delay)*3/4
	}
	found := map[string]event.Event{}
	for deadline := time.Now().Add(30 * time.Second); len(found) < len(waits) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		mu.Lock()
		evs := *events
		for _, w := range waits {
			if _, ok := found[w.What]; ok {
				continue
			}
			// The waits come in order: each one's event is the first long
			// readiness wait after the previous one's.
			var after int64
			for _, prev := range waits {
				if prev.What == w.What {
					break
				}
				after = max(after, found[prev.What].End)
			}
			for _, ev := range evs {
				if long(ev, w) && ev.Start >= after {
					found[w.What] = ev
					break
				}
			}
		}
		mu.Unlock()
	}
	return found
}

// checkSocketWaits checks the events found for each wait: the socket waits
// carry the socket's fd, the peer address addr and this process as the
// peer; the pipe's stays a wait on no resolved fd.
func checkSocketWaits(t *testing.T, waits []netWait, found map[string]event.Event, addr string, delay time.Duration) {
	t.Helper()
	self := uint32(os.Getpid())
	for _, w := range waits {
		ev, ok := found[w.What]
		if !ok {
			t.Errorf("%s: no readiness wait of %v on thread %d", w.What, delay, w.TID)
			continue
		}
		t.Logf("%s: %s %v fd %d kind %d path %q peer %s pid %d", w.What, ev.Name, time.Duration(ev.Duration()), ev.FD, ev.FDKind, ev.Path, ev.PeerAddr, ev.PeerPID)
		if w.What == "pipe" {
			if ev.FD != -1 || ev.FDKind != event.FDUnknown || ev.PeerAddr != "" {
				t.Errorf("pipe: poll resolved to fd %d kind %d peer %q, want no socket", ev.FD, ev.FDKind, ev.PeerAddr)
			}
			continue
		}
		if ev.FD != w.FD || ev.FDKind != event.FDSocket || ev.PeerAddr != addr || ev.PeerPID != self {
			t.Errorf("%s: %s on fd %d kind %d peer %q pid %d, want fd %d, socket, peer %s pid %d",
				w.What, ev.Name, ev.FD, ev.FDKind, ev.PeerAddr, ev.PeerPID, w.FD, addr, self)
		}
	}
}
