package world

import (
	"time"

	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/sim/oracle"
)

// The oracle judges what the regional Redis twin actually holds: after
// every script call the region shows it the key's stored bucket (read
// without running a script), and crashed instances' leases are followed
// until the Model actually reaps them.

// observe shows the oracle region r's bucket of k right after a script
// call, and settles crashed leases the call reaped.
func (r *Region) observe(k *keyInfo) {
	p, ok := r.model.PeekBucket(k.rkeys)
	if !ok {
		return
	}
	if r.trustedSeen != nil && !r.trustedSeen[k.id] && r.redisNowUS() < r.trustedUntilUS {
		// A bucket first seen in a data set trusted to start full after
		// a loss (cold_start full): what it holds may be a free burst.
		r.trustedSeen[k.id] = true
		r.w.orc.CrashError(r.w.dur(), k.id, p.Tokens+p.Outstanding)
	}
	c := r.common(k) // the static share, or the floor off lease
	rate, capNow := c.StaticRate, c.StaticBurst
	if p.GrantExpiryUS > p.NowUS {
		rate, capNow = p.GrantRate, p.GrantBurst
	}
	r.w.orc.BucketObserved(r.w.dur(), r.idx, k.id, oracle.Bucket{
		NowUS: p.NowUS, Tokens: p.Tokens, Outstanding: p.Outstanding, Rate: rate, Cap: capNow,
		GrantRate: p.GrantRate, GrantExpiryUS: p.GrantExpiryUS, Admitted: p.Admitted, Denied: p.Denied,
	})
	if len(r.crashed[k.id]) > 0 {
		r.settleCrashed(k)
	}
	if len(r.isolated[k.id]) > 0 {
		r.settleIsolated(k)
	}
}

// expired tells the oracle which buckets Redis expired (their counters
// start again) and settles crashed leases that went with their hash.
func (r *Region) expired(names []string) {
	if len(names) == 0 {
		return
	}
	gone := make(map[string]bool, len(names))
	for _, name := range names {
		gone[name] = true
	}
	for _, k := range r.w.keys {
		if gone[k.rkeys.Bucket] {
			r.w.orc.BucketGone(r.idx, k.id)
		}
		// The lease records live in the bucket (luascripts: lib.lua,
		// "Layouts"): they go with it.
		if gone[k.rkeys.Bucket] {
			delete(r.isolated, k.id) // gone with the key's TTL: nothing handed out again
		}
		if ls := r.crashed[k.id]; len(ls) > 0 && gone[k.rkeys.Bucket] {
			// Gone with the key's TTL, not reaped: nothing handed out
			// again. The TTL ran out because no call came for it, so the
			// tokens were stranded only as a reaped lease's were: up to
			// its expiry, or to now if a call after it did not reap it.
			for _, cl := range ls {
				r.crashDoneAt(cl, r.strandedUntil(cl))
			}
			delete(r.crashed, k.id)
		}
	}
}

// crashRecord follows one crashed instance's leases until the Model has
// reaped every one of them (or lost it with its data).
type crashRecord struct {
	w       *World
	at      time.Duration
	pending int
	tokens  float64
	last    time.Duration
}

// crashLease is one lease of a crashed instance: what the instance held
// unspent when it died (its pool and returns, and the report it had in
// flight), and the lease as the region last stored it.
type crashLease struct {
	crash    *crashRecord
	instance string
	held     float64 // pool + tokens to return
	pendSeq  uint64  // report in flight at the crash (0: none)
	pendRet  float64 // its returned total (cumulative over the lease)
	reclaim  bool
	last     luascripts.LeaseRecord
	// stale: a script call ran on the key after the lease expired and did
	// not reap it (its reap budget went to others).
	stale bool
}

// settleCrashed checks the crashed leases of k against the Model: one
// still stored is remembered as stored; one gone was reaped by the call
// just made. Its unspent tokens (by the region's books) went back to the
// bucket; those the instance had spent without reporting are crash error
// ε, counted now, when the region hands them out again.
func (r *Region) settleCrashed(k *keyInfo) {
	ls := r.crashed[k.id]
	keep := ls[:0]
	for _, cl := range ls {
		if l, ok := r.model.PeekLease(k.rkeys, cl.instance); ok {
			cl.last = l
			if r.redisNowUS() >= l.ExpiryUS {
				cl.stale = true
			}
			keep = append(keep, cl)
			continue
		}
		unspent := max(cl.last.Unspent(), 0)
		if cl.reclaim && r.redisUp {
			held := cl.held
			if cl.pendSeq > 0 {
				if cl.pendSeq > cl.last.Seq {
					// never applied: the tokens its returned total adds
					// were not spent
					held += max(cl.pendRet-cl.last.AppliedReturned, 0)
				} else {
					held += cl.last.LastGrant // applied, its grant never reached the instance
				}
			}
			if eps := unspent - held; eps > 0 {
				r.w.orc.CrashError(r.w.dur(), k.id, eps)
			}
			cl.crash.tokens += unspent
		}
		r.crashDoneAt(cl, r.strandedUntil(cl))
	}
	if len(keep) == 0 {
		delete(r.crashed, k.id)
		return
	}
	r.crashed[k.id] = keep
}

// strandedUntil is when the tokens of cl, a crashed lease gone from the
// Model now, stopped being stranded. They were stranded from the lease's
// expiry until the first script call that reaped them; time in which no
// call came (nobody asked for the key here) does not count, as the first
// one reaps before it reads the bucket. So a lease no call saw expired
// ends at its expiry (or at the crash, when it had already expired);
// one a call saw expired and left stored (stale) ends now.
func (r *Region) strandedUntil(cl *crashLease) time.Duration {
	at := r.w.dur()
	if !cl.stale {
		at = min(at, max(cl.crash.at, trueTimeOf(cl.last.ExpiryUS, r.offset)))
	}
	return at
}

func (r *Region) crashDoneAt(cl *crashLease, at time.Duration) {
	c := cl.crash
	c.pending--
	c.last = max(c.last, at)
	if c.pending == 0 {
		c.w.orc.Reclaimed(c.at, c.last, c.tokens)
	}
}

// crashesLost ends every crashed lease when Redis comes back empty: they
// are gone with the data, nothing reclaimed. No call could reap one while
// Redis was down, so, as for a lease no call saw expired, its tokens were
// stranded until its expiry (or the end of the data, when that came
// first); one a call saw expired and left stored, until Redis went down.
func (r *Region) crashesLost() {
	for id, ls := range r.crashed {
		for _, cl := range ls {
			at := r.strandedUntil(cl)
			if cl.stale {
				at = max(cl.crash.at, min(at, r.redisDownAt))
			}
			r.crashDoneAt(cl, at)
		}
		delete(r.crashed, id)
	}
}
