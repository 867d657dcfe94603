package world

import (
	"time"

	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/luascripts"
)

// An isolated instance is alive but cut off from its region's service: its
// Syncs and Acquires time out, it serves from its leases until their
// deadlines, then by its classes' on_failure. When the region reaps such a
// lease, the tokens the instance spent since its last delivered report go
// back to the bucket and are handed out again: ε, bounded by what the lease
// held at that report, counted like a crashed instance's.

// isoLease follows one lease an instance held when it was cut off.
type isoLease struct {
	in   *Instance
	last luascripts.LeaseRecord // as the region last stored it
	// healed: the isolation is over; a report applied after healSeq
	// reached the lease, so nothing spent on it went unreported.
	healed  bool
	healSeq uint64
}

// isolate cuts the instance off from its region for d.
func (in *Instance) isolate(d time.Duration) {
	if !in.alive || in.draining || in.stopping || in.isolated {
		return
	}
	w, r := in.w, in.region
	in.isolated = true
	var watched []*isoLease
	if r.redisUp {
		for _, id := range in.usedIDs {
			k := w.keys[id]
			if l, ok := r.model.PeekLease(k.rkeys, in.id); ok {
				il := &isoLease{in: in, last: l}
				watched = append(watched, il)
				r.isolated[id] = append(r.isolated[id], il)
			}
		}
	}
	gen := in.gen
	w.eng.After(d, func() {
		if in.gen != gen {
			return
		}
		in.isolated = false
		for _, il := range watched {
			il.healed, il.healSeq = true, il.last.Seq
		}
	})
}

// settleIsolated checks the isolated instances' leases of k against the
// Model after a script call. A lease still stored is remembered; one that
// a report after the isolation reached is done; one the call reaped (gone,
// or replaced by a new record, after its expiry) gave its unspent tokens
// by the region's books back to the bucket: those the instance had spent
// without reporting are ε.
func (r *Region) settleIsolated(k *keyInfo) {
	ls := r.isolated[k.id]
	keep := ls[:0]
	for _, il := range ls {
		if l, ok := r.model.PeekLease(k.rkeys, il.in.id); ok && l.Continues(il.last) {
			il.last = l
			if !(il.healed && l.Seq > il.healSeq) {
				keep = append(keep, il)
			}
			continue
		}
		// Reaped only if it had expired: a record dropped before its
		// expiry (superseded) gives nothing back.
		if k.common[r.idx].Reclaim && r.redisUp && il.last.ExpiryUS <= r.redisNowUS() {
			st, _ := il.in.table.State(k.key)
			if eps := max(il.last.Unspent(), 0) - HeldBy(st, il.last); eps > 0 {
				r.w.orc.CrashError(r.w.dur(), k.id, eps)
			}
		}
	}
	if len(keep) == 0 {
		delete(r.isolated, k.id)
		return
	}
	r.isolated[k.id] = keep
}

// HeldBy is what an instance whose lease table reads st for a key holds
// unspent of that key's lease last, as its region last stored it: its
// pool and returns, and what its unapplied report returns (or the last
// grant, if that report was applied but its answer never reached the
// instance). What the region counts unspent beyond it, the instance
// spent without the region knowing: ε once the region reaps the lease.
func HeldBy(st lease.KeyState, last luascripts.LeaseRecord) float64 {
	held := float64(st.Tokens + st.ToReturn)
	if p := st.Pending; p != nil {
		if p.GetSeq() > last.Seq {
			held += max(float64(p.GetReturned())-last.AppliedReturned, 0)
		} else {
			held += last.LastGrant
		}
	}
	return held
}
