package stepclock

// Unclocked work. A site ends the loop's iterations only if no iteration
// goes by without a call of it. Where the stream shows the work of one of
// the site's iterations (a token its intervals hold: the batch's copy, a
// marked function's launch) enqueued more than UnclockedMax times with no
// sited call at all in between, the loop iterated unseen by the site: it is
// a phase inside the loop, not its step site. The case: attached just as an
// evaluation began, the stream held nothing but the evaluation's batches,
// each read from one line, and that line clocked the run; a loop whose own
// iterations sync nowhere (eight micro-batches, the loss read every fifth
// step) then counted each of the evaluation's batches as a step and forty
// training steps as one.
//
// Other work is not counted: a checkpoint's asynchronous copies of many
// equal tensors to the host are not the batch's copy to the device, and an
// evaluation's batches each come with a read of their own.
const UnclockedMax = 2 * SiteRepeat

// Unclocked says whether the stream holds, for the site key on tid, a
// stretch between two sited calls (of any site and thread) in which one
// token of the site's own intervals came more than UnclockedMax times.
func (sc *Scored) Unclocked(key string, tid uint32) bool {
	c := candOf(sc.cands, key, tid)
	if c == nil || len(c.at) < 2 {
		return false
	}
	items := sc.items
	// own: each token of the site's intervals, with the most times one
	// interval held it (micro-batches copy the batch several times).
	own := map[Key]int{}
	n := map[Key]int{} // one interval's, then one stretch's counts
	for k := 1; k < len(c.at); k++ {
		clear(n)
		for i := c.at[k-1] + 1; i < c.at[k]; i++ {
			if it := &items[i]; it.Site.Key == "" {
				n[it.Key]++
			}
		}
		for key, m := range n {
			own[key] = max(own[key], m)
		}
	}
	if len(own) == 0 {
		return false
	}
	clear(n)
	for i := range items {
		it := &items[i]
		if it.Site.Key != "" {
			clear(n)
			continue
		}
		most, ok := own[it.Key]
		if !ok {
			continue
		}
		if n[it.Key]++; n[it.Key] > max(UnclockedMax, 2*most) {
			return true
		}
	}
	return false
}
