package correlate

import "github.com/gaptrace/gaptrace/correlate/stepclock"

// Marked launches begin late: the tracer marks a function only once it
// has seen the loop launch it for a while (tracer/marks.go), so a clock
// on a marked launch finds the ring's first iterations without any. A
// loop that syncs every tenth iteration and copies its batch in bursts
// has no other clock, yet every step of the marked one holds its batch
// copy exactly once: before the first marked launch, that copy cuts
// the iterations, one cut each, where the marked launch would have.

// retroBounds is the ring indexes of the tokens the steps laid over the
// ring end at (retroClock): the clock's boundary occurrences from the
// loop's first iteration on (loopStart), after those of a key that
// stands in for a marked clock before its first occurrence (beforeMarks).
func (s *stepper) retroBounds() []int {
	c := s.clock
	lastBefore := s.loopStart()
	var idx int64
	var at []int
	for i := range s.toks {
		if s.toks[i].Key != c.key {
			continue
		}
		idx++
		if int((idx-1)%int64(c.m)) == c.phase && i >= lastBefore {
			at = append(at, i)
		}
	}
	if c.key.Marked() && len(at) > 0 {
		at = append(s.beforeMarks(at), at...)
	}
	return at
}

// premarkSteps: the marked clock's steps that must each hold the stand-in
// key exactly once.
const premarkSteps = 4

// beforeMarks is the ring indexes, before the marked clock's first
// boundary at[0], of a key other than a marked launch that every step of
// the marked clock in the ring holds exactly once (premarkSteps of them
// at least): its occurrences from the loop's first iteration on (the last
// before the first work, as loopStart), less the last before at[0], which
// is the iteration that at[0] ends in. None where no key qualifies, or
// two do.
func (s *stepper) beforeMarks(at []int) []int {
	if len(at) <= premarkSteps {
		return nil
	}
	var key stepclock.Key
	found := 0
	seen := map[stepclock.Key]bool{}
	for i := 0; i < at[0]; i++ {
		k := s.toks[i].Key
		if k.Marked() || seen[k] {
			continue
		}
		seen[k] = true
		if s.oncePerStep(k, at) {
			key = k
			found++
		}
	}
	if found != 1 {
		return nil
	}
	work := at[0]
	for i := 0; i < at[0]; i++ {
		if !s.toks[i].Idle() {
			work = i
			break
		}
	}
	var out []int
	for i := 0; i < at[0]; i++ {
		if s.toks[i].Key != key {
			continue
		}
		if i < work && len(out) > 0 {
			out = out[:0] // prologue: only the last before the work counts
		}
		out = append(out, i)
	}
	if len(out) == 0 {
		return nil
	}
	return out[:len(out)-1]
}

// oncePerStep says whether key occurs exactly once between consecutive
// boundaries at (ring indexes).
func (s *stepper) oncePerStep(key stepclock.Key, at []int) bool {
	for j := 1; j < len(at); j++ {
		n := 0
		for i := at[j-1] + 1; i <= at[j]; i++ {
			if s.toks[i].Key == key {
				n++
			}
		}
		if n != 1 {
			return false
		}
	}
	return true
}
