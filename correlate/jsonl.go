package correlate

import (
	"encoding/json"
	"fmt"
	"io"
)

// GapsJSONL writes each gap as one JSON object per line (the --gaps-out
// contract: exactly the Gap JSON). Steps are not written. The first write
// error is kept and later gaps are dropped; check Err at exit.
type GapsJSONL struct {
	enc     *json.Encoder
	err     error
	written int64
}

// WriteGapsJSONL returns a Sink that writes gaps to w. Wrap w in a
// bufio.Writer for high gap rates and flush it at exit.
func WriteGapsJSONL(w io.Writer) *GapsJSONL {
	return &GapsJSONL{enc: json.NewEncoder(w)}
}

// Gap implements Sink.
func (j *GapsJSONL) Gap(g Gap) {
	if j.err != nil {
		return
	}
	if err := j.enc.Encode(g); err != nil {
		j.err = fmt.Errorf("write gap: %w", err)
		return
	}
	j.written++
}

// Step implements Sink; steps are not part of --gaps-out.
func (j *GapsJSONL) Step(StepResult) {}

// Err returns the first write error.
func (j *GapsJSONL) Err() error { return j.err }

// Written is the number of gaps written.
func (j *GapsJSONL) Written() int64 { return j.written }

// Tee fans results out to several sinks, in order.
type Tee []Sink

// Gap implements Sink.
func (t Tee) Gap(g Gap) {
	for _, s := range t {
		s.Gap(g)
	}
}

// Step implements Sink.
func (t Tee) Step(st StepResult) {
	for _, s := range t {
		s.Step(st)
	}
}
