package interval

import "testing"

func TestSpans(t *testing.T) {
	var l []Span
	for _, s := range []Span{{10, 20}, {30, 40}, {15, 32}, {50, 60}, {45, 46}, {60, 61}} {
		l = Add(l, s)
	}
	want := []Span{{10, 40}, {45, 46}, {50, 61}}
	if len(l) != len(want) {
		t.Fatalf("Add: %v", l)
	}
	for i := range want {
		if l[i] != want[i] {
			t.Fatalf("Add: %v", l)
		}
	}
	m := Merge([]Span{{0, 5}, {20, 25}}, []Span{{3, 8}, {9, 10}, {24, 30}})
	if len(m) != 3 || m[0] != (Span{A: 0, B: 8}) || m[1] != (Span{A: 9, B: 10}) || m[2] != (Span{A: 20, B: 30}) {
		t.Errorf("Merge: %v", m)
	}
	if n := Overlap(l, 35, 55); n != 5+1+5 {
		t.Errorf("Overlap = %d", n)
	}
	if c := Clip(l, 41, 50); len(c) != 1 || c[0] != (Span{A: 45, B: 46}) {
		t.Errorf("Clip = %v", c)
	}
}
