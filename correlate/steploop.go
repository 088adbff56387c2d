package correlate

import (
	"github.com/gaptrace/gaptrace/correlate/stepclock"
	"github.com/gaptrace/gaptrace/event"
)

// The loop's thread in the work pattern: once the main thread feeds the
// GPU itself, other threads' syncs and device-to-host copies make no
// steps.

// noteFeed takes one enqueue of thread tid. Once the process's main
// thread issues launches or host-to-device copies itself it is the
// loop's thread: other threads' syncs (a model-averaging or saver
// thread that copies and syncs its own stream) then neither end steps
// nor break the sync period. A loop run from another thread leaves the
// main thread without launches, and every thread's syncs count as before.
func (s *stepper) noteFeed(tid uint32, ev *event.Event) {
	if s.loopMain || tid != s.pid {
		return
	}
	switch ev.Kind {
	case event.KindEnqueue:
		s.loopMain = ev.Count > 0
	case event.KindMemcpyAsync:
		s.loopMain = ev.CopyDir == event.CUMemcpyHtoD
	}
}

// loopSync says whether a sync of thread tid is the loop's.
func (s *stepper) loopSync(tid uint32) bool {
	return !s.loopMain || tid == s.pid
}

// stepToken feeds ev to the work clock where it can clock steps. Once the
// main thread is the loop's (noteFeed), another thread's reads of device
// data (a saver's or model-averaging copies out) do not enter the clock's
// ring, where they would crowd out the loop's copies and add a rival key;
// the call-site stream still sees them. Other threads' copies in (a
// loader's batches), launches and collectives still clock the loop.
func (p *proc) stepToken(x env, ev *event.Event, occ, t int64) {
	key, ok := stepclock.TokenOf(ev)
	if !ok {
		return
	}
	if key.Dir == event.CUMemcpyDtoH && !p.st.loopSync(ev.TID) {
		p.st.siteToken(x.set, key, t)
		return
	}
	if p.st.onToken(x.set, key, occ, t) {
		p.resolveHeld(x, false)
	}
}
