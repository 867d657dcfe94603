package regionsync

import (
	"math"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/shrink"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
)

// Kind is what a report is for. Only epoch reports move the demand
// baseline.
type Kind uint8

const (
	// Epoch is the report every epoch.
	Epoch Kind = iota
	// Ack acknowledges at once an answer that lowered a key's rate below
	// what the region held (Lowers): the allocator gives the difference to
	// other regions only once the donor acknowledged the smaller grant.
	Ack
	// CatchUp is a report after report_again_ms, while a raise waits on
	// other regions' acknowledgements.
	CatchUp
	// Nudged is a report the global leader asked for between epochs
	// (AllocatorService.Watch): it starts a round of its own, so its
	// answer may need an acknowledgement and catch-ups like an epoch
	// report's, but it does not move the demand baseline.
	Nudged
)

// String is the kind's metric label.
func (k Kind) String() string {
	switch k {
	case Epoch:
		return "epoch"
	case Ack:
		return "ack"
	case CatchUp:
		return "catch_up"
	case Nudged:
		return "nudged"
	}
	return "unknown"
}

// MaxCatchUps bounds the catch-up reports one epoch makes for a pending
// raise.
const MaxCatchUps = 2

// NudgeSpacing is the least time between the start of a region's last
// round and a round a nudge starts: a nudge that comes sooner waits until
// then (nudges are coalesced, one pending at most). It bounds what nudges
// cost a region at eight extra rounds per epoch, and in practice they come
// only while capacity moves towards or away from it.
func NudgeSpacing(epoch time.Duration) time.Duration { return epoch / 8 }

// NudgeWait is how long a nudge received at now waits before it starts a
// round, the region's last round having started at lastStart.
func NudgeWait(lastStart, now time.Time, epoch time.Duration) time.Duration {
	return max(0, lastStart.Add(NudgeSpacing(epoch)).Sub(now))
}

// KeyRead is one key's state as the region leader read it for a report.
type KeyRead struct {
	Key quota.Key
	// State is the key's state read at the report's send time.
	State luascripts.State
	// StaticRate is the region's static share of the key's rate: what it
	// holds when no grant is valid.
	StaticRate float64
}

// Leader is a region leader's report state: its seq and each key's demand
// baseline. Not safe for concurrent use.
type Leader struct {
	seq      uint64
	last     map[quota.Key]baseline // each key's state at the previous epoch report
	lastPeak shrink.Peak            // last's high-water mark
	// static is the region's static lease as this leadership knows it:
	// what it read from the region's Redis (Load) and what answers and
	// the etcd rule added since.
	static StaticLease
	// watch is the keys to read between epochs for rises (rise.go).
	watch []watched
	// sel is the keys reported without a fresh candidate mark
	// (select.go).
	sel     map[quota.Key]selected
	selPeak shrink.Peak // sel's high-water mark
	// released is, per key, the tokens its last applied install clipped
	// (the burst transfer), until a report carries them or drops them.
	released map[quota.Key]release
}

// baseline is a key's state as the last epoch report read it, and the
// strict path's decisions per second over that report's window (0 at a
// first sight). Between epochs the leader counts the key's strict demand
// at that rate (rise.go): a count over the few milliseconds since the
// epoch report is noise, where its leases' rates are readings.
type baseline struct {
	luascripts.State
	strict float64
}

// release is tokens clipped under one grant, by its install (set_rate's
// reply) or by leases returning tokens above its cap (taken by a state
// read: State.Released), and that grant: they are reported only while
// the key still holds it, so the bucket never refilled into the room they
// left (docs/architecture.md, "Burst transfer"). Each clip is known to
// one call of one leader only, so each token is reported at most once.
type release struct {
	tokens float64
	grant  grantTag
}

// grantTag names a grant as the scripts store it.
type grantTag struct {
	rate, burst float64
	expiryUS    int64
}

// release adds tokens clipped under grant g to k's release, which starts
// afresh when it was of another grant (that one's tokens are dropped).
func (l *Leader) release(k quota.Key, g grantTag, tokens float64) {
	rel, ok := l.released[k]
	if !ok || rel.grant != g {
		rel = release{grant: g}
	}
	rel.tokens += tokens
	if rel.tokens > 0 {
		l.released[k] = rel
	} else {
		delete(l.released, k)
	}
}

// took adds the tokens a state read took (State.Released) to the key's
// release.
func (l *Leader) took(r KeyRead) {
	if st := r.State; st.Released > 0 {
		l.release(r.Key, grantTag{rate: st.Rate, burst: st.Cap, expiryUS: st.GrantExpiryUS}, st.Released)
	}
}

// NewLeader returns a leader with no baselines.
func NewLeader() *Leader {
	return &Leader{last: map[quota.Key]baseline{}, sel: map[quota.Key]selected{}, released: map[quota.Key]release{}}
}

// Elected starts a new leadership: the demand baseline starts afresh, so
// the first report of a key after a leader change carries no counts, and
// the static lease is what the region's Redis holds (Load it before the
// first report; until then it is none), and the keys to report are the
// candidates the scripts marked (granted keys among them until their
// grants end). The seq only ever grows.
func (l *Leader) Elected() {
	clear(l.last)
	clear(l.sel)
	clear(l.released)
	l.watch = l.watch[:0]
	l.static = StaticLease{}
}

// Load merges the static lease read from the region's Redis (a new leader
// takes over its predecessor's; a lost key leaves the region on its
// floor until the global tier confers a lease again).
func (l *Leader) Load(s StaticLease) { l.static = l.static.Merge(s) }

// Static is the region's static lease as the leader holds it.
func (l *Leader) Static() StaticLease { return l.static }

// StaticAnswered applies the static lease the answer g to the report sent
// at sendUS confers (StaticLease.Answered). grew says the lease now runs
// longer: the caller stores it in the region's Redis for the replicas and
// the next leader. A refused static_lease_ms changes nothing.
func (l *Leader) StaticAnswered(g *sluicev1.RegionGrants, sendUS int64) (grew bool, err error) {
	s, err := l.static.Answered(g, sendUS)
	grew = s.UntilUS > l.static.UntilUS
	l.static = s
	return grew, err
}

// NoGlobalLeader applies the etcd rule (StaticLease.NoGlobalLeader): the
// leader read that no global leader was elected, the read sent at Redis
// time fromUS and answered at toUS. grew as for StaticAnswered.
func (l *Leader) NoGlobalLeader(fromUS, toUS int64, regionLease time.Duration) (grew bool) {
	s := l.static.NoGlobalLeader(fromUS, toUS, regionLease)
	grew = s.UntilUS > l.static.UntilUS
	l.static = s
	return grew
}

// Held is the rate each reported key held when its report was sent (its
// grant's, or the static share when no grant was valid).
type Held map[quota.Key]float64

// Report builds the report of kind sent at sendUS (Redis time) from the
// keys' states; epoch is the allocation period. Seq is Redis time, so it
// grows across leader changes without storing anything. A key's first
// sight is a baseline for the counters, and its demand is what the live
// leases ask for (State.LeaseDemand) over a window of one epoch: the
// allocator sees a new hot key's demand in the report that first names
// it, not one epoch later. Without live lease demand the first sight is a
// 1 ms window with no counts, too short to count as demand. A held grant is
// echoed exactly as the scripts store it (the allocator's region contract
// needs it bit for bit), with its remaining validity in whole milliseconds.
// Acknowledgements and catch-ups keep the demand baseline where it was.
// In a report other than an epoch report, a watched key whose live leases
// ask for materially more than it last reported (the test of Moved), or
// a granted one whose leases ask for materially less (Moved), goes out as
// at a first sight: its demand rate over one epoch, no counts. Its
// window since the epoch report may be shorter than half an epoch, from
// which the allocator takes no reading, and the rise would wait for the
// next epoch report.
// An epoch report forgets the baseline of every key it leaves out: the
// key no longer needs the global tier (select.go), and should it come back
// its first report is a baseline again, as after an election. The report
// also updates which keys stay selected (select.go). The baselines are thus bounded by
// the keys of one report. static_valid_ms is the static lease's remaining
// validity at sendUS.
func (l *Leader) Report(region string, sendUS int64, epoch time.Duration, kind Kind, reads []KeyRead) (*sluicev1.RegionReport, Held) {
	l.seq = max(l.seq+1, uint64(sendUS))
	rep := &sluicev1.RegionReport{Region: region, Seq: l.seq, Keys: make([]*sluicev1.KeyDemand, 0, len(reads)),
		StaticValidMs: l.static.ValidMs(sendUS)}
	held := make(Held, len(reads))
	demand := make([]float64, len(reads))
	watchDemand := make([]float64, len(reads))
	var risenFrom map[quota.Key]float64
	if kind != Epoch && len(l.watch) > 0 {
		risenFrom = l.risenFrom()
	}
	half := max(epoch.Seconds()/2, 1e-3)
	for i, r := range reads {
		l.took(r)
		st := r.State
		prev, seen := l.last[r.Key]
		next := baseline{State: st, strict: prev.strict}
		// The key's demand now as the watch judges it (rise.go).
		now := st.LeaseDemand + prev.strict
		kd := &sluicev1.KeyDemand{
			Key:      &sluicev1.QuotaKey{Tenant: r.Key.Tenant, Class: r.Key.Class},
			Holding:  st.Holding(),
			WindowMs: 1,
		}
		switch {
		case seen && st.NowUS > prev.NowUS:
			d := st.Since(prev.State)
			next.strict = d.StrictRate
			kd.Admitted, kd.Denied, kd.WindowMs = d.Admitted, d.Denied, d.Window.Milliseconds()
			kd.DemandRate = proto.Float64(d.DemandRate)
			if from, ok := risenFrom[r.Key]; ok && kd.WindowMs < epoch.Milliseconds() && (risen(half, now, r, from) || fallen(half, now, r, from)) {
				// A rise (or a granted key's fall) within the epoch: the
				// reading over one epoch, as at a first sight (the
				// allocator takes no reading from a window under half an
				// epoch), its strict part at the last epoch report's
				// rate, as the watch judged it.
				kd.Admitted, kd.Denied, kd.WindowMs = 0, 0, epoch.Milliseconds()
				kd.DemandRate = proto.Float64(now)
			}
		case !seen && st.LeaseDemand > 0 && epoch >= time.Millisecond:
			kd.WindowMs = epoch.Milliseconds()
			kd.DemandRate = proto.Float64(st.LeaseDemand)
		}
		if kind == Epoch {
			l.last[r.Key] = next
		}
		// A key with no demand rate is a baseline, or a reading that saw
		// no time pass: it carries no counts, so no demand.
		demand[i] = kd.GetDemandRate()
		watchDemand[i] = demand[i]
		if seen && kind != Epoch && 2*kd.WindowMs < epoch.Milliseconds() {
			// A reading the allocator does not take: the watch compares
			// with the demand as it judges it, not with a count over a
			// few milliseconds.
			watchDemand[i] = now
		}
		held[r.Key] = r.StaticRate
		if st.GrantExpiryUS > 0 {
			kd.HeldRate, kd.HeldBurst = st.Rate, st.Cap
			kd.HeldValidMs = (st.GrantExpiryUS - st.NowUS) / 1000
			held[r.Key] = st.Rate
		}
		if rel, ok := l.released[r.Key]; ok {
			// Sent once, in this report, or dropped: while the key still
			// holds the grant whose install clipped them.
			delete(l.released, r.Key)
			if st.GrantExpiryUS > st.NowUS && rel.grant == (grantTag{rate: st.Rate, burst: st.Cap, expiryUS: st.GrantExpiryUS}) {
				kd.Released = rel.tokens
			}
		}
		rep.Keys = append(rep.Keys, kd)
	}
	if kind == Epoch && len(l.last) > len(reads) {
		for k := range l.last {
			if _, ok := held[k]; !ok {
				delete(l.last, k)
			}
		}
	}
	l.lastPeak.Note(len(l.last))
	l.last = shrink.Map(l.last, &l.lastPeak)
	l.noteWatched(reads, watchDemand)
	l.noteSelected(kind, reads, demand)
	return rep, held
}

// Baselines is how many keys have a demand baseline.
func (l *Leader) Baselines() int { return len(l.last) }

// Install is one grant to apply with set_rate.
type Install struct {
	Key         quota.Key
	Wire        *sluicev1.QuotaKey // the answer's key message
	Rate, Burst float64
	// ExpiryUS is when the grant ends in the region's Redis time: the
	// report's send time plus the grant's validity, so the region's view
	// of a grant ends no later than the allocator's.
	ExpiryUS int64
	// FenceUS orders grants: set_rate refuses one older than the grant it
	// holds (the send time of the report it answers).
	FenceUS int64
	// Lowers is true when the grant's rate is materially below (Lowers)
	// what the region held for the key when it sent the report: the rate
	// the report says it held, or for a key the report did not name its
	// static rate (FromStatic). An acknowledgement is owed for it.
	Lowers bool
	// reported: the report named the key, and Lowers was judged from
	// what it held.
	reported bool
	// Deposit is the tokens the grant deposits (KeyGrant.deposit): pass
	// it to set_rate.
	Deposit float64
	// Released is set by the caller from set_rate's reply: the tokens the
	// install clipped, which the next report carries (Installed).
	Released float64
}

// FromStatic judges Lowers for a grant of a key the report did not name,
// from staticRate, the rate the region refills the key at without a grant
// (luascripts.Common.StaticRate); a key the report named keeps the rate
// it reported. The allocator grants a region keys it did not report (its
// share of another region's contended key: a donor's grant) and counts
// the region at that static rate until a report echoes the grant. The
// region reports every key it holds a valid grant for, so it holds none
// for such a key and refills it at staticRate: a grant below that lowers
// it, and acknowledging it at once frees the capacity for the region
// waiting on it, instead of at this region's next report.
func (in *Install) FromStatic(staticRate float64) {
	if !in.reported {
		in.Lowers = Lowers(in.Rate, staticRate)
	}
}

// ReadAt measures the grant from readUS, when the report read the key's
// state, instead of from the report's send time, when that is later. The
// allocator bounds the grant's expiry from below by the answer time of the
// grant the report acknowledged (the region held it, so it had received
// it) plus the validity, and the read that saw that grant came after its
// install. Redis TIME taken before the read may come before that answer
// when another leader of the region (one whose session ended and who does
// not know it yet) installed a grant in between: measured from the send
// time, the region would fall back to its static share before the
// allocator assumes it can. From the read, the grant ends no earlier than
// that bound, and still no later than the allocator's own view (the read
// precedes the send, which precedes the answer).
func (in *Install) ReadAt(readUS int64) {
	if readUS > in.FenceUS {
		in.ExpiryUS += readUS - in.FenceUS
		in.FenceUS = readUS
	}
}

// LowerTolerance is the fraction of the held rate by which a grant must
// be below it to lower it (Lowers).
//
// The allocator makes every grant it issues distinct from the ones it may
// still count the region at, by nudging its values down a few float steps
// (about 1e-16 of the rate): the region echoes what it holds, and only
// distinct values say which grant that is. So nearly every answer's grant
// of a contended key is a few steps below the one held, whether or not
// capacity moved. Such a grant frees nothing: the allocator counts a
// report as freeing capacity of a key (and lets it go to other regions
// sooner, nudging them) only when what the region may use falls by more
// than 1e-9 of the key's rate, and a region's held rate never exceeds the
// key's rate, so a fall of at most 1e-9 of the held rate is never such a
// fall. An acknowledgement for it would cost a whole report (every
// selected key's state read again, every grant installed again) and
// change nothing; the next epoch report acknowledges it as any report
// does. Safety never rests on an acknowledgement: the allocator's fence
// counts the region at every grant it may hold until a report echoes one
// (invariants 2 and 3), so an acknowledgement only makes a donor's real
// cut reach the recipient sooner.
const LowerTolerance = 1e-9

// Lowers says whether a grant of rate lowers held, the rate the region
// held for the key when it sent the report the grant answers: whether it
// is below held by more than LowerTolerance of held.
func Lowers(rate, held float64) bool { return rate < held-LowerTolerance*held }

// MaterialRelease says whether released tokens, clipped by the install of
// a cap of burst, are worth an acknowledgement of their own: at least one
// token and a twentieth of the cap they were clipped from. Smaller ones go
// with the next report (a cap that drifts down by a token each epoch
// would otherwise cost a report each time).
func MaterialRelease(released, burst float64) bool {
	return released >= 1 && released >= (burst+released)/20
}

// Refused is a grant of the answer that is not installed, and why.
type Refused struct {
	Grant  *sluicev1.KeyGrant
	Reason string
}

// Installs turns the answer to the report sent at sendUS into the grants
// to install, in the answer's order. A grant with a negative, NaN or
// infinite rate or burst, or no validity, is refused (the caller logs it);
// its key is not checked against the config here.
func Installs(g *sluicev1.RegionGrants, sendUS int64, held Held) ([]Install, []Refused) {
	var out []Install
	var refused []Refused
	for _, kg := range g.GetGrants() {
		if kg.GetKey() == nil {
			refused = append(refused, Refused{Grant: kg, Reason: "key is missing"})
			continue
		}
		rate, burst, deposit := kg.GetRate(), kg.GetBurst(), kg.GetDeposit()
		if !(rate >= 0) || !(burst >= 0) || !(deposit >= 0) || math.IsInf(rate, 0) || math.IsInf(burst, 0) || math.IsInf(deposit, 0) || kg.GetValidMs() <= 0 {
			refused = append(refused, Refused{Grant: kg, Reason: "rate, burst and deposit must be finite and >= 0, valid_ms > 0"})
			continue
		}
		k := quota.Key{Tenant: kg.GetKey().GetTenant(), Class: kg.GetKey().GetClass()}
		h, reported := held[k]
		out = append(out, Install{
			Key: k, Wire: kg.GetKey(), Rate: rate, Burst: burst, Deposit: deposit,
			ExpiryUS: sendUS + kg.GetValidMs()*1000, FenceUS: sendUS,
			Lowers: reported && Lowers(rate, h), reported: reported,
		})
	}
	return out, refused
}

// Answer is what the region made of one report's answer.
type Answer struct {
	// Lowered: an installed grant (set_rate applied it) lowered a
	// reported key's rate, or its cap clipped a material amount of tokens
	// the global tier may hand on (MaterialRelease).
	Lowered bool
	// Again > 0: a raise is pending; report again after it.
	Again time.Duration
}

// Outcome is the Answer of g once the installs were run; applied[i] tells
// whether set_rate applied installs[i].
func Outcome(g *sluicev1.RegionGrants, installs []Install, applied []bool) Answer {
	a := Answer{Again: time.Duration(g.GetReportAgainMs()) * time.Millisecond}
	for i, in := range installs {
		if applied[i] && (in.Lowers || MaterialRelease(in.Released, in.Burst)) {
			a.Lowered = true
		}
	}
	return a
}

// Round is the sequence of reports of one epoch: the epoch report, an
// acknowledgement when its answer lowered a grant, then up to MaxCatchUps
// catch-up reports while an answer says a raise is pending. A nudged
// report starts a round like an epoch report; an acknowledgement or a
// catch-up never triggers an acknowledgement of its own. A grant lowers
// only when it falls by more than LowerTolerance (the allocator's float
// nudges do not), so a region whose grants hold steady sends one report per
// epoch; expect two while capacity moves away from it, and up to two more
// while capacity moves towards it.
type Round struct {
	epoch    time.Duration
	last     Kind
	catchUps int
}

// NewRound starts an epoch's round; its first report is an Epoch report.
func NewRound(epoch time.Duration) *Round { return &Round{epoch: epoch, last: Epoch} }

// NewNudgedRound starts a round whose first report is a Nudged one.
func NewNudgedRound(epoch time.Duration) *Round { return &Round{epoch: epoch, last: Nudged} }

// Next is what follows the answer a to the round's last report: the next
// report's kind and how long to wait before sending it, or more false when
// the round is over.
func (r *Round) Next(a Answer) (kind Kind, wait time.Duration, more bool) {
	if (r.last == Epoch || r.last == Nudged) && a.Lowered {
		r.last = Ack
		return Ack, 0, true
	}
	if a.Again > 0 && r.catchUps < MaxCatchUps {
		r.catchUps++
		r.last = CatchUp
		return CatchUp, min(a.Again, r.epoch), true
	}
	return 0, 0, false
}
