package gpusample

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gaptrace/gaptrace/event"
)

func writeHW(t *testing.T, content string) {
	t.Helper()
	path := filepath.Join(simDir, "gaptrace-simgpu-0.hw")
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(path) })
}

func findCheck(fs []Finding, check string) (Finding, bool) {
	for _, f := range fs {
		if f.Check == check {
			return f, true
		}
	}
	return Finding{}, false
}

func TestSimHealthFindings(t *testing.T) {
	startWriter(t)
	s := openSim(t, Config{})
	fs := s.Health()
	for _, c := range []string{CheckPCIe, CheckThrottle, CheckTemperature, CheckECC, CheckPersistence, CheckProcesses, CheckXid, CheckGPM} {
		f, ok := findCheck(fs, c)
		if !ok || f.Level != OK {
			t.Errorf("healthy simulated GPU: %s = %+v (found %v)", c, f, ok)
		}
	}

	// A degraded card: x8 link, power capped and HW thermal slowdown, ECC
	// errors, persistence off, hot.
	writeHW(t, "pcie_width=8\nthrottle=0x44\necc_uncorrected=2\necc_corrected=5\npersistence=0\ntemp_c=85\n")
	s2 := openSim(t, Config{})
	fs = s2.Health()
	want := map[string]Level{CheckPCIe: WARN, CheckThrottle: FAIL, CheckECC: FAIL, CheckPersistence: WARN, CheckTemperature: WARN}
	for c, lvl := range want {
		f, ok := findCheck(fs, c)
		if !ok || f.Level != lvl || f.Fix == "" {
			t.Errorf("%s: got %+v, want level %v with a fix", c, f, lvl)
		}
	}
	if f, _ := findCheck(fs, CheckPCIe); !strings.Contains(f.Detail, "Gen5 x8") || !strings.Contains(f.Detail, "Gen5 x16") {
		t.Errorf("pcie detail: %q", f.Detail)
	}
	if f, _ := findCheck(fs, CheckThrottle); !strings.Contains(f.Detail, "sw_power_cap") || !strings.Contains(f.Detail, "hw_thermal_slowdown") {
		t.Errorf("throttle detail: %q", f.Detail)
	}

	// A low PCIe generation while idle is power saving, not a fault.
	writeHW(t, "pcie_gen=1\n")
	if f, _ := findCheck(s2.Health(), CheckPCIe); f.Level != OK || !strings.Contains(f.Detail, "idle") {
		t.Errorf("idle Gen1 link: %+v", f)
	}
}

func TestSimChangesDuringRun(t *testing.T) {
	w := startWriter(t)
	self := os.Getpid()
	w.pid(self)
	s := openSim(t, Config{HWInterval: 40 * time.Millisecond})
	if got := s.DevicesForPID(self); !slices.Equal(got, []int{0}) {
		t.Fatalf("DevicesForPID(self) = %v, want [0]", got)
	}
	if got := s.DevicesForPID(1); len(got) != 0 {
		t.Fatalf("DevicesForPID(1) = %v, want none", got)
	}
	s.SetTraced([]int{self})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := make(chan event.GPUWindow, 1024)
	done := make(chan error, 1)
	runStart := time.Now().UnixNano()
	go func() { done <- s.Run(ctx, ch) }()
	go func() {
		for range ch {
		}
	}()

	waitChange := func(check string, lvl Level, contains string) Finding {
		t.Helper()
		deadline := time.After(5 * time.Second)
		for {
			select {
			case f := <-s.Changes():
				if f.Check == check && f.Level == lvl && strings.Contains(f.Detail, contains) {
					return f
				}
			case <-deadline:
				t.Fatalf("no %s change to %v containing %q", check, lvl, contains)
			}
		}
	}
	// Let the baseline be read before changing anything.
	deadline := time.Now().Add(5 * time.Second)
	for len(s.devs[0].snapshotsCopy()) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("no hardware snapshot")
		}
		time.Sleep(5 * time.Millisecond)
	}

	writeHW(t, "pcie_width=8\n")
	waitChange(CheckPCIe, WARN, "x8")
	writeHW(t, "pcie_width=8\nthrottle=0x4\n")
	waitChange(CheckThrottle, WARN, "sw_power_cap")

	if err := os.WriteFile(filepath.Join(simDir, "gaptrace-simgpu-0.xid"), []byte("79\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitChange(CheckXid, FAIL, "Xid 79")

	// Another process takes a context on the GPU: the writer itself.
	w.pid(w.cmd.Process.Pid)
	waitChange(CheckProcesses, WARN, fmt.Sprint(w.cmd.Process.Pid))

	hc := s.HWContext(0, runStart, time.Now().UnixNano()+1)
	if !slices.Contains(hc.XidErrors, 79) || !slices.Contains(hc.ThrottleReasons, "sw_power_cap") ||
		hc.PCIeWidth != 8 || !slices.Contains(hc.OtherProcesses, uint32(w.cmd.Process.Pid)) ||
		slices.Contains(hc.OtherProcesses, uint32(self)) || hc.SMClockMHz >= hc.MaxSMClockMHz {
		t.Errorf("hw context: %+v", hc)
	}
	if st := s.Stats(); st.Xids != 1 {
		t.Errorf("xids counted: %d", st.Xids)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func (d *device) snapshotsCopy() []hwSnapshot {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.snaps)
}
