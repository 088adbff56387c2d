package correlate

import (
	"sort"

	"github.com/gaptrace/gaptrace/correlate/attribute"
	"github.com/gaptrace/gaptrace/correlate/interval"
)

type tcount struct {
	t int64
	n uint64
}

// recLaunches records n launches flushed at t (made since the thread's
// previous flushed event), keeping the records sorted by time.
func (p *proc) recLaunches(t int64, n uint64) {
	if p.recFrom == 0 {
		p.recFrom = t
	}
	i := len(p.launchRec)
	for i > 0 && p.launchRec[i-1].t > t {
		i--
	}
	p.launchRec = append(p.launchRec, tcount{})
	copy(p.launchRec[i+1:], p.launchRec[i:])
	p.launchRec[i] = tcount{t, n}
}

// launchWeight is how many launches were made in [a,b) outside the spans
// hid: each record's launches are spread over the non-hidden time since the
// previous record (no launch happens inside a gap); past the last record
// (launches not flushed yet) the average density of the records continues.
// It is what the GPU's busy time is split by.
func (p *proc) launchWeight(a, b int64, hid []interval.Span) float64 {
	nonGap := func(x, y int64) int64 { return (y - x) - interval.Overlap(hid, x, y) }
	prev := p.recFrom
	var w float64
	var n uint64
	for _, r := range p.launchRec {
		n += r.n
		if r.t > prev {
			if r.t > a && prev < b {
				if ng := nonGap(prev, r.t); ng > 0 {
					w += float64(r.n) * float64(nonGap(max(prev, a), min(r.t, b))) / float64(ng)
				}
			}
			prev = r.t
		}
		if prev >= b {
			return w
		}
	}
	if b > prev && n > 0 {
		if ng := nonGap(p.recFrom, prev); ng > 0 {
			w += float64(n) / float64(ng) * float64(nonGap(max(prev, a), b))
		}
	}
	return w
}

// finishStep computes the step's micro idle and emits it.
func (p *proc) finishStep(x env, st *stepAcc) {
	d := x.d
	var open []interval.Span
	if p.gap.cur() != nil && p.gap.cur().start < x.clk.wm {
		open = append(open, interval.Span{A: p.gap.cur().start, B: x.clk.wm})
	}
	micro, nonGap := d.micro(st.Start, st.End, open, p.launchWeight)
	var split []causeNS
	if micro > 0 {
		mask := d.gapsIn(st.Start, st.End, open)
		at := attribute.NewMicro()
		for _, tid := range p.feeders {
			if th := x.w.threads[tid]; th != nil {
				at.Add(x.w, th, st.Start, st.End, mask)
			}
		}
		split = spread(micro, at.ByCause())
		for _, c := range split {
			st.ByCause[c.c] += c.ns
		}
		if nonGap > 0 {
			d.noteDensity(float64(micro) / float64(nonGap))
		}
	} else if nonGap > 0 {
		d.noteDensity(0)
	}
	st.MicroIdleNS = micro
	st.IdleNS = st.BoundedIdleNS + micro
	if dur := st.End - st.Start; dur > 0 {
		st.IdleRatio = float64(st.IdleNS) / float64(dur)
	}
	st.PID, st.Device = p.pid, p.dev
	for _, r := range p.launchRec {
		if r.t >= st.Start && r.t < st.End {
			st.Launches += r.n
		}
	}
	if x.set.hw != nil {
		st.HW = x.set.hw(p.dev, st.Start, st.End)
	}
	p.noteBusyPerLaunch(st, d.maxEnd >= st.End)
	p.out.step(st.Step, st.gaps, split)
}

type causeNS struct {
	c  Cause
	ns int64
}

// spread splits total across causes in proportion to weights, exactly
// (largest remainder), in Causes order; with no weight it is all cpu.
func spread(total int64, weights map[Cause]int64) []causeNS {
	var sum int64
	for _, w := range weights {
		sum += w
	}
	if sum <= 0 {
		return []causeNS{{CauseCPU, total}}
	}
	var out []causeNS
	type rem struct {
		i int
		r int64
	}
	var rems []rem
	var given int64
	for _, c := range Causes {
		w := weights[c]
		if w <= 0 {
			continue
		}
		// total*w can overflow int64 for day-long steps: use float for the
		// share and fix the sum exactly below.
		share := int64(float64(total) * float64(w) / float64(sum))
		out = append(out, causeNS{c, share})
		rems = append(rems, rem{len(out) - 1, int64(float64(total)*float64(w)/float64(sum)*1000) - share*1000})
		given += share
	}
	sort.SliceStable(rems, func(i, j int) bool { return rems[i].r > rems[j].r })
	for i := 0; given < total && len(rems) > 0; i = (i + 1) % len(rems) {
		out[rems[i].i].ns++
		given++
	}
	k := 0
	for _, c := range out {
		if c.ns > 0 {
			out[k] = c
			k++
		}
	}
	return out[:k]
}
