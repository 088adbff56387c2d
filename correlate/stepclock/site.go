package stepclock

import (
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gaptrace/gaptrace/event"
)

// Call sites: the code that runs the loop says where an iteration ends
// more surely than the timing of what it enqueues. A training loop reads
// its loss (or syncs otherwise) from one line of its own code once per
// iteration; a checkpoint's per-tensor copies, an evaluation's batches, a
// metric read every N iterations and a background thread's copies come
// from other lines or other threads. PickSite finds that line in the
// stream of a process's sited calls (the syncs and blocking copies whose
// stacks the tracer captured) and enqueued tokens; Spec is a site the
// user declared.

// Step sources, strongest first.
const (
	SourceDeclared  = "declared"  // --step-at
	SourceFramework = "framework" // a framework's own per-step marker
	SourceCallSite  = "call_site" // the sync site that recurs once an iteration
	SourceWork      = "work_pattern"
)

// Site tuning.
const (
	// SiteDepth: user frames that make a site's key, innermost first (one
	// helper called from the loop and from the evaluation is two sites).
	// A framework-shaped loop reads its loss through a chain of its own
	// frames (log, update, sync, item) that its validation shares, and
	// only the caller of the chain, four or five frames out, tells them
	// apart; a loop's frames do not change from one iteration to the
	// next, so the deeper key splits nothing else.
	SiteDepth = 8
	// SiteMinRuns: intervals between a site's calls before it may clock.
	SiteMinRuns = 6
	// SiteMinGroups: the intervals that suffice for a site called once
	// after each group of another site's micro-batch reads (encloses):
	// microBatches already saw the grouping in three groups at least, so
	// the optimizer step's site clocks as soon as the micro-batches are
	// known, before the work pattern counts them as steps.
	SiteMinGroups = 3
	// SiteGood: the least share of those intervals that must hold one
	// iteration's work (work, and no token twice).
	SiteGood = 0.75
	// SiteRing: stream items a stepper keeps for PickSite.
	SiteRing = 512
	// SiteRepeat: the most times one token may come between two calls of
	// a site that clocks iterations (an iteration may copy its input and
	// its target of one size; a site read every tenth iteration sees the
	// batch copy ten times, an accumulation's four micro-batches four).
	SiteRepeat = 2
)

// Site is where a call was made: Key tells sites apart, Name is the
// innermost frame of the job's own code as a person finds it.
type Site struct {
	Key  string
	Name string
	// Frames: the key's frames as a person names them, innermost first.
	Frames []string
}

// SiteOf is the site of a stack: its innermost frames of the job's own
// code (event.SystemCode tells the job's from the libraries'); the zero
// Site when the stack holds none, or its innermost has no line (native
// code built without -g names only the function, and two syncs in one
// function would be one site: the work pattern serves such code).
func SiteOf(stack []event.Frame) Site {
	var s Site
	var key strings.Builder
	for _, f := range stack {
		if event.SystemCode(f.File) {
			continue
		}
		n := len(s.Frames)
		if n == 0 && f.Line <= 0 {
			return Site{}
		}
		name := frameName(f)
		if n > 0 {
			key.WriteByte('<')
		}
		s.Frames = append(s.Frames, name)
		if f.Line > 0 {
			key.WriteString(name) // "base:line function", as the key spells it
		} else {
			key.WriteString(filepath.Base(f.Where()) + ":" + strconv.Itoa(f.Line) + " " + f.Function)
		}
		if n+1 == SiteDepth {
			break
		}
	}
	if len(s.Frames) > 0 {
		s.Name, s.Key = s.Frames[0], key.String()
	}
	return s
}

func frameName(f event.Frame) string {
	base := filepath.Base(f.Where())
	if f.Line > 0 {
		return base + ":" + strconv.Itoa(f.Line) + " " + f.Function
	}
	return base + " " + f.Function
}

// Item is one entry of the stream PickSite reads: a sited call (Site set:
// a sync or blocking copy with the thread's launches since its previous
// flushed event) or a token (Site zero: a copy, collective or marked
// launch enqueued by any thread).
type Item struct {
	Site     Site
	TID      uint32
	Key      Key
	Launches uint64
	T        int64 // when the call returned, or the token was enqueued
	// Seen: every kernel launch since the item before it was seen
	// (per-launch probes live); Pos: the process's launches so far,
	// flushed and reported pending, at the item.
	Seen bool
	Pos  uint64
}

// Pick is the call site PickSite chose.
type Pick struct {
	Site Site
	TID  uint32
	// Runs: the intervals between its calls that held one iteration.
	Runs int
	// Rival: another site on the thread that recurs as well, apart from
	// it (PickSite then reports no pick).
	Rival Site
	// Over: the keys of the sites on its thread that recur as well,
	// apart from it, whose iterations launch clearly less (an
	// evaluation's batches): a running step site among them gives way.
	Over []string
	// Groups: the intervals between its calls that hold one group of
	// another site's micro-batch reads (an optimizer step's site), 0
	// where it encloses none.
	Groups int
	// Pin names the site's innermost frame that no other site in the
	// stream holds ("train.py:42 main"; a helper that reads the loss for
	// the training and the evaluation is pinned at its caller): what
	// --step-at takes, as FILE:LINE.
	Pin string
}

type siteCand struct {
	site      Site
	tid       uint32
	at        []int // item indexes
	good, all int
	// launches: the thread's launches in each interval, in order.
	launches []uint64
	// work: the launches of the good intervals where some were seen.
	work []uint64
	// micro: the micro-batches an optimizer step groups, where the
	// launches show the site reads each micro-batch's loss (microBatches).
	micro int
	// tokened: the good intervals that held a token (not a read).
	tokened int
	// bare: the intervals that showed nothing at all (no launch, no
	// token): lite, or a CUDA graph's replays, which lite does not see.
	bare int
	// groups: the intervals that hold exactly one group of another
	// site's micro-batch reads (encloses).
	groups int
	// sized: each interval's most repeated token count and launches
	// (variedGood); varied: its good intervals are those.
	sized  []sized
	varied bool
	// short: the intervals vary as a loop of varying micro-batches
	// would, too few yet to tell (variedShort).
	short bool
}

// PickSite finds the call site that recurs once per iteration in items
// (oldest first): among the sites on one thread, the one with the most
// intervals between consecutive calls that hold work (the thread launched,
// or a token came) and no token more than SiteRepeat times (a site that
// syncs every tenth iteration sees the batch copy ten times; one that
// copies each tensor of a checkpoint sees no work at all), at least
// SiteMinRuns of them and a SiteGood share. A site on the process's main
// thread (tid == pid) wins over other threads' (a background saver). Ties
// go to the site called last (a loop's last sync ends its iteration).
// Where another site of the thread qualifies too, with half its runs at
// least, and is not called in lockstep with it, the one whose iterations
// launch clearly more wins (an evaluation's batches run a forward only;
// Pick.Over names the others); where neither does, there is no pick
// (Pick.Rival names it). A pick's calls span the stream (the first in its
// first quarter, the last in its last): an evaluation's batches, however
// many, are a phase of it. A site that reads each micro-batch's loss
// never clocks; the site called once after each group of them (the
// optimizer step's sync) does (encloses).
func PickSite(items []Item, pid uint32) (Pick, bool) { return Score(items).Pick(pid) }

// Scored is a stream whose sites were scored once: a check of the running
// site asks several questions of one stream (PickSite, Qualifies,
// MicroSites, Weights), and scoring the 512 items for each was a seventh
// of the sidecar's CPU on eight ranks.
type Scored struct {
	items []Item
	cands []*siteCand
}

// Score scores items' sites; items must not change while the result is
// used.
func Score(items []Item) *Scored { return &Scored{items: items, cands: scoreSites(items)} }

// Pick is PickSite over the scored stream.
func (sc *Scored) Pick(pid uint32) (Pick, bool) {
	cands := sc.cands
	var best *siteCand
	var ok []*siteCand
	for _, c := range cands {
		if !qualified(c, len(sc.items)) {
			continue
		}
		ok = append(ok, c)
		if best == nil || better(c, best, pid) {
			best = c
		}
	}
	if best == nil {
		return Pick{}, false
	}
	rival := func(c *siteCand) bool {
		return c != best && (c.tid == pid) == (best.tid == pid) && 2*c.good >= best.good && !lockstep(best, c)
	}
	for n := 0; n < len(ok); n++ {
		heavy := best
		for _, c := range ok {
			if rival(c) && heavier(c, heavy) == 1 {
				heavy = c
			}
		}
		if heavy == best {
			break
		}
		best = heavy
	}
	var over []string
	for _, c := range ok {
		if !rival(c) {
			continue
		}
		// Two loops on the thread that recur apart (training and an
		// evaluation with more batches than the training's steps
		// between them). A training iteration launches its forward,
		// backward and optimizer; an evaluation's batch, its forward
		// only: where one's iterations launch clearly more than the
		// other's, it is the training's.
		if heavier(best, c) == 1 {
			over = append(over, c.site.Key)
			continue
		}
		// Otherwise the stream alone does not say which is the
		// iteration. The work pattern decides, or --step-at.
		return Pick{Site: best.site, TID: best.tid, Runs: best.good, Rival: c.site}, false
	}
	return Pick{Site: best.site, TID: best.tid, Runs: best.good, Groups: best.groups, Pin: pin(best.site, cands), Over: over}, true
}

// scoreSites groups items' sited calls by thread and site, and counts
// each site's intervals and those that hold one iteration.
func scoreSites(items []Item) []*siteCand {
	var cands []*siteCand
	type siteOn struct {
		tid uint32
		key string
	}
	// A stream holds a few sites: they are found by a scan that compares
	// lengths first (hashing each call's key of up to SiteDepth frames
	// was a sixth of a check), and by a map past siteScan of them.
	const siteScan = 16
	var idx map[siteOn]*siteCand
	for i := range items {
		it := &items[i]
		if it.Site.Key == "" {
			continue
		}
		var c *siteCand
		if idx != nil {
			c = idx[siteOn{it.TID, it.Site.Key}]
		} else {
			for _, o := range cands {
				if o.tid == it.TID && len(o.site.Key) == len(it.Site.Key) && o.site.Key == it.Site.Key {
					c = o
					break
				}
			}
		}
		if c == nil {
			c = &siteCand{site: it.Site, tid: it.TID}
			cands = append(cands, c)
			if idx != nil {
				idx[siteOn{c.tid, c.site.Key}] = c
			} else if len(cands) > siteScan {
				idx = make(map[siteOn]*siteCand, 2*len(cands))
				for _, o := range cands {
					idx[siteOn{o.tid, o.site.Key}] = o
				}
			}
		}
		c.at = append(c.at, i)
	}
	var seen tally
	for _, c := range cands {
		if n := len(c.at) - 1; n > 0 {
			c.launches, c.sized = make([]uint64, 0, n), make([]sized, 0, n)
		}
		for j := 1; j < len(c.at); j++ {
			c.all++
			span := items[c.at[j-1]+1 : c.at[j]+1]
			l := threadLaunches(span, c.tid)
			if oneIteration(span, c.tid, SiteRepeat, &seen) {
				c.good++
				if l > 0 {
					c.work = append(c.work, l)
				}
				if tokened(span) {
					c.tokened++
				}
			} else if bareSpan(span, c.tid) && !idleSpan(items[c.at[j-1]], span) {
				c.bare++
			}
			c.launches = append(c.launches, l)
			c.sized = append(c.sized, sized{repeats(span, &seen), l})
		}
		c.micro = microBatches(c.launches)
		if c.tokened > 0 && c.tokened < c.good {
			// Some intervals hold the iteration's tokens (its batch
			// copies) and others only launches: the site is called
			// within iterations too (a scalar read made some steps and
			// not others), and only the former hold one iteration.
			c.good = c.tokened
		}
		if n, work := variedGood(c.sized); n > c.good && c.micro == 0 {
			// Iterations of a varying number of micro-batches each.
			c.good, c.work, c.varied = n, work, true
		} else if c.micro == 0 {
			c.short = variedShort(c.sized)
		}
	}
	for _, c := range cands {
		if c.bare > 0 && blind(items) && !qualified(c, len(items)) && onlyLoop(c, cands) {
			// The thread's one loop, and nothing in the stream shows
			// what its calls enclose: each call ends an iteration.
			c.good += c.bare
		}
	}
	for _, b := range cands {
		if b.micro == 0 {
			continue
		}
		for _, c := range cands {
			if c != b && c.tid == b.tid && c.micro == 0 && !qualified(c, len(items)) {
				encloses(items, c, b)
			}
		}
	}
	return cands
}

// bareSpan says whether span shows nothing between two calls on tid: no
// launch of the thread, no token but copies to the host (the reads).
func bareSpan(span []Item, tid uint32) bool {
	for i := range span {
		it := &span[i]
		if it.Site.Key != "" {
			if it.TID == tid && it.Launches > 0 {
				return false
			}
			continue
		}
		if it.Key.Dir != event.CUMemcpyDtoH {
			return false
		}
	}
	return true
}

// idleSpan says whether span, the interval after the call from, is known
// to hold no compute: every launch in it was seen, and the process
// launched nothing (a checkpoint's per-tensor copies, each read back).
// Such an interval is no iteration, however blind the stream (blind):
// a loop launches its kernels.
func idleSpan(from Item, span []Item) bool {
	for i := range span {
		if it := &span[i]; !it.Seen || it.Pos != from.Pos || it.Site.Key != "" && it.Launches > 0 {
			return false
		}
	}
	return true
}

// blind says whether the stream holds no token but copies to the host
// and marked launches: the job copies nothing to the device and makes no
// collective, so nothing tells one interval's work from another's (a
// CUDA graph's replays under lite). Where a token does come (a batch
// copy), intervals without it hold no iteration.
func blind(items []Item) bool {
	for i := range items {
		if it := &items[i]; it.Site.Key == "" && it.Key.Dir != event.CUMemcpyDtoH && it.Key.Fn == 0 {
			return false
		}
	}
	return true
}

// onlyLoop says whether every other site of c's thread that recurs
// (SiteMinRuns calls at least) is called in lockstep with c: the thread
// runs one loop, and c's calls are its iterations' (a loss read and its
// copy). A checkpoint copying tensor by tensor, or an evaluation, is a
// second loop: where nothing between calls shows work, the stream cannot
// tell which one is the training's.
func onlyLoop(c *siteCand, cands []*siteCand) bool {
	for _, o := range cands {
		if o != c && o.tid == c.tid && len(o.at) >= SiteMinRuns && !lockstep(c, o) {
			return false
		}
	}
	return true
}

// qualified says whether c recurs once per iteration over a stream of n
// items: enough good intervals, no micro-batches, calls that span it.
func qualified(c *siteCand, n int) bool {
	if !recurs(c) {
		return false
	}
	// Calls that do not span the stream are a phase (an evaluation's
	// batches), not the loop.
	return 4*c.at[0] < n && 4*c.at[len(c.at)-1] >= 3*n
}

// recurs says whether c's intervals hold one iteration often enough:
// SiteMinRuns of them and a SiteGood share, or SiteMinGroups where each
// good one holds a group of micro-batch reads; never a site that reads
// micro-batches itself.
func recurs(c *siteCand) bool {
	least := SiteMinRuns
	if c.groups >= c.good && c.good > 0 {
		least = SiteMinGroups
	}
	return c.good >= least && float64(c.good) >= SiteGood*float64(c.all) && c.micro == 0
}

// PinIn is the pin of the site key in items (Pick.Pin), "" when items
// hold no call of it: as the stream shows the same helper called from
// elsewhere (an evaluation reading through it), the pin moves out to the
// caller that tells them apart.
func PinIn(items []Item, key string) string {
	var s *Site
	seen := map[string]bool{}
	var cands []*siteCand
	for i := range items {
		it := &items[i]
		if it.Site.Key == "" || seen[it.Site.Key] {
			continue
		}
		seen[it.Site.Key] = true
		cands = append(cands, &siteCand{site: it.Site})
		if it.Site.Key == key {
			s = &it.Site
		}
	}
	if s == nil {
		return ""
	}
	return pin(*s, cands)
}

// pin is the innermost frame of s that no other site of cands holds, its
// outermost when each is shared.
func pin(s Site, cands []*siteCand) string {
	for _, f := range s.Frames {
		shared := false
		for _, c := range cands {
			if c.site.Key != s.Key && slices.Contains(c.site.Frames, f) {
				shared = true
				break
			}
		}
		if !shared {
			return f
		}
	}
	return s.Frames[len(s.Frames)-1]
}

// Undecided says whether a site on tid does not recur as an iteration's
// yet but may once more of its intervals are seen: they hold a varying
// number of the same token (2 micro-batches, then 3) and the launches
// have not shown enough of them to fit (variedShort).
func (sc *Scored) Undecided(tid uint32) bool {
	for _, c := range sc.cands {
		if c.tid == tid && c.short && !recurs(c) {
			return true
		}
	}
	return false
}

// Qualifies says whether the site key on tid still recurs once per
// iteration in items, as PickSite requires of a pick (its rivals aside).
func Qualifies(items []Item, key string, tid uint32) bool { return Score(items).Qualifies(key, tid) }

// Qualifies is the package's Qualifies over the scored stream.
func (sc *Scored) Qualifies(key string, tid uint32) bool {
	c := candOf(sc.cands, key, tid)
	return c != nil && recurs(c)
}

// candOf is the candidate of site key on tid among cands, nil if none.
func candOf(cands []*siteCand, key string, tid uint32) *siteCand {
	for _, c := range cands {
		if c.site.Key == key && c.tid == tid {
			return c
		}
	}
	return nil
}

func threadLaunches(span []Item, tid uint32) uint64 {
	var n uint64
	for i := range span {
		if span[i].Site.Key != "" && span[i].TID == tid {
			n += span[i].Launches
		}
	}
	return n
}

// lockstep says whether c is called once between most consecutive calls
// of b: two syncs of one iteration (a loss read and an accuracy read).
func lockstep(b, c *siteCand) bool {
	once := 0
	callsBetween(b.at, c.at, func(_, n int) {
		if n == 1 {
			once++
		}
	})
	return float64(once) >= SiteGood*float64(len(b.at)-1)
}

// callsBetween calls f(j, n) for each j from 1 with n the calls of inner
// (stream indexes, ascending) strictly between outer's calls j-1 and j.
func callsBetween(outer, inner []int, f func(j, n int)) {
	k := 0
	for j := 1; j < len(outer); j++ {
		n := 0
		for k < len(inner) && inner[k] < outer[j] {
			if inner[k] > outer[j-1] {
				n++
			}
			k++
		}
		f(j, n)
	}
}

func better(c, b *siteCand, pid uint32) bool {
	if cm, bm := c.tid == pid, b.tid == pid; cm != bm {
		return cm
	}
	if c.good != b.good {
		return c.good > b.good
	}
	return c.at[len(c.at)-1] > b.at[len(b.at)-1]
}
