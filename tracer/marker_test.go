package tracer

import (
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/gaptrace/gaptrace/event"
)

func markerRecord(kind uint32, class uint32, name string, n uint32) []byte {
	var r rawMarker
	r.Hdr.Type = evMarker
	r.Hdr.Kind = kind
	r.Hdr.PidTgid = 7<<32 | 8
	r.Hdr.KtimeNs = 1000
	r.Marker = class
	r.Len = n
	for i := 0; i < len(name) && i < len(r.Name); i++ {
		r.Name[i] = int8(name[i])
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&r)), unsafe.Sizeof(r))
}

func TestDecodeMarker(t *testing.T) {
	var d decoded
	name := "Optimizer.step#SGD.step"
	if err := decodeRecord(markerRecord(uint32(event.KindMarker), markerOptimizerStep, name, uint32(len(name))), &d); err != nil {
		t.Fatal(err)
	}
	if !d.emit || d.ev.Kind != event.KindMarker || d.ev.Name != name || d.ev.PID != 7 || d.ev.TID != 8 {
		t.Fatalf("decoded %+v", d.ev)
	}
	if k := recordKind(markerRecord(uint32(event.KindMarker), markerOptimizerStep, name, uint32(len(name)))); k != RecMarker {
		t.Errorf("record kind %v, want marker", k)
	}
	for _, c := range []struct {
		what      string
		kind, cls uint32
		name      string
		n         uint32
	}{
		{"length past the buffer", uint32(event.KindMarker), markerOptimizerStep, name, 65},
		{"name not of its class", uint32(event.KindMarker), markerProfilerStep, name, uint32(len(name))},
		{"unknown class", uint32(event.KindMarker), 9, name, uint32(len(name))},
		{"other kind", uint32(event.KindSync), markerOptimizerStep, name, uint32(len(name))},
		{"cut before the prefix ends", uint32(event.KindMarker), markerOptimizerStep, name, 10},
	} {
		if err := decodeRecord(markerRecord(c.kind, c.cls, c.name, c.n), &d); err == nil {
			t.Errorf("%s: decoded %+v", c.what, d.ev)
		}
	}
}

// The simulated libtorch defines the marker function; the simulated
// libcuda does not.
func TestDefinesMarker(t *testing.T) {
	dir := simgpu(t)
	if definesMarker.addr(filepath.Join(dir, "libsimtorch.so")) == 0 {
		t.Error("libsimtorch.so: marker function not found")
	}
	if definesMarker.addr(filepath.Join(dir, "libcuda.so.1")) != 0 {
		t.Error("libcuda.so.1 said to define the marker function")
	}
	if definesMarker.addr(dir) != 0 {
		t.Error("a directory said to define the marker function")
	}
	planned, missing, err := planProbes(filepath.Join(dir, "libsimtorch.so"), libMarker, ProbesLite)
	if err != nil || len(planned) != 1 || len(missing) != 0 || planned[0].symbol != markerSymbol {
		t.Fatalf("plan on libsimtorch.so: %+v missing %v err %v", planned, missing, err)
	}
}
