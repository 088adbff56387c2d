package tracer

import (
	"reflect"
	"testing"
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
	if !d.emit || d.faultAddr != 0x7f0000001000 || d.stackID != 9 || d.ktime != tStart {
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
