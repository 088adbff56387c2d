package stepclock

import (
	"slices"
	"sort"
)

// Detect finds the loop's clock in the token ring: an operation that
// occurs a fixed number of times per step with the same work between. Of
// the operations that qualify, three rules pick the one that counts loop
// iterations rather than a slice of one or a burst inside one:
//   - it still occurs: not long ago in tokens (a checkpoint's copies
//     repeat among themselves but only within their burst) nor in syncs
//     (an evaluation phase enqueues other work);
//   - its steps share the work: a per-parameter copy of the optimizer
//     repeats with identical (empty) segments between, but the forward
//     and backward all fall into one segment of every dozen; where a
//     coarser clock qualifies too, a finer one whose median step holds
//     less than half its share of the coarser one's (a quarter in time:
//     stalls lengthen the coarser steps) is a slice of it, and
//     a clock whose median step holds under a quarter of the mean is one
//     on its own (work is launches where they are seen, else time: lite
//     would otherwise lock onto the optimizer's copies during warm-up,
//     before the batch copy has repeated often enough to compare). While
//     the ring still holds the run's first token (Input.FromStart), the first
//     step is left out of the mean: the loop's first iteration does
//     one-off work (compiling, autotuning, allocating) however long, which
//     says nothing of where the loop's work recurs, and would make the
//     loop's own clock look concentrated for as many steps as the first
//     iteration is longer than the others;
//   - while nothing is decided yet (Input.NeedSync: no period, no clock, gaps
//     held), it is proven: a sync came between its first and last
//     occurrence, or they span at least the time the ring held before the
//     first. Operations that repeat alike before the loop's first sync may
//     be a burst inside the first iteration (the backward's per-layer
//     copies, after the forward and its compiling), which shows once the
//     iteration's sync falls into one of their steps and makes it the one
//     holding the work; the operation that starts every iteration, the
//     first of the loop, has no such stretch of work before it, so that a
//     loop that never syncs is clocked from its first iterations. Waiting
//     loses no step (the clock lays its steps over the ring when found);
//   - of the rest, the finest wins (a checkpoint or an evaluation every N
//     steps makes a coarser period that also repeats).
func Detect(toks []Token, in Input) (best Found, valid []Found) {
	r := newRing(toks)
	useLaunches := in.LaunchesSeen && r.launches > 0
	// The most frequent operations first: a run's start (loading weights,
	// capturing a graph) enqueues many one-off sizes.
	keys := r.keys
	sort.SliceStable(keys, func(i, j int) bool { return len(r.occ[keys[i]]) > len(r.occ[keys[j]]) })
	if len(keys) > MaxKeys {
		keys = keys[:MaxKeys]
	}
	var cands []Found
	for _, k := range keys {
		if f, ok := r.judge(k, in, useLaunches); ok {
			cands = append(cands, f)
		}
	}
	return pick(cands, useLaunches, in.NeedSync)
}

// Input is what Detect needs besides the token ring.
type Input struct {
	// SyncsSince: syncs since the ring's last token.
	SyncsSince int
	// LaunchesSeen: every launch is seen (full probes), so a step's
	// launches measure its work.
	LaunchesSeen bool
	// NeedSync: nothing is decided yet (no period, no clock, gaps held),
	// so a clock must be proven.
	NeedSync bool
	// FromStart: the ring still holds the run's first token.
	FromStart bool
	// Posts is the longest host pause after a sync that returned in
	// (lo, hi], -1 where none is known (clockPhase).
	Posts func(lo, hi int64) int64
}

// ring is the token ring with prefix sums that make every segment's
// content O(1): the operations it holds as a sum of per-operation hashes
// (a multiset), its launches and its syncs.
type ring struct {
	toks     []Token
	occ      map[Key][]int // each operation's positions
	keys     []Key         // operations in order of first occurrence
	launches uint64
	ph, pl   []uint64
	pm       []uint64 // marked launches' exact counts
	ps       []int
	pi       []int // tokens known to follow no compute
	pv       []int // tokens whose launches were seen (Token.Seen)
}

func newRing(toks []Token) *ring {
	n := len(toks)
	r := &ring{toks: toks, occ: map[Key][]int{}, ph: make([]uint64, n+1), pl: make([]uint64, n+1),
		pm: make([]uint64, n+1), ps: make([]int, n+1), pi: make([]int, n+1), pv: make([]int, n+1)}
	for i := range toks {
		k := toks[i].Key
		if _, ok := r.occ[k]; !ok {
			r.keys = append(r.keys, k)
		}
		r.occ[k] = append(r.occ[k], i)
		r.launches += toks[i].Launches
		r.ph[i+1] = r.ph[i]
		if !k.Marked() {
			r.ph[i+1] += k.hash()
		}
		r.pl[i+1] = r.pl[i] + toks[i].Launches
		r.pm[i+1] = r.pm[i] + toks[i].MLaunches
		r.ps[i+1] = r.ps[i] + toks[i].Syncs
		r.pi[i+1], r.pv[i+1] = r.pi[i], r.pv[i]
		if toks[i].Seen {
			r.pv[i+1]++
		}
		if toks[i].Idle() {
			r.pi[i+1]++
		}
	}
	return r
}

// seen says whether every launch after token a up to token b was seen
// (Token.Seen).
func (r *ring) seen(a, b int) bool { return r.pv[b+1]-r.pv[a+1] == b-a }

// exact is the launches made after token a up to token b, by the
// process's launch positions (Token.Pos).
func (r *ring) exact(a, b int) uint64 { return r.toks[b].Pos - min(r.toks[b].Pos, r.toks[a].Pos) }

// sums are the prefix sums one operation's segments are measured by.
type sums struct{ ops, launches []uint64 }

// seg is what tokens a+1..b hold.
func (r *ring) seg(u sums, a, b int) SegSum {
	return SegSum{Ops: u.ops[b+1] - u.ops[a+1], Launches: u.launches[b+1] - u.launches[a+1],
		Syncs: r.ps[b+1] - r.ps[a+1], Dur: r.toks[b].T - r.toks[a].T}
}

// judge says whether operation k clocks the ring's steps, at the fewest
// occurrences per step m that qualify, and how its steps look.
func (r *ring) judge(k Key, in Input, useLaunches bool) (Found, bool) {
	o := r.occ[k]
	u := sums{r.ph, r.pl}
	if k.Marked() {
		u.launches = r.pm
		// A marked function's steps hold the other marked functions
		// launched as rarely or more rarely than it: a function the
		// loop launches three times an iteration repeats with the same
		// launches between, but the rarer ones (the iteration's last
		// kernel) fall into one of its three segments. Until those
		// have repeated as often as a clock must, it is not judged.
		var wait bool
		if u.ops, wait = rarerMarks(r.toks, r.occ, k); wait {
			return Found{}, false
		}
	}
	unit := make([]SegSum, max(len(o)-1, 0)) // the segments between consecutive occurrences
	for i := range unit {
		unit[i] = r.seg(u, o[i], o[i+1])
	}
	segMin, minMatch := SegMin, MatchMin
	if k.Marked() {
		// A function launched at several places of an iteration
		// repeats alike at all but the one before the iteration's
		// rarer launches (three of four, for a layer's function): a
		// few segments may all miss that one, and four in five
		// matching is no proof. Insertions of host code's choice
		// launch more rarely than markRarer allows for.
		segMin, minMatch = 2*SegMin, markMatch
	}
	for m := 1; m <= MaxM; m++ {
		nseg := (len(o) - 1) / m
		if nseg < segMin {
			break
		}
		if m > 1 && !PhasesDiffer(unit, m, in.LaunchesSeen) {
			// The occurrences are alike: m of them per step is only
			// a coarsening of a clock that does not match yet.
			continue
		}
		if m == 1 && !in.LaunchesSeen && slicedByTime(unit) {
			// Without launches a step's two copies (the batch's, then
			// into a graph's input) hold the same operations between
			// them as the step does: the host time between them says
			// they are slices of one step.
			continue
		}
		if f, ok := r.candidate(k, u, m, minMatch, in, useLaunches); ok {
			if m == 1 && r.positional(o, unit, useLaunches) {
				// Matched by operations alone, yet one position
				// of every few runs no kernel: a slice of a step.
				continue
			}
			return f, true
		}
	}
	return Found{}, false
}

// stepWork is k's steps at m occurrences each: what each enqueued, its work
// (launches, or time), and how many are known to hold no compute.
type stepWork struct {
	feats    []SegSum
	work     []float64
	workSum  float64
	nwork    int
	idleSegs int
	// seen: the launches of the steps whose every launch was seen (auto's
	// windows), where work is time: counted by launch position, they
	// measure the steps' work when the host runs ahead of the device.
	seen []float64
}

func (r *ring) steps(k Key, u sums, m, nseg int, in Input, useLaunches bool) stepWork {
	o := r.occ[k]
	st := stepWork{feats: make([]SegSum, nseg), work: make([]float64, nseg), nwork: nseg}
	for s := 0; s < nseg; s++ {
		a, b := o[s*m], o[(s+1)*m]
		f := r.seg(u, a, b)
		st.feats[s] = f
		if r.pi[b+1]-r.pi[a+1] == b-a {
			st.idleSegs++
		}
		if k.Marked() && r.pm[b+1]-r.pm[a+1] <= uint64(b-a) {
			// Nothing launched between but marked launches
			// themselves: one function launched back to back
			// (initialising each parameter, an optimizer's
			// first step creating its state) is a burst.
			st.idleSegs++
		}
		if useLaunches {
			st.work[s] = float64(f.Launches)
		} else {
			st.work[s] = float64(r.toks[b].T - r.toks[a].T)
			if r.seen(a, b) && (s > 0 || !in.FromStart) {
				st.seen = append(st.seen, float64(r.exact(a, b)))
			}
		}
		if s == 0 && in.FromStart {
			// The run's first iteration: one-off work.
			st.nwork--
			continue
		}
		st.workSum += st.work[s]
	}
	return st
}

// concentrated says whether the steps' median work (med) is far less
// than their mean: the work happens in a few of them (a checkpoint's
// copies, each a step of no work, in one iteration). Where work is time
// and enough steps had all their launches seen, their launches decide:
// a loop that syncs every few iterations lets the host run ahead, and
// the step holding the sync then holds the time of all of them.
func (st *stepWork) concentrated(med float64) bool {
	if len(st.seen) >= SegMin {
		w := slices.Clone(st.seen)
		slices.Sort(w)
		sum := 0.0
		for _, x := range w {
			sum += x
		}
		return w[len(w)/2] < sum/float64(len(w))/4
	}
	return med < st.workSum/float64(st.nwork)/4
}

// candidate judges k at m occurrences per step.
func (r *ring) candidate(k Key, u sums, m int, minMatch float64, in Input, useLaunches bool) (Found, bool) {
	o, toks := r.occ[k], r.toks
	nseg := (len(o) - 1) / m
	st := r.steps(k, u, m, nseg, in, useLaunches)
	feats := st.feats
	syncSame := 0
	for s := 1; s < nseg; s++ {
		if feats[s].Syncs == feats[s-1].Syncs {
			syncSame++
		}
	}
	match, ref := modalMatch(feats, in.LaunchesSeen)
	if float64(match) < minMatch*float64(nseg) {
		return Found{}, false
	}
	segLen := float64(o[nseg*m]-o[0]) / float64(nseg)
	span := float64(toks[o[nseg*m]].T-toks[o[0]].T) / float64(nseg)
	ns := make([]int, nseg)
	for i := range feats {
		ns[i] = feats[i].Syncs
	}
	sort.Ints(ns)
	if r.stopped(o, m, nseg, segLen) || in.SyncsSince > 4*max(ns[nseg/2], 1)+4 {
		// It stopped: a burst (a warm-up's, a checkpoint's), or
		// the loop moved on to work without it.
		return Found{}, false
	}
	sort.Float64s(st.work)
	med := st.work[nseg/2]
	if 2*st.idleSegs > nseg {
		// Every iteration launches kernels (a graph replay counts)
		// or issues collectives: copies known to have none between
		// them are a burst inside one (a warm-up's, a
		// checkpoint's) or no loop at all (a model's setup copying
		// its parameters, before any kernel ran). Likewise a
		// marked function whose steps hold no launch but marked
		// ones: an iteration runs more than its rarest kernels.
		return Found{}, false
	}
	return Found{Key: k, M: m, SegLen: segLen, Span: span, Launches: ref,
		SyncsVary:    syncSame < nseg-1,
		SyncsPerStep: feats[nseg-1].Syncs, Occ: int64(len(o)),
		Unproven: r.ps[o[len(o)-1]+1]-r.ps[o[0]+1] == 0 && toks[o[len(o)-1]].T-toks[o[0]].T < toks[o[0]].T-toks[0].T,
		Work:     med, Concentrated: st.concentrated(med), MedSyncs: ns[nseg/2], SyncCounts: segSyncs(feats[max(0, nseg-SyncsRing):]),
		Phase: clockPhase(toks, o, m, in.Posts)}, true
}

// stopped says whether the operation at positions o stopped occurring:
// tokens since its last occurrence against tokens per step as the ring
// holds them now (the median of the last steps, where more than over the
// ring), and long ago in time. Marked launches may begin to arrive after
// the copies did, and the ring keeps older copies longer than marked
// launches (trimToks). Where the marks arrive only now, or the loop's
// data picks how many kernels (each a marked launch) a step runs, a step
// may hold many more tokens than those before it: it stopped only if as
// long in time, against the longest of the steps but one in ten.
func (r *ring) stopped(o []int, m, nseg int, segLen float64) bool {
	toks := r.toks
	stepToks, after := segLen, len(toks)-1-o[len(o)-1]
	durs := make([]int64, nseg)
	for s := range durs {
		durs[s] = toks[o[(s+1)*m]].T - toks[o[s*m]].T
	}
	slices.Sort(durs)
	longAgo := toks[len(toks)-1].T-toks[o[len(o)-1]].T > 2*durs[(nseg-1)*9/10]
	if nseg >= 3 {
		last := []int{o[nseg*m] - o[(nseg-1)*m], o[(nseg-1)*m] - o[(nseg-2)*m], o[(nseg-2)*m] - o[(nseg-3)*m]}
		sort.Ints(last)
		stepToks = max(stepToks, float64(last[1]))
	}
	return after > int(2*stepToks)+2 && longAgo
}

// pick applies the rules of Detect to the candidates: valid are those that
// are neither concentrated, unproven while a proof is needed, nor a slice
// of a coarser one; best is the finest of them.
func pick(cands []Found, useLaunches, needSync bool) (best Found, valid []Found) {
	// Where work is time, a coarser clock's steps also hold the stalls of
	// the iterations in them (a checkpoint every dozen, a lock, a huge
	// copy every ten), which may well be most of the time: a finer clock
	// is a slice only when its median step holds next to none of it.
	sliceShare := 0.5
	if !useLaunches {
		sliceShare = 0.25
	}
	found, unmarked := false, false
	for i := range cands {
		f := &cands[i]
		if f.Concentrated || needSync && f.Unproven {
			continue
		}
		slice := false
		for j := range cands {
			c := &cands[j]
			fl, cl := StepLens(f, c)
			if cl >= 1.5*fl && !c.Concentrated && f.Work < sliceShare*c.Work*fl/cl {
				slice = true
				break
			}
		}
		if slice {
			continue
		}
		valid = append(valid, *f)
		// A copy or collective that clocks the loop wins over marked
		// launches: it is the loop's own data movement, while the marks
		// are the functions the tracer found rarest.
		if found && unmarked && f.Key.Marked() {
			continue
		}
		// At equal step length the one that occurs once per step, whose
		// occurrence needs no phase.
		if !found || !f.Key.Marked() && !unmarked || f.SegLen < best.SegLen*0.99 || (f.SegLen <= best.SegLen*1.01 && f.M < best.M) {
			best, found = *f, true
			unmarked = unmarked || !f.Key.Marked()
		}
	}
	return best, valid
}

// StepLens are f's and g's step lengths in a unit both are measured in:
// tokens, or time where one is a marked launch's clock and the other not
// (the ring keeps marked launches at their own density).
func StepLens(f, g *Found) (float64, float64) {
	if f.Key.Marked() != g.Key.Marked() {
		return f.Span, g.Span
	}
	return f.SegLen, g.SegLen
}

// rarerMarks is the prefix sum of operation hashes over toks that counts
// the operations that are not marked launches, and the marked launches
// that occur as often as k or up to markRarer times more rarely between
// k's first and last occurrence (occ: each key's positions). Rarer still
// is host code's choice (a metric computed every tenth iteration, an
// evaluation), which makes steps no more different than a scalar read
// does. A function first launched after 2*markRarer of k's occurrences is
// left out: the tracer may mark one later, and the steps before it would
// differ from those after. wait: a rarer one counted has not repeated
// often enough to tell whether k's steps are slices of its own.
func rarerMarks(toks []Token, occ map[Key][]int, k Key) (ph []uint64, wait bool) {
	o := occ[k]
	lo, hi := o[0], o[len(o)-1]
	n := len(o) - 1
	rarer := map[Key]bool{k: true}
	for j, oj := range occ {
		if !j.Marked() || j == k || float64(sort.SearchInts(o, oj[0])) > 2*markRarer {
			continue
		}
		c := 0
		for _, i := range oj {
			if i > lo && i <= hi {
				c++
			}
		}
		if float64(c) <= 1.1*float64(n) && float64(c)*markRarer >= float64(n) {
			rarer[j] = true
		}
		// A function launched as often or up to markRarer times more
		// rarely, seen a few times yet: where the span cut its first and
		// last iteration short, it may be either.
		wait = wait || c < n && len(oj) <= 2*SegMin && float64(c+2)*markRarer >= float64(n)
	}
	ph = make([]uint64, len(toks)+1)
	for i := range toks {
		j := toks[i].Key
		ph[i+1] = ph[i]
		if !j.Marked() || rarer[j] {
			ph[i+1] += j.hash()
		}
	}
	return ph, wait
}

// positional says whether the occurrences o of an operation are slices
// of steps by the launches between them (unit): one position mod some m
// runs no kernel at all while the others do, as the training's copies of
// x and then y, with nothing launched between them and the micro-batch's
// 22 kernels after y. A step runs kernels. The positions are compared
// within each run of alike segments, since an insertion (an evaluation's
// 15 batches, each read back) both differs and shifts the training's
// phase; runs whose segments all launch alike (the evaluation's) say
// nothing, and those with an idle position must outnumber those that vary
// otherwise. Under full's rules this is asked only where the counts
// are too varied for modalMatch to hold the steps to them (as where a
// loop's data picks its kernels), which an evaluation's batches beside the
// training's make them; under lite's (useLaunches false) the steps are
// matched by their operations alone, and the counts are known only where
// a window saw every launch, taken from the launch positions.
func (r *ring) positional(o []int, unit []SegSum, useLaunches bool) bool {
	if len(o) < 2 {
		return false
	}
	if !useLaunches {
		if !r.seen(o[0], o[len(o)-1]) {
			return false
		}
		unit = slices.Clone(unit)
		for i := range unit {
			unit[i].Launches = r.exact(o[i], o[i+1])
		}
	}
	if !slices.ContainsFunc(unit, func(g SegSum) bool { return g.Launches == 0 }) {
		return false // every segment runs kernels
	}
	if useLaunches {
		l := make([]uint64, len(unit))
		for i := range unit {
			l[i] = unit[i].Launches
		}
		slices.Sort(l)
		if fewCounts(l) {
			return false
		}
	}
	// Runs of alike segments (the same operations, synced or not): an
	// evaluation's batches, each read back, are not the training's.
	idle, busy := 0, 0
	for a := 0; a < len(unit); {
		b := a + 1
		for b < len(unit) && unit[b].Ops == unit[a].Ops && (unit[b].Syncs > 0) == (unit[a].Syncs > 0) {
			b++
		}
		switch run := unit[a:b]; {
		case len(run) < 2*2:
			// Too short to show a position's work (the last
			// micro-batch before an evaluation, its read synced).
		case idleRun(run):
			idle += len(run)
		case !alike(run):
			busy += len(run)
		}
		a = b
	}
	return idle > busy && idle >= 2*SegMin
}

// idleRun says whether, for some m, the segments at one position mod m
// launch nothing while the others launch something.
func idleRun(unit []SegSum) bool {
	for m := 2; m <= MaxM && len(unit) >= 2*m; m++ {
		var sum [MaxM]uint64
		for i := range unit {
			sum[i%m] += unit[i].Launches
		}
		idle, busy := false, false
		for _, n := range sum[:m] {
			idle = idle || n == 0
			busy = busy || n > 0
		}
		if idle && busy {
			return true
		}
	}
	return false
}

// alike says whether three in four segments launch about as many kernels
// as their median.
func alike(unit []SegSum) bool {
	l := make([]uint64, len(unit))
	for i := range unit {
		l[i] = unit[i].Launches
	}
	slices.Sort(l)
	n := 0
	for _, x := range l {
		if launchesClose(x, l[len(l)/2]) {
			n++
		}
	}
	return 4*n >= 3*len(l)
}
