package correlate

// gapState is a process's open host-bounded gap: at most one at a time,
// opened when a drain empties the queue (a sync, a synchronous copy, or
// where a trailing burst's work most likely ended: quiet.go) and ended by
// the next work, by a sync that shows the tracer missed work, or by the
// process's exit. Only these methods change it; the handlers that decide
// when read it through cur.
type gapState struct {
	g *openGap
}

// cur is the open gap, nil when none is open.
func (s *gapState) cur() *openGap { return s.g }

// begin opens g; the caller has checked that none is open.
func (s *gapState) begin(g *openGap) { s.g = g }

// end closes the open gap and returns it (nil when none was open).
func (s *gapState) end() *openGap {
	g := s.g
	s.g = nil
	return g
}
