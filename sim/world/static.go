package world

// staticStored tells the oracle the end of region r's static lease as its
// Redis now holds it (untilUS, Redis time; 0 none): until then (true time)
// the oracle counts the region's static shares for invariants 2 and 3,
// after it its floors. The regional service stops using them a margin
// earlier, so the oracle's view is never short of what the region may
// use. A Redis back empty holds no lease (oracle.RedisUp).
func (w *World) staticStored(r *Region, untilUS int64) {
	if untilUS == 0 {
		return
	}
	w.orc.StaticLease(w.dur(), r.idx, trueTimeOf(untilUS, r.offset))
}
