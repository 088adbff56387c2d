package accuracy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/correlate"
	"github.com/gaptrace/gaptrace/event"
)

// minPyNamed is the share of each stall kind's gaps whose code location
// must be the stall's own blocking call: function, file and line.
const minPyNamed = 0.9

type pyStackRecord struct {
	Type       string `json:"type"`
	PID        int    `json:"pid"`
	Kind       string `json:"kind"`
	Start      int64  `json:"start"`
	End        int64  `json:"end"`
	Function   string `json:"function"`
	File       string `json:"file"`
	Line       int    `json:"line"`
	LaunchLine int    `json:"launch_line"`
	SyncLine   int    `json:"sync_line"`
}

// TestPythonStacks traces pytrain.py with host stalls in named functions (an
// O_DIRECT read, a sleep, copies from pageable memory, a request to a TCP
// server run here, outside the traced job) and GIL bursts, and checks that the gaps each stall caused
// name its function, file and line from the Python frames gaptrace walked
// (at least minPyNamed of them per kind), as do the gaps the GIL caused
// (the driver call after which the main thread waited for it), in the gaps
// file and in the spans.
func TestPythonStacks(t *testing.T) {
	s := need(t)
	var peer string
	dir := runPytrain(t, s, "pytrain-stacks", func(dir string) []string {
		peer = startLatePeer(t)
		return []string{"--steps", "200", "--burst-every", "6", "--burst-ms", "30", "--stall-every", "5", "--stall-ms", "20",
			"--data-dir", dir, "--peer", peer, "--pageable"}
	})
	truthPath := filepath.Join(dir, "truth.jsonl")
	gapsPath := filepath.Join(dir, "gaps.jsonl")
	spansPath := filepath.Join(dir, "spans.jsonl")
	recs, err := readJSONL[pyStackRecord](truthPath)
	if err != nil {
		t.Fatal(err)
	}
	var meta pyStackRecord
	var stalls, bursts []pyStackRecord
	for _, r := range recs {
		switch r.Type {
		case "meta":
			meta = r
		case "stall":
			stalls = append(stalls, r)
		case "burst":
			bursts = append(bursts, r)
		}
	}
	out, err := os.ReadFile(filepath.Join(dir, "gaptrace.log"))
	if err != nil {
		t.Fatal(err)
	}
	attached, libs := attachTime(strings.Split(string(out), "\n"), meta.PID)
	if libs < 1 {
		t.Fatalf("gaptrace never attached to libcuda of pid %d (log in %s)", meta.PID, dir)
	}
	gaps, err := readJSONL[correlate.Gap](gapsPath)
	if err != nil {
		t.Fatal(err)
	}
	// A gap belongs to an interval when most of it lies inside.
	inside := func(g correlate.Gap, start, end int64) bool {
		ov := min(g.End, end) - max(g.Start, start)
		return ov > 0 && 2*ov >= g.Duration
	}
	type tally struct{ gaps, named int }
	byKind := map[string]*tally{}
	want := map[string]event.Frame{} // kind → the frame, for the spans
	for _, st := range stalls {
		if st.Start < attached+gilSettle {
			continue
		}
		k := byKind[st.Kind]
		if k == nil {
			k = &tally{}
			byKind[st.Kind] = k
		}
		w := event.Frame{Function: st.Function, File: st.File, Line: st.Line}
		want[st.Kind] = w
		for _, g := range gaps {
			if !inside(g, st.Start, st.End) {
				continue
			}
			k.gaps++
			if f, ok := correlate.SiteFrame(g.Evidence.Stack); ok && f == w {
				k.named++
			} else if k.gaps-k.named <= 2 {
				t.Logf("%s stall gap (%s, %.1f ms) at %s, want %s; stack %v", st.Kind, g.Cause, float64(g.Duration)/1e6,
					correlate.CallSite(f), correlate.CallSite(w), g.Evidence.Stack)
			}
		}
	}
	gil := &tally{}
	sites := gilSites(meta)
	for _, b := range bursts {
		if b.Start < attached+gilSettle {
			continue
		}
		for _, g := range gaps {
			if g.Cause != correlate.CauseLock || !inside(g, b.Start, b.End) {
				continue
			}
			gil.gaps++
			if f, ok := correlate.SiteFrame(g.Evidence.Stack); ok && sites[f] {
				gil.named++
			} else if gil.gaps-gil.named <= 2 {
				t.Logf("GIL gap at %s; stack %v", correlate.CallSite(f), g.Evidence.Stack)
			}
		}
	}
	byKind["gil"] = gil
	var summary []string
	for _, kind := range []string{"read", "sleep", "pageable", "socket", "gil"} {
		k := byKind[kind]
		if k == nil || k.gaps < 5 {
			t.Errorf("%s: %v gaps inside the stalls, want at least 5 (outputs in %s)", kind, k, dir)
			continue
		}
		rate := float64(k.named) / float64(k.gaps)
		summary = append(summary, fmt.Sprintf("%s %d/%d (%.2f)", kind, k.named, k.gaps, rate))
		if rate < minPyNamed {
			t.Errorf("%s: %d of %d gaps name the stall's call site, want ≥ %.0f%% (outputs in %s)", kind, k.named, k.gaps, 100*minPyNamed, dir)
		}
	}
	t.Logf("gaps naming their stall's function, file and line: %s", strings.Join(summary, ", "))
	checkPySpans(t, spansPath, want)
}

// gilSites are the call sites where pytrain's main thread takes the GIL
// back: the driver calls and the schedstat read of each step.
func gilSites(meta pyStackRecord) map[event.Frame]bool {
	// The main thread takes the GIL back after every call that released
	// it: the driver calls, and the read of its own schedstat each step
	// (pytrain's run_delay_ns). The gap is charged to its longest wait.
	sites := map[event.Frame]bool{
		{Function: "Driver.launch", File: meta.File, Line: meta.LaunchLine}: true,
		{Function: "Driver.sync", File: meta.File, Line: meta.SyncLine}:     true,
	}
	if src, err := os.ReadFile(meta.File); err == nil {
		in := false
		for i, l := range strings.Split(string(src), "\n") {
			if strings.HasPrefix(l, "def run_delay_ns(") {
				in = true
			} else if in && strings.Contains(l, "os.pread(") {
				sites[event.Frame{Function: "run_delay_ns", File: meta.File, Line: i + 1}] = true
				break
			}
		}
	}
	return sites
}

// checkPySpans looks for a gap span per stall kind carrying its code
// location as OpenTelemetry code attributes.
func checkPySpans(t *testing.T, path string, want map[string]event.Frame) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	found := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		var sp struct {
			Attributes map[string]any `json:"attributes"`
		}
		if err := json.Unmarshal(sc.Bytes(), &sp); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		a := sp.Attributes
		line, _ := a["code.line.number"].(float64)
		for kind, w := range want {
			if a["code.function.name"] == w.Function && a["code.file.path"] == w.File && int(line) == w.Line &&
				strings.Contains(fmt.Sprint(a["code.stacktrace"]), fmt.Sprintf("%s (%s:%d)", w.Function, w.File, w.Line)) {
				found[kind] = true
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for kind, w := range want {
		if !found[kind] {
			t.Errorf("no span of a %s stall gap with code.function.name %s, code.file.path %s, code.line.number %d", kind, w.Function, w.File, w.Line)
		}
	}
}

// startLatePeer serves pytrain's fetch_remote from this test process, which
// gaptrace does not trace: each request is a line holding a number of ms,
// answered after that long, as a slow remote data service would.
func startLatePeer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				rd := bufio.NewReader(c)
				for {
					line, err := rd.ReadString('\n')
					if err != nil {
						return
					}
					ms, err := strconv.Atoi(strings.TrimSpace(line))
					if err != nil {
						return
					}
					time.Sleep(time.Duration(ms) * time.Millisecond)
					if _, err := c.Write([]byte("ok")); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}
