package tracer

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/procfs"

	"github.com/gaptrace/gaptrace/event"
	"github.com/gaptrace/gaptrace/internal/testutil"
)

func probeScript(t testing.TB) string {
	p, err := filepath.Abs(filepath.Join("testdata", "pyprobe.py"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPyLineTables decodes the line table of every code object of a real
// file with the decoder of the interpreter's version and compares each
// instruction's line with what the interpreter says (co_lines; for 3.9 the
// line starts of dis.findlinestarts).
func TestPyLineTables(t *testing.T) {
	for _, py := range testutil.Pythons(t) {
		t.Run(testName(py), func(t *testing.T) {
			out, err := exec.Command(py, probeScript(t), "--lines").Output()
			if err != nil {
				t.Fatalf("%s --lines: %v", py, err)
			}
			var r struct {
				Version [2]int
				Codes   []struct {
					Name        string
					Firstlineno int
					Linetable   string
					Lines       []int
				}
			}
			if err := json.Unmarshal(out, &r); err != nil {
				t.Fatal(err)
			}
			t.Logf("python %d.%d: %d code objects", r.Version[0], r.Version[1], len(r.Codes))
			checked := 0
			for _, c := range r.Codes {
				tab, err := hex.DecodeString(c.Linetable)
				if err != nil {
					t.Fatal(err)
				}
				for unit, want := range c.Lines {
					var got int
					switch r.Version[1] {
					case 9:
						got = lnotabLine(tab, c.Firstlineno, 2*unit)
					case 10:
						got = linetable310Line(tab, c.Firstlineno, 2*unit)
					default:
						got = locationLine(tab, c.Firstlineno, unit)
					}
					if got != want {
						t.Errorf("%s offset %d: line %d, want %d", c.Name, 2*unit, got, want)
					}
					checked++
				}
			}
			if checked < 100 {
				t.Fatalf("only %d instructions checked", checked)
			}
		})
	}
}

// TestPyLineTablesOld checks the 3.9 and 3.10 decoders on tables encoded by
// hand after CPython's Objects/lnotab_notes.txt: the cases real files
// rarely have (negative and split deltas, ranges without a line).
func TestPyLineTablesOld(t *testing.T) {
	// 3.9 lnotab: bytes 0-5 line 10, 6-49 line 12, 50-349 line 11
	// (a negative delta), 350- line 300 (a delta split over two pairs).
	lnotab := []byte{6, 2, 44, 0xff, 255, 0, 45, 0, 0, 127, 0, 127, 0, 35}
	for _, c := range []struct{ off, line int }{{0, 10}, {5, 10}, {6, 12}, {49, 12}, {50, 11}, {349, 11}, {350, 300}, {1000, 300}} {
		if got := lnotabLine(lnotab, 10, c.off); got != c.line {
			t.Errorf("lnotab offset %d: line %d, want %d", c.off, got, c.line)
		}
	}
	// 3.10 linetable: 0-7 line 21, 8-11 no line, 12-15 line 20, 16-
	// 271 line 20 (a long range split into two entries), then past the
	// end none.
	tab := []byte{8, 1, 4, 0x80, 4, 0xff, 254, 0, 2, 0}
	for _, c := range []struct{ off, line int }{{0, 21}, {7, 21}, {8, -1}, {11, -1}, {12, 20}, {16, 20}, {271, 20}, {272, -1}} {
		if got := linetable310Line(tab, 20, c.off); got != c.line {
			t.Errorf("3.10 linetable offset %d: line %d, want %d", c.off, got, c.line)
		}
	}
}

// pyProbe is a running testdata/pyprobe.py and what it reported.
type pyProbe struct {
	cmd    *exec.Cmd
	stdin  interface{ Close() error }
	report struct {
		Version   [2]int
		Runtime   uint64
		Interp    uint64
		Tstate    uint64
		ThreadID  uint64 `json:"thread_id"`
		CodeType  uint64 `json:"code_type"`
		File      string
		WaitCode  uint64 `json:"wait_code"`
		OuterCode uint64 `json:"outer_code"`
		MainCode  uint64 `json:"main_code"`
		WaitLine  int    `json:"wait_line"`
		OuterLine int    `json:"outer_line"`
		MainLine  int    `json:"main_line"`
	}
}

func startProbe(t *testing.T, py string) *pyProbe {
	t.Helper()
	cmd := exec.Command(py, probeScript(t))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &pyProbe{cmd: cmd, stdin: stdin}
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadBytes('\n')
	if err != nil {
		t.Fatalf("%s pyprobe: %v", py, err)
	}
	if err := json.Unmarshal(line, &p.report); err != nil {
		t.Fatal(err)
	}
	return p
}

func rd64(t testing.TB, m memReader, addr uint64) uint64 {
	t.Helper()
	var b [8]byte
	if err := m.read(addr, b[:]); err != nil {
		t.Fatalf("read %#x: %v", addr, err)
	}
	return binary.LittleEndian.Uint64(b[:])
}

// walkLikeBPF does what bpf/python.h does with the offsets user space
// hands it, from the thread state on.
func walkLikeBPF(t testing.TB, m memReader, o cudaPyOffsets, ts uint64) rawPyStack {
	t.Helper()
	var rec rawPyStack
	frame := rd64(t, m, ts+uint64(o.TstateFrame))
	if o.CframeFrame >= 0 {
		frame = rd64(t, m, frame+uint64(o.CframeFrame))
	}
	buf := make([]byte, o.FrameRead)
	for i := 0; i < len(rec.Code)+8 && frame != 0; i++ {
		if int(rec.Depth) == len(rec.Code) {
			rec.Flags |= uint32(cudaPyFlagsPY_F_TRUNCATED)
			break
		}
		if err := m.read(frame, buf); err != nil {
			t.Fatalf("read frame %#x: %v", frame, err)
		}
		if o.FrameOwner < 0 || buf[o.FrameOwner] != 3 {
			code := le64(buf, o.FrameCode)
			var first [4]byte
			if err := m.read(code+uint64(o.CodeFirstlineno), first[:]); err != nil {
				t.Fatalf("read code %#x: %v", code, err)
			}
			at := binary.LittleEndian.Uint32(buf[o.FrameInstr:])
			if o.InstrIsPtr != 0 {
				at = uint32(le64(buf, o.FrameInstr) - code)
			}
			rec.Code[rec.Depth] = code
			rec.Instr[rec.Depth] = uint64(binary.LittleEndian.Uint32(first[:]))<<32 | uint64(at)
			rec.Depth++
		}
		frame = le64(buf, o.FramePrev)
	}
	return rec
}

// TestPyLayoutLive checks the offsets of each interpreter found here
// against what the interpreter reports of itself: _PyRuntime and
// PyCode_Type where found in its ELF, the interpreter and thread state the
// C API returns, and the frames of the blocked main thread, named and
// lined as the script says they are.
func TestPyLayoutLive(t *testing.T) {
	for _, py := range testutil.Pythons(t) {
		t.Run(testName(py), func(t *testing.T) {
			pr := startProbe(t, py)
			r := pr.report
			pid := uint32(pr.cmd.Process.Pid)
			proc, err := procfs.NewProc(int(pid))
			if err != nil {
				t.Fatal(err)
			}
			maps, err := proc.ProcMaps()
			if err != nil {
				t.Fatal(err)
			}
			s := newPyStacks()
			p, err := s.inspect(pid, maps)
			if err != nil || p == nil {
				t.Fatalf("inspect pid %d (python %d.%d): %v", pid, r.Version[0], r.Version[1], err)
			}
			t.Logf("python %d.%d in %s: runtime %#x", r.Version[0], r.Version[1], p.binary, p.runtime)
			if p.layout.minor != r.Version[1] {
				t.Fatalf("version 3.%d, interpreter says %d.%d", p.layout.minor, r.Version[0], r.Version[1])
			}
			if p.runtime != r.Runtime || p.codeType != r.CodeType {
				t.Fatalf("_PyRuntime %#x PyCode_Type %#x, interpreter says %#x %#x", p.runtime, p.codeType, r.Runtime, r.CodeType)
			}
			o := p.layout.offsets(p.runtime)
			if interp := rd64(t, p.mem, p.runtime+uint64(o.InterpHead)); interp != r.Interp {
				t.Fatalf("interpreters.head %#x, PyInterpreterState_Head %#x", interp, r.Interp)
			}
			ts, found := rd64(t, p.mem, r.Interp+uint64(o.TstateHead)), false
			for i := 0; i < 64 && ts != 0; i++ {
				if rd64(t, p.mem, ts+uint64(o.TstateThreadId)) == r.ThreadID {
					found = true
					break
				}
				ts = rd64(t, p.mem, ts+uint64(o.TstateNext))
			}
			if !found || ts != r.Tstate {
				t.Fatalf("thread state of thread %#x: %#x (found %v), PyThreadState_Get %#x", r.ThreadID, ts, found, r.Tstate)
			}
			rec := walkLikeBPF(t, p.mem, o, ts)
			frames, trunc := p.resolve(&rec)
			want := []event.Frame{
				{Function: "Probe.wait", File: r.File, Line: r.WaitLine},
				{Function: "outer", File: r.File, Line: r.OuterLine},
				{Function: "main", File: r.File, Line: r.MainLine},
			}
			if p.layout.codeQualname < 0 {
				want[0].Function = "wait"
			}
			if trunc || len(frames) < 4 {
				t.Fatalf("frames %v truncated %v, want %v then <module>", frames, trunc, want)
			}
			for i, w := range want {
				if frames[i] != w {
					t.Errorf("frame %d: %+v, want %+v", i, frames[i], w)
				}
			}
			if rec.Code[0] != r.WaitCode || rec.Code[1] != r.OuterCode || rec.Code[2] != r.MainCode {
				t.Errorf("code objects %#x %#x %#x, want %#x %#x %#x", rec.Code[0], rec.Code[1], rec.Code[2], r.WaitCode, r.OuterCode, r.MainCode)
			}
			if frames[3].Function != "<module>" {
				t.Errorf("outermost frame %+v, want <module>", frames[3])
			}
			// Resolving again takes the cached code objects, checked
			// against their headers: the same answer.
			again, trunc2 := p.resolve(&rec)
			if fmt.Sprint(again) != fmt.Sprint(frames) || trunc2 {
				t.Errorf("cached resolve %v, first %v", again, frames)
			}
		})
	}
}

// BenchmarkPyResolve is the user-space cost of one captured Python stack
// of 4 frames once its code objects are cached: one process_vm_readv of
// their headers, the checks and the line lookups.
func BenchmarkPyResolve(b *testing.B) {
	py, err := exec.LookPath("python3")
	if err != nil {
		b.Skip("no python3")
	}
	cmd := exec.Command(py, probeScript(b))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = stdin.Close(); _ = cmd.Wait() }()
	if _, err := bufio.NewReader(stdout).ReadBytes('\n'); err != nil {
		b.Fatal(err)
	}
	pid := uint32(cmd.Process.Pid)
	proc, _ := procfs.NewProc(int(pid))
	maps, _ := proc.ProcMaps()
	p, err := newPyStacks().inspect(pid, maps)
	if err != nil || p == nil {
		b.Fatalf("inspect: %v", err)
	}
	o := p.layout.offsets(p.runtime)
	var interp, ts [8]byte
	if err := p.mem.read(p.runtime+uint64(o.InterpHead), interp[:]); err != nil {
		b.Fatal(err)
	}
	// The main thread is the last one created and the only one here.
	if err := p.mem.read(binary.LittleEndian.Uint64(interp[:])+uint64(o.TstateHead), ts[:]); err != nil {
		b.Fatal(err)
	}
	rec := walkLikeBPF(b, p.mem, o, binary.LittleEndian.Uint64(ts[:]))
	if frames, _ := p.resolve(&rec); len(frames) < 4 {
		b.Fatalf("frames %v", frames)
	}
	b.ResetTimer()
	for b.Loop() {
		p.resolve(&rec)
	}
}

// testName names a subtest after an interpreter: "python3.12",
// "usr-bin-python3.11".
func testName(py string) string {
	if strings.HasPrefix(py, "/usr/bin/") {
		return "usr-bin-" + filepath.Base(py)
	}
	return filepath.Base(py)
}

// TestPyPendingKeepsBurstRecord: a page-fault burst's Python frames are
// written when the burst begins and its event comes when it ends, after
// the CPU samples taken meanwhile took their own records; the burst's
// record must still be there for it, and a thread whose events never come
// holds at most pyPendingSlots records.
func TestPyPendingKeepsBurstRecord(t *testing.T) {
	var ps pyPendingSet
	ps.put(pyPending{ktime: 100}) // the burst begins
	for k := uint64(110); k < 200; k += 10 {
		ps.put(pyPending{ktime: k}) // a sample's record, then the sample
		if _, ok := ps.take(k); !ok {
			t.Fatalf("sample at %d lost its record", k)
		}
	}
	if _, ok := ps.take(100); !ok {
		t.Fatal("the burst's record was lost to the samples' records")
	}
	if _, ok := ps.take(100); ok || ps.n != 0 {
		t.Fatalf("a record was taken twice (%d left)", ps.n)
	}
	for k := uint64(1); k <= 2*pyPendingSlots; k++ {
		ps.put(pyPending{ktime: k})
	}
	if ps.n != pyPendingSlots {
		t.Fatalf("%d records held, want at most %d", ps.n, pyPendingSlots)
	}
	if _, ok := ps.take(1); ok {
		t.Error("the oldest record outlived newer ones past the bound")
	}
	if _, ok := ps.take(2 * pyPendingSlots); !ok {
		t.Error("the newest record was dropped")
	}
}
