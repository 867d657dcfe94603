package luascripts

import (
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// Model is the Go twin of the scripts: the same operations and the same
// floating-point maths, in memory, on an explicit clock. Values are rounded
// through the same '%.6f' / '%.0f' formatting Redis storage imposes, so a
// Model and a redis-server driven through the same operations at the same
// instants hold identical state and give identical replies.
//
// Keys expire as in Redis (each write sets a TTL); ExpireDue removes the
// ones due at a given instant.
//
// A Model is not safe for concurrent use.
type Model struct {
	buckets map[string]*modelBucket // by Keys.Bucket
	// leases are the lease records each bucket holds, by Keys.Bucket: they
	// live in the bucket hash (lib.lua, "Layouts") and expire with it, as
	// does the key's expiry set, rendered from them.
	leases map[string]*modelLeases
	born   map[string]float64 // born sentinels, by Keys.Born (no TTL)
	gen    map[string]float64 // data sets' write generations, by Keys.Gen (no TTL)
	// gens is the calling process's view of the generations (Scripts'
	// Generations): passed to every operation, raised by every reply.
	gens *Generations
	// cands are the candidate sets, by Keys.Cand: member → score (no TTL).
	cands map[string]map[string]float64
	// refilled is the bucket's tokens right after the last operation's
	// refill, before the operation itself (for tests checking refill
	// against exact arithmetic).
	refilled float64
}

// modelBucket mirrors the bucket hash; every field a float64 as in Lua.
type modelBucket struct {
	tk, ts, gr, gb, ge, out, adm, den, gs, dr, sd float64
	rm                                            float64 // refill earned but not yet in tk (micro-tokens)
	rl                                            float64 // tokens released under the grant in force (lib.lua put_back)
	expireAt                                      float64 // µs, the key's TTL deadline
	ttlMS                                         float64 // the TTL last set (PEXPIRE argument)
	// cw and cs are the candidate mark window's fields (lib.lua's
	// cand_check); hasCW: they were written.
	cw, cs float64
	hasCW  bool
	// xe is lib.lua's XE, a lower bound of the lease records' expiries
	// (µs; hasXE: known, stored as field xe in whole ms after ts).
	xe    float64
	hasXE bool
	// stored says which of the thirteen fields above (tk to rl, in
	// bucketFields' order) the hash holds: lib.lua's save_bucket leaves a
	// field out while it is 0 and was never written.
	stored uint16
	// held: no bucket, a held key's demand alone (sd, den and the
	// candidate fields: lib.lua's hash without ts, "Awaited share").
	held bool
}

type modelLease struct {
	g, u, r, seq, exp, lg, lt, pd, dr float64
	au, ad, ar, le                    float64 // fingerprint: totals of the last applied report, lease number
	inc                               string  // incarnation that wrote it
}

type modelLeases struct {
	byID map[string]*modelLease
}

// NewModel returns an empty model (an empty Redis) called by a process
// that has seen nothing of it.
func NewModel() *Model { return NewModelSeen(NewGenerations()) }

// NewModelSeen returns an empty model called by a process whose view of
// the data sets' generations is g (an emptied Redis that the process saw
// before).
func NewModelSeen(g *Generations) *Model {
	return &Model{buckets: map[string]*modelBucket{}, leases: map[string]*modelLeases{}, born: map[string]float64{},
		gen: map[string]float64{}, cands: map[string]map[string]float64{}, gens: g}
}

// Generations is the calling process's view of the data sets'
// generations.
func (m *Model) Generations() *Generations { return m.gens }

// StampBorn mirrors Scripts.StampBorn for one sentinel (born.lua): it
// writes a missing one (0 when trustFull, else nowUS), re-births a data
// set gone back in time, and returns its value.
func (m *Model) StampBorn(nowUS int64, name string, trustFull bool) Born {
	seen := float64(m.gens.Seen(name))
	v, ok := m.born[name]
	g, hasGen := m.gen[GenKey(name)]
	back := (!hasGen && seen > 0) || (hasGen && g < seen)
	if ok && !back {
		return Born{BornUS: int64(v), Gen: int64(g)}
	}
	b := Born{Written: true, Reborn: ok}
	v = float64(nowUS)
	if trustFull && !ok {
		v = 0
	}
	g = max(g, seen) + GenJump
	m.born[name], m.gen[GenKey(name)] = v, g
	b.BornUS, b.Gen = int64(v), int64(g)
	m.gens.note(name, b.Gen, b.Reborn, b.BornUS)
	return b
}

// BornOf returns a sentinel's value, false when it is missing.
func (m *Model) BornOf(name string) (int64, bool) {
	v, ok := m.born[name]
	return int64(v), ok
}

// ExpireDue drops every key whose TTL ran out at or before nowUS, as Redis
// would, and returns their names in order.
func (m *Model) ExpireDue(nowUS int64) []string {
	now := float64(nowUS)
	var gone []string
	for name, b := range m.buckets {
		if b.expireAt <= now {
			delete(m.buckets, name)
			gone = append(gone, name)
		}
	}
	for _, name := range gone {
		if ls, ok := m.leases[name]; ok {
			delete(m.leases, name)
			if len(ls.byID) > fewLeases {
				gone = append(gone, expiryName(name))
			}
		}
	}
	sort.Strings(gone)
	return gone
}

// expiryName is the name of the expiry set of the bucket named bucketKey.
func expiryName(bucketKey string) string { return strings.TrimSuffix(bucketKey, "b") + "x" }

// fewLeases mirrors lib.lua's FEWLEASES: a key with at most this many
// leases has no expiry set (reaping reads its records), one with more has
// one holding every record's expiry. Reaping takes expired leases in the
// same order either way.
const fewLeases = 4

// op is one script execution against one quota key: the Go rendering of
// lib.lua's locals and functions.
type op struct {
	m   *Model
	k   Keys
	c   Common
	now float64
	b   modelBucket  // working copy: the script's unrounded locals
	ls  *modelLeases // the lease records and their zset, changed in place
	// missing: the bucket did not exist when the operation began (or was
	// older than its data set's birth); stamp: the born sentinel was
	// missing (STAMP: written with the bucket).
	missing, stamp bool
	// born, gen, seen and reborn mirror lib.lua's BORN, GEN, GENSEEN and
	// REBORN.
	born, gen, seen float64
	reborn          bool
	// hold mirrors lib.lua's HOLD: the call holds the key (a share
	// awaited, see Common.AwaitingShare).
	hold bool

	reclaimed float64 // RECLAIMED: tokens returned from expired leases
	leases    bool    // LEASES: a lease record or the expiry set was written
	ttl       float64 // TTL: the keys' TTL (ms), computed before any write
}

func (m *Model) begin(nowUS int64, k Keys, c Common) *op {
	o := &op{m: m, k: k, c: c, now: float64(nowUS), seen: float64(m.gens.Seen(k.Born))}
	o.loadBorn()
	o.loadBucket()
	// Every operation ends in save, as every script ends in save_bucket,
	// and neither ever fails half-way: the lease records are changed in
	// place.
	if ls, ok := m.leases[k.Bucket]; ok {
		o.ls = ls
	} else {
		o.ls = &modelLeases{byID: map[string]*modelLease{}}
	}
	o.refill()
	m.refilled = o.b.tk
	o.ttl = o.bucketTTL(o.b.gb, o.b.ge)
	o.hold = c.AwaitingShare && o.missing && o.sb() == 0 && len(o.ls.byID) == 0
	return o
}

func (o *op) sr() float64   { return o.c.StaticRate }
func (o *op) sb() float64   { return o.c.StaticBurst }
func (o *op) lttl() float64 { return float64(o.c.LeaseTTL.Milliseconds()) }

func (o *op) grantValid(t float64) bool { return o.b.ge > t }

func (o *op) rateNow() float64 {
	if o.grantValid(o.now) {
		return o.b.gr
	}
	return o.sr()
}

func (o *op) capNow() float64 {
	if o.grantValid(o.now) {
		return o.b.gb
	}
	return o.sb()
}

// room mirrors lib.lua's room_of: cap - out at the storage's resolution.
func (o *op) roomOf(cap float64) float64 {
	c := cap - o.b.out
	if c < 0 {
		c = 0
	}
	return round6(c)
}

func (o *op) room() float64 { return o.roomOf(o.capNow()) }

// clampTo caps tk at c; a bucket at its cap, reached exactly too, carries
// no fraction (lib.lua clamp_to).
func (o *op) clampTo(c float64) {
	if o.b.tk >= c {
		o.b.tk = c
		o.b.rm = 0
	}
}

func (o *op) clamp() { o.clampTo(o.room()) }

// loadBorn mirrors lib.lua's load_born: the data set's birth and
// generation, re-birthed when it went back in time.
func (o *op) loadBorn() {
	if o.c.RestartWait.Milliseconds() <= 0 {
		return
	}
	v, ok := o.m.born[o.k.Born]
	g, hasGen := o.m.gen[o.k.Gen]
	o.born, o.gen = v, g
	switch {
	case !ok:
		o.born, o.stamp = o.now, true
	case (!hasGen && o.seen > 0) || (hasGen && g < o.seen):
		o.born, o.gen, o.reborn = o.now, o.seen+GenJump, true
		o.m.born[o.k.Born], o.m.gen[o.k.Gen] = o.born, o.gen
	}
}

func (o *op) loadBucket() {
	wait := float64(o.c.RestartWait.Milliseconds())
	var held modelBucket
	if b, ok := o.m.buckets[o.k.Bucket]; ok {
		switch {
		case b.held:
			// A held key's demand goes on in the bucket.
			held = *b
		case !(wait > 0 && b.ts < o.born+wait*1000):
			o.b = *b
			return
		default:
			// Older than its data set's birth: deleted with its leases.
			delete(o.m.buckets, o.k.Bucket)
			delete(o.m.leases, o.k.Bucket)
		}
	}
	// Empty since born + restart wait; refill credits the time since.
	// Inside the wait ts stays in the future: nothing is credited until
	// the wait ends. The birth is the sentinel's, read in the same call.
	o.missing = true
	o.b = modelBucket{ts: o.born + wait*1000, den: held.den, sd: held.sd, cw: held.cw, cs: held.cs, hasCW: held.hasCW}
	if held.held {
		o.b.stored = 1<<fieldDen | 1<<fieldSD // save_held writes both
	}
}

// The bucket hash's thirteen fields, in lib.lua's BUCKET_FIELDS order.
var bucketFields = [13]string{"t", "ts", "gr", "gb", "ge", "out", "adm", "den", "gs", "dr", "sd", "rm", "rl"}

const (
	fieldTS  = 1
	fieldGR  = 2
	fieldGB  = 3
	fieldGE  = 4
	fieldDen = 7
	fieldGS  = 8
	fieldSD  = 10
)

// fields are b's thirteen numbers in bucketFields' order.
func (b *modelBucket) fields() [13]float64 {
	return [13]float64{b.tk, b.ts, b.gr, b.gb, b.ge, b.out, b.adm, b.den, b.gs, b.dr, b.sd, b.rm, b.rl}
}

// fieldValues are b's thirteen fields as save_bucket writes them.
func (b *modelBucket) fieldValues() [13]string {
	return [13]string{f6(b.tk), i0(b.ts), f17(b.gr), f17(b.gb), i0(b.ge), i0(b.out), i0(b.adm), i0(b.den),
		i0(b.gs), i0(b.dr), i0(b.sd), f17(b.rm), f6(b.rl)}
}

func (o *op) credit(dt, r float64) {
	n, rm := accrue(dt, r, o.b.rm)
	o.b.tk = round6(o.b.tk + n/1000000)
	o.b.rm = rm
}

func (o *op) refill() {
	b := &o.b
	t := b.ts
	if o.now > t {
		if b.ge > t {
			e := b.ge
			if e > o.now {
				e = o.now
			}
			o.credit(e-t, b.gr)
			o.clampTo(o.roomOf(b.gb))
			t = e
		}
		// The floor until the rise (lib.lua, "Coming back from a floor").
		if rise := float64(o.c.RiseUS); rise > t && o.now > t {
			e := min(rise, o.now)
			o.credit(e-t, min(o.c.FloorRate, o.sr()))
			o.clampTo(o.roomOf(min(o.c.FloorBurst, o.sb())))
			t = e
		}
		if o.now > t {
			o.credit(o.now-t, o.sr())
		}
		b.ts = o.now
	}
	o.clamp()
	b.tk = round6(b.tk)
}

func (o *op) dropLease(id string, l *modelLease, giveBack bool) float64 {
	unspent := l.g - l.u - l.r
	if unspent < 0 {
		unspent = 0
	}
	o.b.out = o.b.out - unspent
	if o.b.out < 0 {
		o.b.out = 0
	}
	o.b.dr = o.b.dr - l.dr
	if o.b.dr < 0 {
		o.b.dr = 0
	}
	delete(o.ls.byID, id)
	o.leases = true
	if giveBack && unspent > 0 {
		o.putBack(unspent, min(l.exp, o.now))
		return unspent
	}
	return 0
}

// putBack mirrors lib.lua's put_back: n tokens of a lease that ended at
// ended go back to the bucket, at most to the floor's room when it ended
// at or before the rise.
func (o *op) putBack(n, ended float64) {
	tk := o.b.tk + n
	if rise := float64(o.c.RiseUS); rise > 0 && ended <= rise {
		if c := o.roomOf(min(o.c.FloorBurst, o.sb())); tk > c {
			if o.b.tk > c {
				tk = o.b.tk
			} else {
				tk = c
			}
		}
	}
	o.b.tk = tk
	before := o.b.tk
	o.clamp()
	if before > o.b.tk && o.b.ge > o.now {
		o.b.rl = round6(o.b.rl + (before - o.b.tk))
	}
}

// reap mirrors ZRANGEBYSCORE -inf now LIMIT 0 max: ascending score, ties by
// member. A key with few leases reads its records only once now reaches
// the lower bound xe of their expiries, and sets xe anew from them, as
// lib.lua's expired_few does; the leases reaped are the same either way.
func (o *op) reap(max int) (int64, float64) {
	n := len(o.ls.byID)
	if max <= 0 || n == 0 {
		return 0, 0
	}
	few := n <= fewLeases
	if few && o.b.hasXE && o.now < o.b.xe {
		return 0, 0
	}
	type due struct {
		id  string
		exp float64
	}
	var ds []due
	low, hasLow := 0.0, false
	for id, l := range o.ls.byID {
		switch {
		case l.exp <= o.now:
			ds = append(ds, due{id, l.exp})
		case !hasLow || l.exp < low:
			low, hasLow = l.exp, true
		}
	}
	sort.Slice(ds, func(i, j int) bool {
		if ds[i].exp != ds[j].exp {
			return ds[i].exp < ds[j].exp
		}
		return ds[i].id < ds[j].id
	})
	if len(ds) > max {
		low, hasLow = ds[max].exp, true
		ds = ds[:max]
	}
	if few {
		o.b.xe, o.b.hasXE = low, hasLow
	}
	var back float64
	for _, d := range ds {
		x := o.dropLease(d.id, o.ls.byID[d.id], o.c.Reclaim)
		back += x
		o.reclaimed += x
	}
	return int64(len(ds)), back
}

func (o *op) ownLease(id string) *modelLease {
	l, ok := o.ls.byID[id]
	if !ok {
		return nil
	}
	if l.exp <= o.now {
		o.reclaimed += o.dropLease(id, l, o.c.Reclaim)
		return nil
	}
	return l
}

func (o *op) applyUsage(l *modelLease, used, denied, returned, built float64) float64 {
	unspent := l.g - l.u - l.r
	ue := used
	if ue > unspent {
		ue = unspent
	}
	if ue < 0 {
		ue = 0
	}
	unspent = unspent - ue
	re := returned
	if re > unspent {
		re = unspent
	}
	if re < 0 {
		re = 0
	}
	l.u = l.u + ue
	l.r = l.r + re
	o.b.out = o.b.out - ue - re
	if o.b.out < 0 {
		o.b.out = 0
	}
	o.b.adm = o.b.adm + used
	o.b.den = o.b.den + denied
	at := o.now
	if built > 0 {
		at = built
	}
	if l.lt <= 0 || at < l.lt {
		l.lt, l.pd = at, 0
	} else {
		l.pd = l.pd + used + denied
		span := at - l.lt
		dwin := float64(o.c.DemandWindow.Milliseconds()) * 1000
		if span >= dwin || (span >= dwin/5 && quota.DemandMoved(l.pd, l.dr*span/1000000000)) {
			dr := math.Floor(l.pd*1000000000/span + 0.5)
			o.b.dr = o.b.dr + dr - l.dr
			if o.b.dr < 0 {
				o.b.dr = 0
			}
			l.dr, l.lt, l.pd = dr, at, 0
		}
	}
	if re > 0 {
		o.putBack(re, o.now)
	}
	return re
}

func (o *op) waitMS(need float64) float64 {
	short := need - o.b.tk
	if short <= 0 {
		return 0
	}
	if need > o.room() {
		return -1
	}
	r := o.rateNow()
	if r < 1e-9 {
		return -1
	}
	w := math.Ceil(float64(short*1000) / r)
	if !(w < maxMS) {
		return -1
	}
	if n, _ := accrue(w*1000, r, o.b.rm); n < math.Floor(float64(short*1000000)+0.5) {
		w = w + 1
	}
	if o.b.ts > o.now {
		w = w + math.Ceil((o.b.ts-o.now)/1000)
	}
	if !(w < maxMS) {
		return -1
	}
	return w
}

func (o *op) resetMS() float64 { return o.waitMS(o.room()) }

// retryMS mirrors lib.lua's retry_ms: waitMS cut at the end of the grant
// in force, and at one refresh under a grant below the static share.
func (o *op) retryMS(need float64) float64 {
	w := o.waitMS(need)
	if w > 0 && o.b.ge > o.now {
		left := math.Ceil((o.b.ge - o.now) / 1000)
		if o.b.gr < o.sr() {
			left = min(left, 2*float64(o.c.DemandWindow.Milliseconds()))
		}
		w = min(w, left)
	}
	return w
}

// givebackMS mirrors lib.lua's giveback_ms: about one refresh when the
// bucket and the tokens the other live leases hold above their batch cap
// cover need, else -1.
func (o *op) givebackMS(need float64, l *modelLease, live float64) float64 {
	if live < 2 {
		return -1
	}
	keep := math.Floor(o.capNow() / (2 * live))
	if keep < 1 {
		keep = 1
	}
	own := l.g - l.u - l.r
	if own < 0 {
		own = 0
	}
	due := o.b.out - own - (live-1)*keep
	if due <= 0 || math.Floor(o.b.tk)+due < need {
		return -1
	}
	return 2 * float64(o.c.DemandWindow.Milliseconds())
}

// bucketTTL mirrors lib.lua's bucket_ttl: at a static cap of 0 the keys
// live twice the share's fill time (Common.ShareFill), at least 2 x lease
// TTL, after the grant; a static rate of 0 under a cap above 0 keeps the
// largest TTL.
func (o *op) bucketTTL(gb, ge float64) float64 {
	capmax := o.sb()
	gleft := 0.0
	if ge > o.now {
		if gb > capmax {
			capmax = gb
		}
		gleft = math.Ceil((ge - o.now) / 1000)
	}
	refills := 0.0
	if o.sr() > 0 {
		refills = math.Ceil(float64(2000*capmax) / o.sr())
	} else if o.sb() > 0 {
		refills = maxMS
	}
	if fill := float64(o.c.fillMS()); o.sb() <= 0 && refills < 2*fill {
		refills = 2 * fill
	}
	ttl := gleft + refills
	if ttl < 2*o.lttl() {
		ttl = 2 * o.lttl()
	}
	ttl = ttl + 1000
	if !(ttl < maxMS) {
		ttl = maxMS
	}
	return ttl
}

// save writes the bucket back (rounded as Redis storage rounds it) and sets
// every key's TTL as save_bucket does.
func (o *op) save() {
	if o.stamp {
		o.m.born[o.k.Born] = o.now
		o.stamp = false
		o.gen = max(o.gen, o.seen) + GenJump
	}
	if o.c.RestartWait.Milliseconds() > 0 {
		o.gen++
		o.m.gen[o.k.Gen] = o.gen
	}
	b := &o.b
	ttl := o.ttl
	b.expireAt = o.now + ttl*1000
	b.ttlMS = ttl
	if len(o.ls.byID) == 0 {
		b.xe, b.hasXE = 0, false
	}
	if b.hasXE {
		// Stored in whole ms after ts, rounded down (lib.lua's save_bucket).
		b.xe = b.ts + math.Floor((b.xe-b.ts)/1000)*1000
	}
	for i, x := range b.fields() {
		if x != 0 || i == fieldTS { // ts is always written
			b.stored |= 1 << i
		}
	}
	stored := *b
	stored.tk = round6(b.tk)
	o.m.buckets[o.k.Bucket] = &stored
	if len(o.ls.byID) == 0 {
		delete(o.m.leases, o.k.Bucket)
		return
	}
	o.m.leases[o.k.Bucket] = o.ls
}

// saveHeld mirrors lib.lua's save_held: a held key's demand alone, no
// bucket, living 2 x lease TTL + 1 s.
func (o *op) saveHeld() {
	ttl := 2*o.lttl() + 1000
	if !(ttl < maxMS) {
		ttl = maxMS
	}
	o.m.buckets[o.k.Bucket] = &modelBucket{held: true, den: o.b.den, sd: o.b.sd, cw: o.b.cw, cs: o.b.cs, hasCW: o.b.hasCW,
		expireAt: o.now + ttl*1000, ttlMS: ttl}
}

// keep mirrors state.lua's renew_ttls alone: the stored bucket stays as it was
// (the refill is not written back); only the keys' TTLs are renewed, as
// save renews them.
func (o *op) keep() {
	b := o.m.buckets[o.k.Bucket]
	b.expireAt, b.ttlMS = o.now+o.ttl*1000, o.ttl
}

// round6 is x written with six decimals and read back, as lib.lua stores
// a token count ('%.6f'): the float nearest to x rounded to a whole
// micro-token. It is on every modelled call (the simulator's hottest
// arithmetic), so it avoids the decimal round trip where it can: n, the
// nearest integer to y = x·10⁶ computed in floating point, is the
// correctly rounded micro-token count unless the exact x·10⁶ lies within
// y's rounding error (half an ulp of y) of a half-integer, and n/10⁶ is
// then the float nearest to that decimal (n and 10⁶ are exact, and IEEE
// division rounds correctly), which is what ParseFloat returns. Near a
// half-integer, at 2⁵⁰ micro-tokens or above, and for NaN and infinities
// it takes the decimal round trip. round6Decimal is that round trip.
func round6(x float64) float64 {
	y := x * 1e6
	// y is within a·2⁻⁵³ of the exact product, and d is exact below 2⁵²;
	// at or above 2⁵⁰ micro-tokens, and for NaN and infinities, no d
	// passes the test.
	a := math.Abs(y)
	if d := math.Abs(a - math.Floor(a) - 0.5); d > a*0x1p-51 {
		return math.Round(y) / 1e6
	}
	return round6Decimal(x)
}

// round6Decimal is round6 by the decimal round trip itself.
func round6Decimal(x float64) float64 {
	f, _ := strconv.ParseFloat(strconv.FormatFloat(x, 'f', 6, 64), 64)
	return f
}

func (o *op) leaseReply(granted, ttl, retry float64, dup bool) LeaseReply {
	return LeaseReply{
		Granted: int64(granted), TTL: msDur(ttl), Remaining: int64(math.Floor(o.b.tk)),
		RetryAfter: msDur(retry), Rate: o.rateNow(), Cap: o.capNow(),
		Live: int64(len(o.ls.byID)), Reset: msDur(o.resetMS()), NowUS: int64(o.now), Duplicate: dup,
		Reclaimed: int64(o.reclaimed), Gen: o.done(),
	}
}

// done records the operation's generation in the caller's view, as the
// wrappers record a reply's, and returns it.
func (o *op) done() int64 {
	o.m.gens.note(o.k.Born, int64(o.gen), o.reborn, int64(o.now))
	return int64(o.gen)
}

// leaseCarry mirrors lib.lua's lease_carry.
func (o *op) leaseCarry(l *modelLease, dr float64) {
	if dr <= 0 {
		return
	}
	l.dr = dr
	o.b.dr = o.b.dr + dr
}

func msDur(ms float64) time.Duration {
	if ms < 0 {
		return -1
	}
	return time.Duration(ms) * time.Millisecond
}

// reportKind mirrors lib.lua's report_kind.
func reportKind(l *modelLease, inc string, le, seq, tu, td, tr float64) string {
	switch {
	case l.inc != inc:
		return "conflict"
	case le > l.le:
		return "supersede"
	case le < l.le:
		return "stale"
	case seq > l.seq:
		if tu < l.au || td < l.ad || tr < l.ar {
			return "conflict"
		}
		return "new"
	case seq == l.seq:
		if tu == l.au && td == l.ad && tr == l.ar {
			return "retry"
		}
		return "conflict"
	case tu <= l.au && td <= l.ad && tr <= l.ar:
		return "stale"
	}
	return "conflict"
}

func (o *op) leaseOp(id string, r Report, returned float64) LeaseReply {
	o.reap(o.c.ReapBudget)
	l := o.ownLease(id)
	inc := strconv.FormatUint(r.Incarnation, 10)
	le, seq := float64(r.Lease), float64(r.Seq)
	tu, td, tr := float64(r.Used), float64(r.Denied), returned
	want, min := float64(r.Want), float64(r.Min)
	granted, ttl, retry, dup, conflict, back := 0.0, o.lttl(), 0.0, false, false, 0.0
	held := false
	kind := "new"
	if l != nil {
		kind = reportKind(l, inc, le, seq, tu, td, tr)
	}
	carry := 0.0
	if kind == "supersede" {
		carry = l.dr
		o.dropLease(id, l, false)
		l, kind = nil, "new"
	}
	switch {
	case kind == "conflict":
		o.dropLease(id, l, false)
		conflict, ttl = true, 0
	case kind == "retry" || kind == "stale":
		dup = true
		if kind == "retry" {
			granted = l.lg
		}
		ttl = math.Floor((l.exp - o.now) / 1000)
	case o.hold && !r.BookOnly && want > 0:
		// Held: no lease and no bucket; the request's need is demand.
		if min < 1 {
			min = 1
		}
		o.b.sd = o.b.sd + min
		retry = o.retryMS(min)
		ttl = 0
		held = true
	case l != nil || (!r.BookOnly && want > 0):
		if l != nil {
			back = o.applyUsage(l, tu-l.au, td-l.ad, tr-l.ar, float64(max(r.BuiltUS, 0)))
		} else {
			l = &modelLease{}
			o.applyUsage(l, 0, 0, 0, float64(max(r.BuiltUS, 0)))
			o.leaseCarry(l, carry)
		}
		l.au, l.ad, l.ar, l.le, l.inc = tu, td, tr, le, inc
		if want > 0 {
			if min < 1 {
				min = 1
			}
			avail := math.Floor(o.b.tk)
			if avail >= min {
				granted = want
				if granted > avail {
					granted = avail
				}
				o.b.tk = o.b.tk - granted
				o.b.out = o.b.out + granted
				l.g = l.g + granted
			} else {
				retry = o.retryMS(min)
			}
		}
		l.seq = seq
		l.exp = o.now + o.lttl()*1000
		l.lg = granted
		o.ls.byID[id] = l
		o.leases = true
		if !o.b.hasXE || l.exp < o.b.xe {
			o.b.xe, o.b.hasXE = l.exp, true
		}
		if retry > 0 {
			if gb := o.givebackMS(min, l, float64(len(o.ls.byID))); gb >= 0 && gb < retry {
				retry = gb
			}
		}
	default:
		// A report of a lease the region does not know that asks for
		// nothing opens no record; on a missing bucket it writes nothing.
		ttl = 0
	}
	if held {
		o.candCheck()
		o.saveHeld()
	} else {
		o.saveUnlessUndoOnly(l != nil)
	}
	rep := o.leaseReply(granted, ttl, retry, dup)
	rep.Conflict, rep.Returned, rep.Reborn = conflict, int64(back), o.reborn
	return rep
}

// candMark mirrors lib.lua's cand_mark: ZADD GT.
func (o *op) candMark(score float64) {
	set := o.m.cands[o.k.Cand]
	if set == nil {
		set = map[string]float64{}
		o.m.cands[o.k.Cand] = set
	}
	if old, ok := set[o.k.Member]; !ok || score > old {
		set[o.k.Member] = score
	}
}

// candCheck mirrors lib.lua's cand_check.
func (o *op) candCheck() {
	every := float64(o.c.MarkEvery.Milliseconds()) * 1000
	if every <= 0 {
		return
	}
	b := &o.b
	if b.sd == 0 && !(b.dr > 0 && b.dr/1000 >= o.sr()/2) && !(b.ge > o.now) {
		return
	}
	if o.now-b.cw < every {
		return
	}
	strict := 0.0
	if b.sd > b.cs {
		strict = (b.sd - b.cs) * 1000000 / (o.now - b.cw)
	}
	b.cw, b.cs, b.hasCW = o.now, b.sd, true
	if b.ge > o.now {
		o.candMark(b.ge)
	} else if d := b.dr/1000 + strict; d > 0 && d >= o.sr()/2 {
		o.candMark(o.now)
	}
}

// candGranted mirrors lib.lua's cand_granted.
func (o *op) candGranted(exp float64) {
	if o.c.MarkEvery.Milliseconds() <= 0 {
		return
	}
	o.candMark(max(exp, o.now))
}

// Candidates returns the candidate set named cand (member → score, µs).
func (m *Model) Candidates(cand string) map[string]int64 {
	out := map[string]int64{}
	for mem, sc := range m.cands[cand] {
		out[mem] = int64(sc)
	}
	return out
}

// TrimCandidates mirrors the region leader's trim of a candidate set:
// ZREMRANGEBYSCORE cand -inf (belowUS (scores below belowUS go).
func (m *Model) TrimCandidates(cand string, belowUS int64) {
	for mem, sc := range m.cands[cand] {
		if sc < float64(belowUS) {
			delete(m.cands[cand], mem)
		}
	}
	if len(m.cands[cand]) == 0 {
		delete(m.cands, cand)
	}
}

// The exported operations mirror the Scripts methods one to one; nowUS is
// the Redis time the script would have read.

// saveUnlessUndoOnly saves, except after a call that only could undo
// (kept: no lease was involved) on a bucket that did not exist and wrote
// no lease: lib.lua's `if L or not B.missing or LEASES`.
func (o *op) saveUnlessUndoOnly(kept bool) {
	if kept || !o.missing || o.leases {
		o.candCheck()
		o.save()
	}
}

// pastDeadline mirrors lib.lua's deadline check in begin: a call at nowUS
// past c's deadline changes nothing and answers TooLate with its now.
func pastDeadline(nowUS int64, c Common) bool { return c.DeadlineUS > 0 && nowUS > c.DeadlineUS }

// Acquire mirrors Scripts.Acquire.
func (m *Model) Acquire(nowUS int64, k Keys, c Common, r Report) LeaseReply {
	if pastDeadline(nowUS, c) {
		return LeaseReply{TooLate: true, NowUS: nowUS}
	}
	o := m.begin(nowUS, k, c)
	return o.leaseOp(r.Instance, r, float64(r.Returned))
}

// Sync mirrors Scripts.Sync.
func (m *Model) Sync(nowUS int64, k Keys, c Common, r Report) LeaseReply {
	if pastDeadline(nowUS, c) {
		return LeaseReply{TooLate: true, NowUS: nowUS}
	}
	o := m.begin(nowUS, k, c)
	return o.leaseOp(r.Instance, r, float64(r.Returned))
}

// Release mirrors Scripts.Release.
func (m *Model) Release(nowUS int64, k Keys, c Common, r Report) ReleaseReply {
	if pastDeadline(nowUS, c) {
		return ReleaseReply{TooLate: true, NowUS: nowUS}
	}
	o := m.begin(nowUS, k, c)
	o.reap(c.ReapBudget)
	l := o.ownLease(r.Instance)
	back, conflict := 0.0, false
	if l != nil {
		tu, td, tr := float64(r.Used), float64(r.Denied), float64(r.Returned)
		switch reportKind(l, strconv.FormatUint(r.Incarnation, 10), float64(r.Lease), float64(r.Seq), tu, td, tr) {
		case "conflict":
			o.dropLease(r.Instance, l, false)
			conflict = true
		case "supersede":
			o.dropLease(r.Instance, l, false)
		case "stale":
		case "new":
			back = o.applyUsage(l, tu-l.au, td-l.ad, tr-l.ar, float64(max(r.BuiltUS, 0)))
			back += o.dropLease(r.Instance, l, true)
		default: // retry
			back += o.dropLease(r.Instance, l, true)
		}
	}
	o.saveUnlessUndoOnly(l != nil)
	return ReleaseReply{Returned: int64(back), NowUS: nowUS, Conflict: conflict, Gen: o.done(), Reborn: o.reborn}
}

// Check mirrors Scripts.Check.
func (m *Model) Check(nowUS int64, k Keys, c Common, cost int64) CheckReply {
	if pastDeadline(nowUS, c) {
		return CheckReply{TooLate: true, NowUS: nowUS}
	}
	o := m.begin(nowUS, k, c)
	if o.b.out > 0 {
		o.reap(c.ReapBudget)
	}
	fc := float64(cost)
	allowed, retry := false, 0.0
	o.b.sd = o.b.sd + fc
	if o.b.tk >= fc {
		o.b.tk = o.b.tk - fc
		o.b.adm = o.b.adm + fc
		allowed = true
	} else {
		o.b.den = o.b.den + fc
		retry = o.retryMS(fc)
	}
	o.candCheck()
	if o.hold {
		o.saveHeld()
	} else {
		o.save()
	}
	return CheckReply{
		Allowed: allowed, Remaining: int64(math.Floor(o.b.tk)), RetryAfter: msDur(retry), Reset: msDur(o.resetMS()),
		Rate: o.rateNow(), Cap: o.capNow(), NowUS: nowUS, Reclaimed: int64(o.reclaimed), Gen: o.done(), Reborn: o.reborn,
	}
}

// Reap mirrors Scripts.Reap.
func (m *Model) Reap(nowUS int64, k Keys, c Common) ReapReply {
	if pastDeadline(nowUS, c) {
		return ReapReply{TooLate: true, NowUS: nowUS}
	}
	o := m.begin(nowUS, k, c)
	n, back := o.reap(c.ReapBudget)
	// Reaping can only undo, and marks nothing.
	if !o.missing || o.leases {
		o.save()
	}
	return ReapReply{Reaped: n, Returned: int64(back), Live: int64(len(o.ls.byID)), NowUS: nowUS, Gen: o.done(), Reborn: o.reborn}
}

// SetRate mirrors Scripts.SetRate.
func (m *Model) SetRate(nowUS int64, k Keys, c Common, rate, burst float64, expiryUS, issuedUS int64, deposit float64) SetRateReply {
	if pastDeadline(nowUS, c) {
		return SetRateReply{TooLate: true, NowUS: nowUS}
	}
	o := m.begin(nowUS, k, c)
	exp := float64(expiryUS)
	applied := float64(issuedUS) >= o.b.gs
	fresh := float64(issuedUS) > o.b.gs
	if applied {
		o.ttl = o.bucketTTL(burst, exp)
	}
	o.reap(c.ReapBudget)
	released, deposited := 0.0, 0.0
	if applied {
		o.b.gr, o.b.gb, o.b.ge, o.b.gs = rate, burst, exp, float64(issuedUS)
		if fresh {
			o.b.rl = 0
		}
		before := o.b.tk
		o.clamp()
		released = before - o.b.tk
		if fresh && deposit > 0 && o.grantValid(o.b.ts) {
			deposited = math.Floor(deposit*1000000) / 1000000
			o.b.tk += deposited
			o.clamp()
			o.b.tk = round6(o.b.tk)
		}
		o.candGranted(exp)
	}
	o.save()
	return SetRateReply{Applied: applied, Tokens: round6(o.b.tk), Outstanding: int64(o.b.out), NowUS: nowUS, Reclaimed: int64(o.reclaimed),
		Released: round6(released), Deposited: round6(deposited), Gen: o.done(), Reborn: o.reborn}
}

// State mirrors Scripts.State.
func (m *Model) State(nowUS int64, k Keys, c Common) State {
	if pastDeadline(nowUS, c) {
		return State{TooLate: true, NowUS: nowUS}
	}
	o := m.begin(nowUS, k, c)
	o.reap(c.ReapBudget)
	released, took := 0.0, false
	if o.b.rl > 0 {
		if o.b.ge > o.now {
			released = o.b.rl
		}
		o.b.rl, took = 0, true
	}
	if (o.stamp && !o.hold) || o.leases || took {
		o.save()
	} else if !o.missing {
		o.keep()
	}
	ge := o.b.ge
	if ge <= o.now {
		ge = 0
	}
	return State{
		Admitted: int64(o.b.adm), Denied: int64(o.b.den), Rate: o.rateNow(), Cap: o.capNow(),
		GrantExpiryUS: int64(ge), Tokens: round6(o.b.tk), Outstanding: int64(o.b.out), NowUS: nowUS,
		LeaseDemand: float64(int64(o.b.dr)) / 1000, StrictDemand: int64(o.b.sd), Reclaimed: int64(o.reclaimed),
		Released: round6(released), Gen: o.done(), Reborn: o.reborn,
	}
}

// Snapshot renders the model's keys as Redis would show them: hash fields
// as stored strings, sorted-set members with their scores, a string (the
// born sentinels) as its value under the field "". It is what the
// differential test compares against a real server.
func (m *Model) Snapshot() map[string]map[string]string {
	out := map[string]map[string]string{}
	for name, b := range m.buckets {
		if b.held {
			out[name] = map[string]string{"sd": i0(b.sd), "den": i0(b.den)}
			if b.hasCW {
				out[name]["cw"], out[name]["cs"] = i0(b.cw), i0(b.cs)
			}
			continue
		}
		h := map[string]string{}
		for i, v := range b.fieldValues() {
			if b.stored&(1<<i) != 0 {
				h[bucketFields[i]] = v
			}
		}
		if b.hasCW {
			h["cw"], h["cs"] = i0(b.cw), i0(b.cs)
		}
		if b.hasXE {
			h["xe"] = i0((b.xe - b.ts) / 1000)
		}
		if ls, ok := m.leases[name]; ok && len(ls.byID) > 0 {
			z := map[string]string{}
			for id, l := range ls.byID {
				h["#"+id] = leaseRecord(l)
				z[id] = i0(l.exp)
			}
			h["n"] = strconv.Itoa(len(ls.byID))
			if len(ls.byID) > fewLeases {
				out[expiryName(name)] = z
			}
		}
		out[name] = h
	}
	for name, set := range m.cands {
		z := map[string]string{}
		for mem, sc := range set {
			z[mem] = i0(sc)
		}
		out[name] = z
	}
	for name, v := range m.born {
		out[name] = map[string]string{"": i0(v)}
	}
	for name, v := range m.gen {
		out[name] = map[string]string{"": i0(v)}
	}
	return out
}

// LastTTL returns the TTL (PEXPIRE argument) the last write of the named
// key set, and false when the key does not exist.
func (m *Model) LastTTL(name string) (time.Duration, bool) {
	if b, ok := m.buckets[name]; ok {
		return time.Duration(b.ttlMS) * time.Millisecond, true
	}
	for bname, ls := range m.leases {
		if expiryName(bname) == name && len(ls.byID) > fewLeases {
			return time.Duration(m.buckets[bname].ttlMS) * time.Millisecond, true
		}
	}
	return 0, false
}

func f17(x float64) string { return strconv.FormatFloat(x, 'g', 17, 64) }
func f6(x float64) string  { return strconv.FormatFloat(x, 'f', 6, 64) }
func i0(x float64) string  { return strconv.FormatFloat(x, 'f', 0, 64) }
