package stepclock

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

func TestPickSiteCheckpointCopiesSeenIdle(t *testing.T) {
	// Attached during a checkpoint of a loop that copies nothing to the
	// device (its only token, the loss read back): the stream holds the
	// checkpoint's 48 tensors, each copied to the host and waited for at
	// line 71. Blind to launches (lite), each of the checkpoint's calls
	// may end an iteration of the thread's one loop; where the launches
	// were seen and the process launched nothing between its calls, they
	// hold no iteration, and nothing is picked (the loop's own calls,
	// once they fill the stream, are).
	d2h := Key{Kind: event.KindMemcpyAsync, Dir: event.CUMemcpyDtoH, Bytes: 1 << 20}
	for _, seen := range []bool{false, true} {
		var s stream
		var pos uint64
		add := func(it Item) {
			it.Seen, it.Pos = seen, pos
			s.items = append(s.items, it)
		}
		for k := 0; k < 48; k++ {
			add(Item{Key: d2h})
			add(Item{Site: SiteOf(pyStack(71, 130)), TID: pid})
		}
		p, ok := PickSite(s.items, pid)
		want := !seen
		if ok != want || ok && p.Site.Key != SiteOf(pyStack(71, 130)).Key {
			t.Errorf("launches seen %v: picked %+v %v, want a pick %v", seen, p.Site.Name, ok, want)
		}
	}
}
