package regionsync

import (
	"fmt"
	"math"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/memtest"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
)

var (
	keyA = quota.Key{Tenant: "acme", Class: "read"}
	keyB = quota.Key{Tenant: "beta", Class: "read"}
)

// TestReportEchoesTheHeldGrantExactly: a held grant goes back bit for bit
// with its remaining validity; without one the region holds its static
// share and reports no held grant.
func TestReportEchoesTheHeldGrantExactly(t *testing.T) {
	l := NewLeader()
	const now = 5_000_000_000
	rep, held := l.Report("eu", now, time.Second, Epoch, []KeyRead{
		{Key: keyA, StaticRate: 3, State: luascripts.State{Rate: 7.1, Cap: 9.3, GrantExpiryUS: now + 2_500_700, Tokens: 2, Outstanding: 4, NowUS: now}},
		{Key: keyB, StaticRate: 3, State: luascripts.State{Rate: 3, Cap: 4, Tokens: 1, NowUS: now}},
	})
	if rep.GetRegion() != "eu" || rep.GetSeq() != now || len(rep.GetKeys()) != 2 {
		t.Fatalf("report %v", rep)
	}
	a, b := rep.GetKeys()[0], rep.GetKeys()[1]
	if a.GetHeldRate() != 7.1 || a.GetHeldBurst() != 9.3 || a.GetHeldValidMs() != 2500 || a.GetHolding() != 6 {
		t.Errorf("held grant not echoed exactly: %v", a)
	}
	if b.GetHeldRate() != 0 || b.GetHeldBurst() != 0 || b.GetHeldValidMs() != 0 {
		t.Errorf("a key without a grant reports one: %v", b)
	}
	if held[keyA] != 7.1 || held[keyB] != 3 {
		t.Errorf("held %v, want the grant's rate for %s and the static share for %s", held, keyA, keyB)
	}
	for _, kd := range rep.GetKeys() {
		if kd.GetWindowMs() != 1 || kd.GetAdmitted() != 0 || kd.DemandRate != nil {
			t.Errorf("first sight is not a baseline: %v", kd)
		}
	}
}

// TestReportBaselinesAndSeq: epoch reports move the baseline, extra
// reports do not; seq grows even when Redis time does not; a new
// leadership starts the baselines afresh.
func TestReportBaselinesAndSeq(t *testing.T) {
	l := NewLeader()
	st := func(us, admitted int64) []KeyRead {
		return []KeyRead{{Key: keyA, State: luascripts.State{Admitted: admitted, NowUS: us}}}
	}
	r1, _ := l.Report("eu", 1_000_000, time.Second, Epoch, st(1_000_000, 10))
	r2, _ := l.Report("eu", 1_000_000, time.Second, Ack, st(1_500_000, 30))
	if r2.GetSeq() <= r1.GetSeq() {
		t.Fatalf("seq %d after %d", r2.GetSeq(), r1.GetSeq())
	}
	if kd := r2.GetKeys()[0]; kd.GetAdmitted() != 20 || kd.GetWindowMs() != 500 {
		t.Fatalf("ack report %v, want 20 admitted over 500 ms", kd)
	}
	r3, _ := l.Report("eu", 2_000_000, time.Second, Epoch, st(2_000_000, 50))
	if kd := r3.GetKeys()[0]; kd.GetAdmitted() != 40 || kd.GetWindowMs() != 1000 {
		t.Fatalf("the ack moved the baseline: %v", kd)
	}
	l.Elected()
	r4, _ := l.Report("eu", 3_000_000, time.Second, Epoch, st(3_000_000, 70))
	if kd := r4.GetKeys()[0]; kd.GetWindowMs() != 1 || kd.GetAdmitted() != 0 {
		t.Fatalf("a new leader's first report is not a baseline: %v", kd)
	}
}

// TestInstallsExpireFromTheSendTime: every grant ends at the report's send
// time plus its validity, is fenced on the send time, and says whether it
// lowers what the region held; invalid grants are refused.
func TestInstallsExpireFromTheSendTime(t *testing.T) {
	const sendUS = 9_000_000
	g := &sluicev1.RegionGrants{ReportAgainMs: 40, Grants: []*sluicev1.KeyGrant{
		{Key: &sluicev1.QuotaKey{Tenant: "acme", Class: "read"}, Rate: 2, Burst: 5, ValidMs: 3000},
		{Key: &sluicev1.QuotaKey{Tenant: "beta", Class: "read"}, Rate: 9, Burst: 5, ValidMs: 3000},
		{Key: &sluicev1.QuotaKey{Tenant: "gamma", Class: "read"}, Rate: 1, Burst: 1, ValidMs: 3000},
		{Key: &sluicev1.QuotaKey{Tenant: "delta", Class: "read"}, Rate: -1, Burst: 1, ValidMs: 3000},
		{Key: &sluicev1.QuotaKey{Tenant: "eps", Class: "read"}, Rate: 1, Burst: 1},
		{Rate: 1, Burst: 1, ValidMs: 1},
	}}
	ins, refused := Installs(g, sendUS, Held{keyA: 3, keyB: 3})
	if len(ins) != 3 || len(refused) != 3 {
		t.Fatalf("%d installs, %d refused; want 3 and 3", len(ins), len(refused))
	}
	for _, in := range ins {
		if in.ExpiryUS != sendUS+3_000_000 || in.FenceUS != sendUS {
			t.Errorf("%s: expiry %d fence %d", in.Key, in.ExpiryUS, in.FenceUS)
		}
	}
	if !ins[0].Lowers || ins[1].Lowers || ins[2].Lowers {
		t.Errorf("lowers %v %v %v; want only %s (unreported keys are judged by FromStatic)", ins[0].Lowers, ins[1].Lowers, ins[2].Lowers, keyA)
	}
	if a := Outcome(g, ins, []bool{false, true, true}); a.Lowered || a.Again != 40*time.Millisecond {
		t.Errorf("a lowering grant that was not applied counts: %+v", a)
	}
	if a := Outcome(g, ins, []bool{true, true, true}); !a.Lowered {
		t.Errorf("an applied lowering grant does not count: %+v", a)
	}
}

// TestDonorGrantOfAnUnreportedKeyLowersItsStaticRate: a grant of a key the
// report did not name (a donor's grant) lowers what the region held when
// it is below the static rate the region refills such a key at, so the
// region acknowledges it at once; a reported key keeps the rate it
// reported, whatever its static rate.
func TestDonorGrantOfAnUnreportedKeyLowersItsStaticRate(t *testing.T) {
	const sendUS = 9_000_000
	g := &sluicev1.RegionGrants{Grants: []*sluicev1.KeyGrant{
		{Key: &sluicev1.QuotaKey{Tenant: "acme", Class: "read"}, Rate: 2, Burst: 5, ValidMs: 3000},  // reported, held 3
		{Key: &sluicev1.QuotaKey{Tenant: "gamma", Class: "read"}, Rate: 0, Burst: 1, ValidMs: 3000}, // unreported
		{Key: &sluicev1.QuotaKey{Tenant: "eps", Class: "read"}, Rate: 4, Burst: 1, ValidMs: 3000},   // unreported
	}}
	for _, tc := range []struct {
		static float64
		want   [3]bool
	}{
		{static: 3.33, want: [3]bool{true, true, false}}, // eps's 4 is above it: a raise
		{static: 4, want: [3]bool{true, true, false}},    // equal to the static rate: lowers nothing
		{static: 5, want: [3]bool{true, true, true}},
		{static: 0, want: [3]bool{true, false, false}}, // on a floor of 0 nothing is lower
		{static: 1, want: [3]bool{true, true, false}},  // acme, reported, is judged by the 3 it held
	} {
		ins, _ := Installs(g, sendUS, Held{keyA: 3})
		var got [3]bool
		for i := range ins {
			ins[i].FromStatic(tc.static)
			got[i] = ins[i].Lowers
		}
		if got != tc.want {
			t.Errorf("static %v: lowers %v, want %v", tc.static, got, tc.want)
		}
		if a := Outcome(g, ins, []bool{false, true, true}); a.Lowered != (tc.want[1] || tc.want[2]) {
			t.Errorf("static %v: an applied donor grant's lowering counts %v", tc.static, a.Lowered)
		}
	}
}

// TestInstallReadAtMeasuresFromTheStateRead: a grant is measured from the
// key's state read when that came after the send time (another leader's
// install between the two), never from earlier.
func TestInstallReadAtMeasuresFromTheStateRead(t *testing.T) {
	const sendUS = 9_000_000
	g := &sluicev1.RegionGrants{Grants: []*sluicev1.KeyGrant{{Key: &sluicev1.QuotaKey{Tenant: "acme", Class: "read"}, Rate: 2, Burst: 5, ValidMs: 3000}}}
	for _, tc := range []struct {
		readUS, wantExpiry, wantFence int64
	}{
		{sendUS + 40_000, sendUS + 40_000 + 3_000_000, sendUS + 40_000},
		{sendUS, sendUS + 3_000_000, sendUS},
		{sendUS - 1, sendUS + 3_000_000, sendUS}, // a read before the send time moves nothing
		{0, sendUS + 3_000_000, sendUS},
	} {
		ins, _ := Installs(g, sendUS, nil)
		ins[0].ReadAt(tc.readUS)
		if ins[0].ExpiryUS != tc.wantExpiry || ins[0].FenceUS != tc.wantFence {
			t.Errorf("read at %d: expiry %d fence %d; want %d and %d", tc.readUS, ins[0].ExpiryUS, ins[0].FenceUS, tc.wantExpiry, tc.wantFence)
		}
	}
}

// TestNudgedGrantOwesNoAcknowledgement: the allocator nudges every new
// grant a few float steps below the ones it may still count, so a grant
// that only differs by such steps from the held one lowers nothing and
// starts no acknowledgement report (the region reports once per epoch
// while its grants hold steady); a real cut, however small beyond
// LowerTolerance, still does, and a raise never does.
func TestNudgedGrantOwesNoAcknowledgement(t *testing.T) {
	const held = 37.5
	nudged := held
	for range 8 {
		nudged = math.Nextafter(nudged, 0)
	}
	for _, c := range []struct {
		rate  float64
		lower bool
	}{
		{math.Nextafter(held, 0), false},
		{nudged, false},
		{held * (1 - LowerTolerance/2), false},
		{held, false},
		{held * 2, false},
		{held * (1 - 2*LowerTolerance), true},
		{held * (1 - 1.5e-9), true}, // the tolerance is 1e-9 of the held rate
		{held * (1 - 0.5e-9), false},
		{held / 2, true},
		{0, true},
	} {
		g := &sluicev1.RegionGrants{Grants: []*sluicev1.KeyGrant{
			{Key: &sluicev1.QuotaKey{Tenant: keyA.Tenant, Class: keyA.Class}, Rate: c.rate, Burst: 5, ValidMs: 3000},
		}}
		ins, _ := Installs(g, 1_000_000, Held{keyA: held})
		if len(ins) != 1 || ins[0].Lowers != c.lower {
			t.Errorf("grant %.17g against %v held: lowers %v, want %v", c.rate, held, ins[0].Lowers, c.lower)
			continue
		}
		_, _, more := NewRound(time.Second).Next(Outcome(g, ins, []bool{true}))
		if more != c.lower {
			t.Errorf("grant %.17g against %v held: another report %v, want %v", c.rate, held, more, c.lower)
		}
	}
	// Held at nothing (a region on a floor of 0): nothing lowers it.
	if Lowers(0, 0) || Lowers(math.SmallestNonzeroFloat64, 0) {
		t.Error("a grant lowers a held rate of 0")
	}
}

// TestRound: an acknowledgement only after the epoch report, then at most
// MaxCatchUps catch-ups, each after min(report_again, epoch).
func TestRound(t *testing.T) {
	const epoch = time.Second
	r := NewRound(epoch)
	if k, w, more := r.Next(Answer{Lowered: true, Again: 2 * epoch}); !more || k != Ack || w != 0 {
		t.Fatalf("after a lowering epoch answer: %v %v %v", k, w, more)
	}
	if k, w, more := r.Next(Answer{Lowered: true, Again: 2 * epoch}); !more || k != CatchUp || w != epoch {
		t.Fatalf("after the ack: %v %v %v", k, w, more)
	}
	if k, w, more := r.Next(Answer{Lowered: true, Again: 100 * time.Millisecond}); !more || k != CatchUp || w != 100*time.Millisecond {
		t.Fatalf("second catch-up: %v %v %v", k, w, more)
	}
	if _, _, more := r.Next(Answer{Lowered: true, Again: time.Millisecond}); more {
		t.Fatalf("more than %d catch-ups", MaxCatchUps)
	}
	if _, _, more := NewRound(epoch).Next(Answer{}); more {
		t.Fatal("a quiet answer asks for another report")
	}
}

// TestLeaderForgetsIdleBaselines: the region leader keeps a demand
// baseline only for the keys of its latest epoch report, and the memory of
// the others comes back.
func TestLeaderForgetsIdleBaselines(t *testing.T) {
	n := 200_000
	if testing.Short() {
		n = 20_000
	}
	base := memtest.HeapAlloc()
	l := NewLeader()
	reads := make([]KeyRead, n)
	for i := range reads {
		reads[i] = KeyRead{Key: quota.Key{Tenant: fmt.Sprintf("t%07d", i), Class: "read"}, State: luascripts.State{NowUS: 1}}
	}
	l.Report("eu", 1, time.Second, Epoch, reads)
	reads = nil
	if l.Baselines() != n {
		t.Fatalf("%d baselines after an epoch report of %d keys", l.Baselines(), n)
	}
	live := []KeyRead{{Key: keyA, State: luascripts.State{NowUS: 2}}}
	// An acknowledgement keeps the baselines as they are.
	l.Report("eu", 2, time.Second, Ack, live)
	if l.Baselines() != n {
		t.Fatalf("an acknowledgement changed the baselines: %d, want %d", l.Baselines(), n)
	}
	l.Report("eu", 3, time.Second, Epoch, live)
	if _, ok := l.last[keyA]; l.Baselines() != 1 || !ok {
		t.Fatalf("%d baselines after an epoch report naming one key, want only that key", l.Baselines())
	}
	now := memtest.HeapAlloc()
	t.Logf("heap %+.1f MiB from the baseline", float64(now-base)/(1<<20))
	if slack := int64(4 << 20); now-base > slack {
		t.Fatalf("heap is %.1f MiB above the baseline with one baseline left, want at most %.1f MiB",
			float64(now-base)/(1<<20), float64(slack)/(1<<20))
	}
}

// TestFirstSightCarriesTheLeasesDemand: a key the leader has no baseline
// for is reported with what its live leases ask for, over one epoch, so
// the allocator sees a new hot key's demand in the report that first names
// it; its counters are the baseline of the next report.
func TestFirstSightCarriesTheLeasesDemand(t *testing.T) {
	l := NewLeader()
	read := func(us, admitted int64, leaseDemand float64) []KeyRead {
		return []KeyRead{{Key: keyA, StaticRate: 3, State: luascripts.State{Admitted: admitted, LeaseDemand: leaseDemand, NowUS: us}}}
	}
	rep, _ := l.Report("eu", 1_000_000, 2*time.Second, Epoch, read(1_000_000, 500, 700))
	kd := rep.GetKeys()[0]
	if kd.GetWindowMs() != 2000 || kd.DemandRate == nil || kd.GetDemandRate() != 700 || kd.GetAdmitted() != 0 || kd.GetDenied() != 0 {
		t.Fatalf("first sight %v, want the leases' 700/s over one epoch (2000 ms) and no counts", kd)
	}
	rep, _ = l.Report("eu", 3_000_000, 2*time.Second, Epoch, read(3_000_000, 900, 650))
	if kd := rep.GetKeys()[0]; kd.GetAdmitted() != 400 || kd.GetWindowMs() != 2000 {
		t.Fatalf("second report %v, want the 400 admitted since the first", kd)
	}
}

// TestSeqIsTheSendTimeWheneverItMoved: seq is the report's send time
// (Redis time) whenever that is past the last seq, and the last seq plus
// one otherwise, so it never runs ahead of Redis time for longer than
// Redis time stands still.
func TestSeqIsTheSendTimeWheneverItMoved(t *testing.T) {
	l := NewLeader()
	read := []KeyRead{{Key: keyA, State: luascripts.State{NowUS: 1}}}
	for _, c := range []struct{ send, seq uint64 }{
		{1_000_000, 1_000_000}, {1_000_000, 1_000_001}, {999_000, 1_000_002}, {1_000_003, 1_000_003}, {1_000_005, 1_000_005},
	} {
		if rep, _ := l.Report("eu", int64(c.send), time.Second, Ack, read); rep.GetSeq() != c.seq {
			t.Fatalf("sent at %d: seq %d, want %d", c.send, rep.GetSeq(), c.seq)
		}
	}
}

// TestReadingNeedsRedisTimeToAdvance: a key read again at the same Redis
// time as its baseline, or earlier (a failover to a Redis whose clock is
// behind), gives no reading: a 1 ms window with no counts and no demand
// rate, whatever its counters and live leases say.
func TestReadingNeedsRedisTimeToAdvance(t *testing.T) {
	for _, at := range []int64{5_000_000, 4_000_000} {
		l := NewLeader()
		l.Report("eu", 5_000_000, time.Second, Epoch, []KeyRead{{Key: keyA, StaticRate: 10,
			State: luascripts.State{Admitted: 10, NowUS: 5_000_000}}})
		rep, _ := l.Report("eu", 6_000_000, time.Second, Ack, []KeyRead{{Key: keyA, StaticRate: 10,
			State: luascripts.State{Admitted: 30, Denied: 4, LeaseDemand: 50, NowUS: at}}})
		if kd := rep.GetKeys()[0]; kd.GetWindowMs() != 1 || kd.GetAdmitted() != 0 || kd.GetDenied() != 0 || kd.DemandRate != nil {
			t.Errorf("read at %d µs after a baseline at 5000000 µs: %v, want no reading", at, kd)
		}
	}
}

// TestFirstSightAtItsEdges: any live lease demand, even below one token
// per second, is a first sight's demand over one epoch, and an epoch of
// exactly 1 ms is long enough for it; no demand at all, or an epoch
// shorter than 1 ms (no whole millisecond to report it over), is a
// baseline.
func TestFirstSightAtItsEdges(t *testing.T) {
	for _, c := range []struct {
		name   string
		epoch  time.Duration
		demand float64
		window int64 // 1 with no demand rate: a baseline only
		rated  bool
	}{
		{"half a token per second", time.Second, 0.5, 1000, true},
		{"an epoch of one millisecond", time.Millisecond, 7, 1, true},
		{"an epoch under a millisecond", time.Millisecond - time.Microsecond, 7, 1, false},
		{"no live demand", time.Second, 0, 1, false},
	} {
		rep, _ := NewLeader().Report("eu", 1_000_000, c.epoch, Epoch, []KeyRead{{Key: keyA, StaticRate: 10,
			State: luascripts.State{LeaseDemand: c.demand, NowUS: 1_000_000}}})
		kd := rep.GetKeys()[0]
		if kd.GetWindowMs() != c.window || (kd.DemandRate != nil) != c.rated || (c.rated && kd.GetDemandRate() != c.demand) {
			t.Errorf("%s: first sight %v, want window %d ms and demand rate %v (set %v)", c.name, kd, c.window, c.demand, c.rated)
		}
	}
}

// TestInstallsRefuseOnlyUnusableGrants: a grant of 0 tokens at rate 0
// (over quota) or with a validity of 1 ms is installed; an infinite or
// NaN rate or burst, alone, is refused.
func TestInstallsRefuseOnlyUnusableGrants(t *testing.T) {
	for _, c := range []struct {
		name        string
		rate, burst float64
		validMs     int64
		ok          bool
	}{
		{"nothing", 0, 0, 3000, true},
		{"one millisecond", 5, 5, 1, true},
		{"a burst below one token", 5, 0.5, 3000, true},
		{"an infinite rate", math.Inf(1), 5, 3000, false},
		{"an infinite burst", 5, math.Inf(1), 3000, false},
		{"a NaN rate", math.NaN(), 5, 3000, false},
		{"a NaN burst", 5, math.NaN(), 3000, false},
		{"a negative burst", 5, -1, 3000, false},
		{"a negative validity", 5, 5, -1, false},
	} {
		g := &sluicev1.RegionGrants{Grants: []*sluicev1.KeyGrant{
			{Key: &sluicev1.QuotaKey{Tenant: keyA.Tenant, Class: keyA.Class}, Rate: c.rate, Burst: c.burst, ValidMs: c.validMs},
		}}
		ins, refused := Installs(g, 1_000_000, Held{keyA: 10})
		if got := len(ins) == 1 && len(refused) == 0; got != c.ok {
			t.Errorf("%s: installs %v, refused %v; want installed %v", c.name, ins, refused, c.ok)
			continue
		}
		if c.ok && (ins[0].Rate != c.rate || ins[0].Burst != c.burst || ins[0].ExpiryUS != 1_000_000+c.validMs*1000) {
			t.Errorf("%s: install %+v", c.name, ins[0])
		}
	}
	// Exactly LowerTolerance of the held rate below it does not lower it.
	const held = 37.5
	if Lowers(held-LowerTolerance*held, held) {
		t.Error("a grant exactly LowerTolerance below the held rate lowers it")
	}
}

// TestLeaderEtcdRuleSaysWhenTheLeaseGrew: the etcd rule reports growth
// only when the lease now runs longer, so the caller stores it only then.
func TestLeaderEtcdRuleSaysWhenTheLeaseGrew(t *testing.T) {
	l := NewLeader()
	if l.NoGlobalLeader(10*sec, 11*sec, time.Minute) {
		t.Fatal("the etcd rule grew an absent lease")
	}
	l.Load(StaticLease{UntilUS: 100 * sec})
	if l.NoGlobalLeader(10*sec, 11*sec, time.Minute) || l.Static().UntilUS != 100*sec {
		t.Fatalf("the etcd rule grew a lease running past its extension: %+v", l.Static())
	}
	if !l.NoGlobalLeader(50*sec, 51*sec, time.Minute) || l.Static().UntilUS != 110*sec {
		t.Fatalf("the etcd rule did not grow a running lease: %+v", l.Static())
	}
	if l.NoGlobalLeader(50*sec, 51*sec, time.Minute) {
		t.Fatal("the same extension again says it grew")
	}
}

// TestAnyGrantExpiryIsAHeldGrant: the scripts report GrantExpiryUS 0 when
// no grant is valid and the grant's end otherwise, so the smallest end, 1
// µs, is a held grant like any other: echoed with the rate and cap held
// (its validity rounded down to 0 ms), watched for rises, and kept
// selected while idle; 0 is none of these.
func TestAnyGrantExpiryIsAHeldGrant(t *testing.T) {
	for _, c := range []struct {
		expiryUS int64
		granted  bool
	}{{0, false}, {1, true}, {1001, true}} {
		l := NewLeader()
		var rep *sluicev1.RegionReport
		var held Held
		for i := range LowEpochs {
			rep, held = l.Report("eu", int64(i)+1, time.Second, Epoch, []KeyRead{{Key: keyA, StaticRate: 10,
				State: luascripts.State{Rate: 4.5, Cap: 6.5, GrantExpiryUS: c.expiryUS}}})
			if i == 0 && (len(l.Watched()) == 1) != c.granted {
				t.Errorf("grant expiry %d µs: watched %v, want %v", c.expiryUS, l.Watched(), c.granted)
			}
		}
		kd := rep.GetKeys()[0]
		if got := kd.GetHeldRate() == 4.5 && kd.GetHeldBurst() == 6.5 && held[keyA] == 4.5; got != c.granted {
			t.Errorf("grant expiry %d µs: report %v, held %v; want the grant echoed %v", c.expiryUS, kd, held, c.granted)
		}
		if c.granted && kd.GetHeldValidMs() != c.expiryUS/1000 {
			t.Errorf("grant expiry %d µs: held_valid_ms %d, want %d", c.expiryUS, kd.GetHeldValidMs(), c.expiryUS/1000)
		}
		if !c.granted && held[keyA] != 10 {
			t.Errorf("no grant: held %v, want the static share 10", held[keyA])
		}
		if got := l.Selected() == 1; got != c.granted {
			t.Errorf("grant expiry %d µs, idle: selected after %d epoch reports %v, want %v", c.expiryUS, LowEpochs, got, c.granted)
		}
	}
}

// TestRoundCatchesUpAfterAnyWait: any positive report_again, however
// short, asks for a catch-up after exactly that wait; a round that is over
// names no report and no wait.
func TestRoundCatchesUpAfterAnyWait(t *testing.T) {
	r := NewRound(time.Second)
	if k, w, more := r.Next(Answer{Again: time.Nanosecond}); !more || k != CatchUp || w != time.Nanosecond {
		t.Fatalf("after an answer asking again in 1ns: %v after %v (more %v), want a catch-up after 1ns", k, w, more)
	}
	for _, a := range []Answer{{}, {Again: time.Nanosecond}} {
		r := NewRound(time.Second)
		if a.Again > 0 {
			for range MaxCatchUps {
				r.Next(a)
			}
		}
		if k, w, more := r.Next(a); more || k != 0 || w != 0 {
			t.Errorf("a round over after %+v: %v after %v (more %v), want nothing", a, k, w, more)
		}
	}
}

// TestEpochReportForgetsOnlyTheKeysItLeavesOut: an epoch report that
// names fewer keys than have a baseline forgets the baselines of the keys
// it leaves out and keeps those of the keys it names; a key left out and
// named again is a baseline once more. An acknowledgement forgets nothing.
func TestEpochReportForgetsOnlyTheKeysItLeavesOut(t *testing.T) {
	l := NewLeader()
	read := func(us int64, keys ...quota.Key) []KeyRead {
		out := make([]KeyRead, len(keys))
		for i, k := range keys {
			out[i] = KeyRead{Key: k, State: luascripts.State{Admitted: us / 1000, NowUS: us}}
		}
		return out
	}
	l.Report("eu", 1_000_000, time.Second, Epoch, read(1_000_000, keyA, keyB))
	if l.Baselines() != 2 {
		t.Fatalf("%d baselines after an epoch report of 2 keys", l.Baselines())
	}
	l.Report("eu", 1_500_000, time.Second, Ack, read(1_500_000, keyA))
	if l.Baselines() != 2 {
		t.Fatalf("an acknowledgement naming one key left %d baselines, want 2", l.Baselines())
	}
	l.Report("eu", 2_000_000, time.Second, Epoch, read(2_000_000, keyA))
	if l.Baselines() != 1 {
		t.Fatalf("%d baselines after an epoch report naming one of 2 keys, want 1", l.Baselines())
	}
	rep, _ := l.Report("eu", 3_000_000, time.Second, Epoch, read(3_000_000, keyA, keyB))
	if a := rep.GetKeys()[0]; a.GetWindowMs() != 1000 || a.GetAdmitted() != 1000 {
		t.Errorf("%s, named by every epoch report: %v, want 1000 admitted over 1000 ms", keyA, a)
	}
	if b := rep.GetKeys()[1]; b.GetWindowMs() != 1 || b.GetAdmitted() != 0 || b.DemandRate != nil {
		t.Errorf("%s, left out of an epoch report and named again: %v, want a baseline", keyB, b)
	}
	if l.Baselines() != 2 {
		t.Errorf("%d baselines after an epoch report of 2 keys", l.Baselines())
	}
}

// TestRiseReportDecidesAsRisen: a report between epochs takes a watched
// key's rise exactly as Moved does (the noise over half an epoch
// included): a risen key goes out over one epoch with no counts, one that
// did not rise keeps its reading since the epoch report, and so does a
// key whose window is already a whole epoch.
func TestRiseReportDecidesAsRisen(t *testing.T) {
	const epoch = time.Second
	const t0 = 1_000_000
	for _, c := range []struct {
		name        string
		after       int64 // µs after the epoch report
		demand      float64
		risen       bool // what Moved says of a rise
		window      int64
		counts      bool // the report keeps the counts since the epoch report
		epochReport bool // an Epoch report, not a Nudged one
	}{
		// Last reported 5/s, static share 10: a rise must pass 5 + 3·√(d/0.5).
		{"within the noise of half an epoch", 200_000, 20, false, 200, true, false},
		{"past the noise", 200_000, 30, true, 1000, false, false},
		{"a window of a whole epoch", 1_000_000, 30, true, 1000, true, false},
		// An epoch report (one that came early: its round started late)
		// is read as it is, risen or not: the allocator weighs its window.
		{"an early epoch report past the noise", 200_000, 30, true, 200, true, true},
	} {
		kind := Nudged
		if c.epochReport {
			kind = Epoch
		}
		l := NewLeader()
		l.Report("eu", t0, epoch, Epoch, []KeyRead{{Key: keyA, StaticRate: 10,
			State: luascripts.State{Admitted: 100, Denied: 10, LeaseDemand: 5, NowUS: t0}}})
		if len(l.Watched()) != 1 {
			t.Fatalf("%s: watched %v after a first sight at half the static share", c.name, l.Watched())
		}
		reads := []KeyRead{{Key: keyA, StaticRate: 10,
			State: luascripts.State{Admitted: 150, Denied: 20, LeaseDemand: c.demand, NowUS: t0 + c.after}}}
		if got, _ := l.Moved(epoch, reads); got != c.risen {
			t.Fatalf("%s: Moved rose %v, want %v", c.name, got, c.risen)
		}
		rep, _ := l.Report("eu", t0+c.after, epoch, kind, reads)
		kd := rep.GetKeys()[0]
		wantAdmitted, wantDenied := int64(0), int64(0)
		if c.counts {
			wantAdmitted, wantDenied = 50, 10
		}
		if kd.GetWindowMs() != c.window || kd.GetAdmitted() != wantAdmitted || kd.GetDenied() != wantDenied || kd.GetDemandRate() != c.demand {
			t.Errorf("%s: %v, want %v/s over %d ms with %d admitted and %d denied", c.name, kd, c.demand, c.window, wantAdmitted, wantDenied)
		}
	}
}
