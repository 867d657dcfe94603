package hierarchy

import (
	"container/heap"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sluicehq/sluice/pkg/quota"
)

// The resharding timeline: one key moves from its old owner (allocator 0)
// to a new one (allocator 1) while the regions switch from the old shard
// map to the new one at random epochs, and each owner adopts the new map at
// its own random epoch, over lossy, slow, duplicating links with silences
// long enough for lapses. It runs the rules pkg/allocator and pkg/regional
// apply around these pure allocators (docs/architecture.md, The sharded
// global tier):
//   - a region reports the key to its owner under the map it runs, sends
//     every shard a report each epoch, and installs the key's grants only
//     from that owner;
//   - an allocator refuses a report naming a key it owns under none of the
//     maps it holds (the old one while some region may run it, the new one
//     once adopted);
//   - an allocator that adopted the new map learns while some region it
//     heard runs the old one or not every region has reported the new one,
//     and one validity and one epoch after;
//   - a region's static lease for the key is the shortest of its owners'
//     under every map in play: the old map until one validity and one epoch
//     after a confirmation reached it.
// At every instant the regions may use at most the key's rate and burst.

type reshardRegion struct {
	seq      uint64
	lastSend int64
	held     heldGrant
	demand   float64
	switchAt int64    // runs the new map from then on
	dropAt   int64    // a confirmation of the new map reached it (0: not yet)
	lease    [2]int64 // static lease end from each allocator
}

type reshardAlloc struct {
	a          *Allocator
	adoptAt    int64
	lastRev    []int // per region: the map it last reported running (-1: not heard)
	learnFloor int64
	resharding bool
	store      []string
}

type reshardSim struct {
	t        *rapid.T
	opts     Options
	key      quota.Key
	limit    KeyLimit
	static   []float64
	staticB  []float64
	floor    []float64
	floorB   []float64
	regions  []reshardRegion
	allocs   [2]*reshardAlloc
	q        rsQueue
	order    int64
	now      int64
	faults   faults
	cut      [][2]int // region, allocator -> epochs its link stays silent
	checks   int
	refusals int
}

const (
	rsSend simEventKind = iota + 100
	rsDeliver
	rsAnswer
	rsAllocate
)

// rsEvent is a timeline event; to and rev name the allocator a report
// goes to and the map it was routed by.
type rsEvent struct {
	at, order int64
	kind      simEventKind
	region    int
	report    Report
	sentAt    int64
	grants    []Grant
	lease     time.Duration
	to, rev   int
	confirm   bool
}

type rsQueue []*rsEvent

func (q rsQueue) Len() int { return len(q) }
func (q rsQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].order < q[j].order
}
func (q rsQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *rsQueue) Push(x any)   { *q = append(*q, x.(*rsEvent)) }
func (q *rsQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

func (s *reshardSim) push(e *rsEvent) {
	s.order++
	e.order = s.order
	heap.Push(&s.q, e)
}

func (s *reshardSim) wall(t int64) time.Time { return simBase.Add(time.Duration(t)) }

func (s *reshardSim) chance(p float64, label string) bool {
	return p > 0 && rapid.Float64Range(0, 1).Draw(s.t, label) < p
}

func (s *reshardSim) delay(label string) int64 {
	if s.faults.maxDelay <= 0 {
		return int64(5 * time.Millisecond)
	}
	return rapid.Int64Range(0, int64(s.faults.maxDelay/time.Millisecond)).Draw(s.t, label) * int64(time.Millisecond)
}

// rev is the map region r runs at t: 0 old, 1 new.
func (s *reshardSim) rev(r int, t int64) int {
	if t >= s.regions[r].switchAt {
		return 1
	}
	return 0
}

// keyLease is the end of region r's static lease for the key at t.
func (s *reshardSim) keyLease(r int, t int64) int64 {
	reg := &s.regions[r]
	if s.rev(r, t) == 0 {
		return reg.lease[0]
	}
	retain := int64(s.opts.Validity + s.opts.Epoch)
	if reg.dropAt == 0 || t < reg.dropAt+retain {
		return min(reg.lease[0], reg.lease[1])
	}
	return reg.lease[1]
}

func (s *reshardSim) usable(r int, t int64) (float64, float64) {
	h := &s.regions[r].held
	if h.ok && t < h.expiry {
		return h.rate, h.burst
	}
	if t < s.keyLease(r, t) {
		return s.static[r], s.staticB[r]
	}
	return s.floor[r], s.floorB[r]
}

func (s *reshardSim) check() {
	s.checks++
	var sumR, sumB float64
	desc := ""
	for r := range s.regions {
		rate, burst := s.usable(r, s.now)
		sumR += rate
		sumB += burst
		desc += fmt.Sprintf("[%s %v/%v held=%+v rev=%d drop=%v leases=%v] ", s.opts.Regions[r].Name, rate, burst,
			s.regions[r].held, s.rev(r, s.now), time.Duration(s.regions[r].dropAt), s.regions[r].lease)
	}
	if sumR > s.limit.Rate*(1+1e-9)+1e-9 || sumB > s.limit.Burst*(1+1e-9)+1e-9 {
		s.t.Fatalf("t=%v: regions may use %v/s and %v tokens of burst, above %v and %v: %s",
			time.Duration(s.now), sumR, sumB, s.limit.Rate, s.limit.Burst, desc)
	}
}

// adopted says whether allocator x runs the new map at t.
func (s *reshardSim) adopted(x int, t int64) bool { return t >= s.allocs[x].adoptAt }

// oldInPlay: allocator x still holds the old map (some region it heard runs
// it, or a region has not been heard; before adopting it runs it).
func (s *reshardSim) oldInPlay(x int, t int64) bool {
	if !s.adopted(x, t) {
		return true
	}
	for _, rev := range s.allocs[x].lastRev {
		if rev != 1 {
			return true
		}
	}
	return false
}

// confirmed: every region reported the new map to x.
func (s *reshardSim) confirmed(x int) bool {
	for _, rev := range s.allocs[x].lastRev {
		if rev != 1 {
			return false
		}
	}
	return true
}

// ensureLearning is pkg/allocator's reshardLearningLocked and
// ensureLearningLocked.
func (s *reshardSim) ensureLearning(x int) {
	al := s.allocs[x]
	if !s.adopted(x, s.now) {
		return
	}
	if !al.resharding && al.learnFloor == 0 {
		al.resharding = true // it saw the count change
	}
	moving := false
	for _, rev := range al.lastRev {
		if rev == 0 {
			moving = true
		}
	}
	if al.resharding {
		if s.confirmed(x) {
			al.resharding = false
		}
		moving = true
	}
	if moving {
		al.learnFloor = max(al.learnFloor, s.now+int64(s.opts.Validity+s.opts.Epoch))
	}
	now := s.wall(s.now)
	if s.now < al.learnFloor && !al.a.Learning(now) {
		al.a.BecomeLeader(now, al.store...)
	}
}

func (s *reshardSim) persist(x int) {
	al := s.allocs[x]
	now := s.wall(s.now)
	pending := al.a.PendingLapses(now)
	if len(pending) == 0 {
		return
	}
	al.store = append(al.a.LapsedSet(), pending...)
	for _, name := range pending {
		if _, err := al.a.LapseDurable(now, name); err != nil {
			s.t.Fatalf("LapseDurable: %v", err)
		}
	}
}

func (s *reshardSim) report(r int, names bool) Report {
	reg := &s.regions[r]
	rep := Report{Region: s.opts.Regions[r].Name, Seq: reg.seq}
	if !names {
		return rep
	}
	window := s.now - reg.lastSend
	if reg.lastSend == 0 || window <= 0 {
		window = int64(s.opts.Epoch)
	}
	rate, burst := s.usable(r, s.now)
	sec := time.Duration(window).Seconds()
	kd := KeyDemand{Key: s.key, Window: time.Duration(window), Admitted: min(reg.demand, rate) * sec, Denied: max(0, reg.demand-rate) * sec}
	if h := &reg.held; h.ok && s.now < h.expiry {
		kd.HeldRate, kd.HeldBurst = h.rate, h.burst
		kd.HeldValid = time.Duration(h.expiry - s.now).Truncate(time.Millisecond)
	}
	kd.Holding = rapid.Float64Range(0, 1).Draw(s.t, "holding") * max(burst, reg.held.lastCap)
	reg.held.lastCap = 0
	rep.Keys = []KeyDemand{kd}
	return rep
}

func (s *reshardSim) step() {
	e := heap.Pop(&s.q).(*rsEvent)
	s.now = e.at
	switch e.kind {
	case rsAllocate:
		for x := range s.allocs {
			s.ensureLearning(x)
			s.allocs[x].a.Allocate(s.wall(s.now))
			s.persist(x)
		}
	case rsSend:
		r := e.region
		reg := &s.regions[r]
		reg.seq++
		rev := s.rev(r, s.now)
		for x := range s.allocs {
			if s.cut[r][x] > 0 {
				continue
			}
			rep := s.report(r, x == rev)
			if s.chance(s.faults.loseReport, "loseReport") {
				continue
			}
			s.push(&rsEvent{at: s.now + s.delay("d1"), kind: rsDeliver, region: r, report: rep, sentAt: s.now, to: x, rev: rev})
			if s.chance(s.faults.duplicate, "duplicate") {
				s.push(&rsEvent{at: s.now + s.delay("d1dup"), kind: rsDeliver, region: r, report: rep, sentAt: s.now, to: x, rev: rev})
			}
		}
		reg.lastSend = s.now
	case rsDeliver:
		x, rev := e.to, e.rev
		al := s.allocs[x]
		names := len(e.report.Keys) > 0
		owned := (x == 0 && s.oldInPlay(x, s.now)) || (x == 1 && s.adopted(x, s.now))
		if names && !owned {
			s.refusals++
			return
		}
		if s.adopted(x, s.now) {
			al.lastRev[e.region] = rev
		}
		s.ensureLearning(x)
		ans, err := al.a.Report(s.wall(s.now), e.report)
		if err != nil {
			if !errorsIsStale(err) {
				s.t.Fatalf("Report: %v", err)
			}
			return
		}
		if s.chance(s.faults.loseAnswer, "loseAnswer") {
			return
		}
		confirm := s.adopted(x, s.now) && s.confirmed(x)
		s.push(&rsEvent{at: s.now + s.delay("d2"), kind: rsAnswer, region: e.region, report: e.report, sentAt: e.sentAt,
			grants: ans.Grants, lease: ans.StaticLease, to: x, rev: rev, confirm: confirm})
	case rsAnswer:
		x, rev := e.to, e.rev
		reg := &s.regions[e.region]
		if e.lease > 0 {
			reg.lease[x] = max(reg.lease[x], e.sentAt+int64(e.lease))
		}
		if e.confirm && s.rev(e.region, s.now) == 1 && reg.dropAt == 0 {
			reg.dropAt = s.now
		}
		if x != rev {
			return // grants only from the key's owner under the map the report was routed by
		}
		for _, g := range e.grants {
			h := &reg.held
			expiry := e.sentAt + int64(g.Valid)
			if e.report.Seq <= h.seq || expiry <= s.now {
				continue
			}
			_, curBurst := s.usable(e.region, s.now)
			*h = heldGrant{ok: true, rate: g.Rate, burst: g.Burst, expiry: expiry, seq: e.report.Seq, lastCap: curBurst}
			s.push(&rsEvent{at: expiry, kind: evCheck})
		}
	}
	if len(s.q) == 0 || s.q[0].at != s.now {
		s.check()
	}
}

func TestReshardingNeverOversubscribes(t *testing.T) {
	rounds := 4
	if testing.Short() {
		rounds = 1
	}
	for round := range rounds {
		t.Run(fmt.Sprintf("round%d", round), func(t *testing.T) { rapid.Check(t, reshardTimeline) })
		if t.Failed() {
			return
		}
	}
}

func reshardTimeline(t *rapid.T) {
	epoch := time.Second
	vEpochs := rapid.SampledFrom([]int{2, 3, 5}).Draw(t, "validityEpochs")
	leaseEpochs := rapid.IntRange(2*vEpochs, 3*vEpochs).Draw(t, "regionLeaseEpochs")
	s := &reshardSim{t: t, key: quota.Key{Tenant: "t", Class: "write"}, opts: Options{
		Regions: genRegions(t, 4), Epoch: epoch,
		Validity: time.Duration(vEpochs) * epoch, RegionLease: time.Duration(leaseEpochs) * epoch,
	}}
	for i := range s.opts.Regions {
		s.opts.Regions[i].Drained = false
	}
	s.limit = KeyLimit{Rate: rapid.Float64Range(1, 1000).Draw(t, "rate"), Burst: rapid.Float64Range(1, 1000).Draw(t, "burst"),
		FloorShare: rapid.SampledFrom([]float64{0, 0.5, 1}).Draw(t, "floorShare")}
	nr := len(s.opts.Regions)
	s.static, s.staticB = make([]float64, nr), make([]float64, nr)
	s.floor, s.floorB = make([]float64, nr), make([]float64, nr)
	StaticShares(s.limit.Rate, s.opts.Regions, s.static)
	StaticBursts(s.limit.Burst, s.limit.Unit, s.opts.Regions, s.staticB)
	for r := range s.static {
		s.floor[r], s.floorB[r] = Floor(s.static[r], s.staticB[r], s.limit.FloorShare, s.limit.unit())
	}
	lapseEpochs := int((time.Duration(leaseEpochs+vEpochs)*epoch+time.Duration(LapseMargin(epoch, s.opts.RegionLease)))/epoch) + 1
	// Switching and adopting start once the old owner is past its
	// learning and has moved capacity, and happen within span epochs.
	warm := vEpochs + rapid.IntRange(1, 6).Draw(t, "warmEpochs")
	span := rapid.IntRange(1, 2*vEpochs+lapseEpochs).Draw(t, "switchSpan")
	s.regions = make([]reshardRegion, nr)
	s.cut = make([][2]int, nr)
	for r := range s.regions {
		s.regions[r].lease = [2]int64{int64(s.opts.RegionLease), int64(s.opts.RegionLease)}
		s.regions[r].demand = genDemand(t, s.limit.Rate)
		s.regions[r].switchAt = int64(warm+rapid.IntRange(0, span).Draw(t, "switchEpoch"))*int64(epoch) +
			int64(rapid.IntRange(0, 999).Draw(t, "switchMs"))*int64(time.Millisecond)
	}
	for x := range s.allocs {
		a, err := NewAllocator(s.opts, s.wall(0))
		if err != nil {
			t.Fatal(err)
		}
		if err := a.SetLimit(s.key, s.limit); err != nil {
			t.Fatal(err)
		}
		al := &reshardAlloc{a: a, lastRev: make([]int, nr)}
		for r := range al.lastRev {
			al.lastRev[r] = -1
		}
		al.adoptAt = int64(warm+rapid.IntRange(0, span).Draw(t, "adoptEpoch"))*int64(epoch) +
			int64(rapid.IntRange(0, 999).Draw(t, "adoptMs"))*int64(time.Millisecond)
		s.allocs[x] = al
	}
	s.faults = faults{
		loseReport: rapid.Float64Range(0, 0.3).Draw(t, "loseReport"),
		loseAnswer: rapid.Float64Range(0, 0.3).Draw(t, "loseAnswer"),
		duplicate:  rapid.Float64Range(0, 0.2).Draw(t, "duplicate"),
		maxDelay:   time.Duration(rapid.IntRange(0, 1500).Draw(t, "maxDelayMs")) * time.Millisecond,
	}
	cutP := rapid.Float64Range(0, 0.2).Draw(t, "cut")
	epochs := warm + span + 2*vEpochs + lapseEpochs + rapid.IntRange(5, 20).Draw(t, "moreEpochs")
	for e := range epochs {
		start := int64(e) * int64(epoch)
		s.push(&rsEvent{at: start, kind: rsAllocate})
		for r := range s.regions {
			for x := range s.cut[r] {
				if s.cut[r][x] > 0 {
					s.cut[r][x]--
				} else if s.chance(cutP, "cutLink") {
					s.cut[r][x] = rapid.IntRange(1, lapseEpochs+3).Draw(t, "cutEpochs")
				}
			}
			if rapid.IntRange(0, 3).Draw(t, "demandChange") == 0 {
				s.regions[r].demand = genDemand(t, s.limit.Rate)
			}
			s.push(&rsEvent{at: start + int64(rapid.IntRange(1, 999).Draw(t, "offsetMs"))*int64(time.Millisecond), kind: rsSend, region: r})
		}
		for len(s.q) > 0 && s.q[0].at < int64(e+1)*int64(epoch) {
			s.step()
		}
	}
}
