package luascripts

// Peeking reads what a Model stores without running a script: no refill,
// no reaping, no TTL refresh. The simulator's oracle judges the scripts'
// results through it after every call, which must not change them.

// Peek is a key's bucket as stored.
type Peek struct {
	// NowUS is the Redis time of the last write (the bucket's ts).
	NowUS int64
	// Tokens in the bucket; Outstanding, the unspent tokens of live leases.
	Tokens, Outstanding float64
	// GrantRate, GrantBurst and GrantExpiryUS are the stored grant (zero
	// when none was ever applied).
	GrantRate, GrantBurst float64
	GrantExpiryUS         int64
	// Admitted and Denied are the cumulative counters.
	Admitted, Denied int64
}

// PeekBucket returns k's stored bucket, false when there is none (a held
// key's demand alone is none: see Common.AwaitingShare).
func (m *Model) PeekBucket(k Keys) (Peek, bool) {
	b, ok := m.buckets[k.Bucket]
	if !ok || b.held {
		return Peek{}, false
	}
	return Peek{
		NowUS: int64(b.ts), Tokens: b.tk, Outstanding: b.out, GrantRate: b.gr, GrantBurst: b.gb,
		GrantExpiryUS: int64(b.ge), Admitted: int64(b.adm), Denied: int64(b.den),
	}, true
}

// PeekLease returns instance's stored lease on k, false when there is none.
func (m *Model) PeekLease(k Keys, instance string) (LeaseRecord, bool) {
	ls, ok := m.leases[k.Bucket]
	if !ok {
		return LeaseRecord{}, false
	}
	l, ok := ls.byID[instance]
	if !ok {
		return LeaseRecord{}, false
	}
	return LeaseRecord{Granted: l.g, Used: l.u, Returned: l.r, Seq: uint64(l.seq), ExpiryUS: int64(l.exp), LastGrant: l.lg,
		WindowStartUS: int64(l.lt), WindowDemand: l.pd, DemandRate: l.dr / 1000,
		AppliedUsed: l.au, AppliedDenied: l.ad, AppliedReturned: l.ar, Lease: uint64(l.le), Incarnation: l.inc,
		Fingerprint: true}, true
}
