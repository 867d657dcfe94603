package hierarchy

// LastSeq is the Seq of region's last accepted report; reported is false
// when the region has not reported (or is not configured). A report with
// a lower Seq is stale: callers can refuse it before changing anything.
func (a *Allocator) LastSeq(region string) (seq uint64, reported bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ri, ok := a.regionIndex[region]
	if !ok || !a.regions[ri].reported {
		return 0, false
	}
	return a.regions[ri].lastSeq, true
}
