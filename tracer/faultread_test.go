package tracer

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf/btf"

	"github.com/gaptrace/gaptrace/event"
)

// TestDecodeFaultRead: a burst of faults on a mapped file decodes to a
// KindFaultRead over its span, with its faults, its address (named by the enricher) and
// stack, and the Python frames' time (its start); a record with no fault,
// no start or starting after its end is rejected.
func TestDecodeFaultRead(t *testing.T) {
	rec := rawFault{Hdr: hdr(evFaultRead, uint32(event.KindFaultRead), 100, 101, tEnd), StartNs: tStart, Addr: 0x7f0000001000, Count: 12, StackId: 9}
	var d decoded
	if err := decodeRecord(asBytes(&rec), &d); err != nil {
		t.Fatal(err)
	}
	end := MonotonicToUnix(int64(tEnd))
	want := event.Event{Kind: event.KindFaultRead, PID: 100, TID: 101, Start: end - int64(tEnd-tStart), End: end, Count: 12, FD: -1, PeerRank: -1}
	if !reflect.DeepEqual(d.ev, want) {
		t.Errorf("event\n got %+v\nwant %+v", d.ev, want)
	}
	if !d.emit || d.faultAddr != 0x7f0000001000 || !d.faultFile || d.stackID != 9 || d.ktime != tStart {
		t.Errorf("emit %v address %#x stack %d ktime %d, want true 0x7f0000001000 9 %d", d.emit, d.faultAddr, d.stackID, d.ktime, tStart)
	}
	for name, mod := range map[string]func(r *rawFault){
		"no fault":        func(r *rawFault) { r.Count = 0 },
		"start after end": func(r *rawFault) { r.StartNs = tEnd + 1 },
		"no start":        func(r *rawFault) { r.StartNs = 0 },
		"bad kind":        func(r *rawFault) { r.Hdr.Kind = uint32(event.KindCPUSample) },
	} {
		bad := rec
		mod(&bad)
		if err := decodeRecord(asBytes(&bad), &d); err == nil {
			t.Errorf("%s: decoded without error: %+v", name, d.ev)
		}
	}
}

// TestFaultReadLayout: the Go record has the C struct's size and offsets.
func TestFaultReadLayout(t *testing.T) {
	spec, err := loadProfile()
	if err != nil {
		t.Fatal(err)
	}
	var st *btf.Struct
	if err := spec.Types.TypeByName("fault_read_event", &st); err != nil {
		t.Fatal(err)
	}
	gt := reflect.TypeOf(rawFault{})
	if uintptr(st.Size) != gt.Size() || recordSizes[evFaultRead] != unsafe.Sizeof(rawFault{}) {
		t.Fatalf("C size %d, Go %d, record size %d", st.Size, gt.Size(), recordSizes[evFaultRead])
	}
	var offs []uintptr
	for i := range gt.NumField() {
		if f := gt.Field(i); f.Name != "_" {
			offs = append(offs, f.Offset)
		}
	}
	if len(offs) != len(st.Members) {
		t.Fatalf("%d C members, %d Go fields", len(st.Members), len(offs))
	}
	for i, m := range st.Members {
		if uintptr(m.Offset.Bytes()) != offs[i] {
			t.Errorf("%s: C offset %d, Go %d", m.Name, m.Offset.Bytes(), offs[i])
		}
	}
}

// TestFileMapsReread: an address in none of the cached mappings reads the
// maps again, for a fault burst at once when the copy is older than the
// burst (the file was mapped after it was read), otherwise at most every
// 100 ms (the address may be anonymous memory); a copy read after the
// burst is not read again for it (the mapping is gone).
func TestFileMapsReread(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "42")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(lines string) {
		if err := os.WriteFile(filepath.Join(dir, "maps"), []byte(lines), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	idx := "7f0000000000-7f0000600000 r--s 00000000 fd:01 1234 /data/index.bin\n"
	write(idx)
	f := newFileMaps()
	f.root = root
	if got := f.file(42, 0x7f0000001000, 0); got != "/data/index.bin" {
		t.Fatalf("first lookup: %q", got)
	}
	write(idx + "7f1000000000-7f1000100000 r--p 00000000 fd:01 99 /data/shard.bin\n")
	if got := f.file(42, 0x7f1000000000, 0); got != "" {
		t.Errorf("unknown address, copy fresh, no fault time: %q, want \"\" (not read again)", got)
	}
	if got := f.file(42, 0x7f1000000000, time.Now().Add(-time.Hour).UnixNano()); got != "" {
		t.Errorf("burst before the copy was read: %q, want \"\"", got)
	}
	if got := f.file(42, 0x7f1000000000, time.Now().UnixNano()); got != "/data/shard.bin" {
		t.Errorf("burst after the copy was read: %q, want /data/shard.bin", got)
	}
}

// TestDecodeOffCPUFileFault: a block inside a fault the kernel saw read a
// regular file carries the address and says so; one in another fault
// carries the address only.
func TestDecodeOffCPUFileFault(t *testing.T) {
	for _, c := range []struct {
		flags uint32
		file  bool
	}{{schedFlagFile, true}, {0, false}} {
		rec := rawSched{Hdr: hdr(evSched, uint32(event.KindOffCPU), 100, 101, tEnd), StartNs: tStart, FaultAddr: 0x7f0000002000, Flags: c.flags}
		var d decoded
		if err := decodeRecord(asBytes(&rec), &d); err != nil {
			t.Fatal(err)
		}
		if d.faultAddr != 0x7f0000002000 || d.faultFile != c.file {
			t.Errorf("flags %d: address %#x file %v, want 0x7f0000002000 %v", c.flags, d.faultAddr, d.faultFile, c.file)
		}
	}
}

// TestFaultSpecLoads: the sched object's programs load both ways: with the
// filemap tracepoints this kernel has, and as on a kernel without them
// (the filemap programs loaded against page_fault_user, bpf_find_vma on).
func TestFaultSpecLoads(t *testing.T) {
	if !haveFilemapTracepoints() {
		t.Log("this kernel has no filemap fault tracepoints: only the fallback is loaded")
	}
	for _, filemap := range []bool{true, false} {
		if filemap && !haveFilemapTracepoints() {
			continue
		}
		spec, err := loadSched()
		if err != nil {
			t.Fatal(err)
		}
		if err := prepareFaultSpec(spec, filemap); err != nil {
			t.Fatal(err)
		}
		var objs schedObjects
		if err := spec.LoadAndAssign(&objs, nil); err != nil {
			t.Fatalf("filemap tracepoints %v: %v", filemap, err)
		}
		_ = objs.Close() // loaded only to be verified
	}
}
