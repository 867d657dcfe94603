package regionsync

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
)

const sec = int64(time.Second / time.Microsecond)

func conferred(ms int64) *sluicev1.RegionGrants { return &sluicev1.RegionGrants{StaticLeaseMs: ms} }

// TestStaticLeaseRunsFromTheSendTime: an answer conferring a static lease
// makes it run until the report's send time plus static_lease_ms; the
// report's static_valid_ms is what remains, rounded down, 0 once it ended.
func TestStaticLeaseRunsFromTheSendTime(t *testing.T) {
	var s StaticLease
	if s.Valid(0) || s.ValidMs(0) != 0 {
		t.Fatalf("the zero lease is valid: %+v", s)
	}
	s, err := s.Answered(conferred(60_000), 100*sec)
	if err != nil || s.UntilUS != 160*sec {
		t.Fatalf("lease %+v, %v; want until 160 s", s, err)
	}
	if got := s.ValidMs(100*sec + 1); got != 59_999 {
		t.Errorf("static_valid_ms %d just after sending, want 59999 (rounded down)", got)
	}
	if !s.Valid(160*sec-1) || s.Valid(160*sec) || s.ValidMs(160*sec) != 0 || s.ValidMs(200*sec) != 0 {
		t.Errorf("lease %+v: must run until 160 s exactly, and report 0 after", s)
	}
}

// TestStaticLeaseNeverExtendedWithoutConferral: an answer with
// static_lease_ms 0 neither extends nor shortens the lease, whatever its
// grants.
func TestStaticLeaseNeverExtendedWithoutConferral(t *testing.T) {
	s := StaticLease{UntilUS: 70 * sec}
	g := &sluicev1.RegionGrants{Grants: []*sluicev1.KeyGrant{{Key: &sluicev1.QuotaKey{Tenant: "a", Class: "b"}, Rate: 1, ValidMs: 5000}}}
	for _, send := range []int64{10 * sec, 69 * sec, 100 * sec} {
		got, err := s.Answered(g, send)
		if err != nil || got != s {
			t.Fatalf("answer without static_lease_ms at %d µs changed the lease to %+v (%v)", send, got, err)
		}
	}
}

// TestStaticLeaseAnswersOrderedLikeGrants: an answer to an older report
// (delivered late) never shortens the lease a newer answer conferred.
func TestStaticLeaseAnswersOrderedLikeGrants(t *testing.T) {
	s, _ := StaticLease{}.Answered(conferred(60_000), 20*sec) // newer report first
	late, err := s.Answered(conferred(60_000), 10*sec)
	if err != nil || late.UntilUS != 80*sec {
		t.Fatalf("a late answer to an older report gave %+v (%v); want until 80 s kept", late, err)
	}
	shorter, _ := s.Answered(conferred(1000), 30*sec)
	if shorter.UntilUS != 80*sec {
		t.Fatalf("a shorter conferral shortened the lease: %+v", shorter)
	}
}

// TestStaticLeaseRefusesBadInput: a negative or oversized static_lease_ms
// is an error and changes nothing.
func TestStaticLeaseRefusesBadInput(t *testing.T) {
	s := StaticLease{UntilUS: 50 * sec}
	for _, ms := range []int64{-1, math.MinInt64, MaxWireMillis + 1, math.MaxInt64} {
		got, err := s.Answered(conferred(ms), 10*sec)
		if !errors.Is(err, quota.ErrInvalid) || got != s {
			t.Errorf("static_lease_ms %d: lease %+v, err %v; want unchanged and ErrInvalid", ms, got, err)
		}
	}
	if got, err := s.Answered(conferred(MaxWireMillis), math.MaxInt64-10); err == nil || got != s {
		t.Errorf("an overflowing lease end was accepted: %+v", got)
	}
}

// TestNoGlobalLeaderExtendsOnlyARunningLease: with no global leader
// elected, a lease still running at the end of the etcd read is extended
// to the read's start + region_lease; an expired or absent lease is never
// revived, and the rule never shortens a lease.
func TestNoGlobalLeaderExtendsOnlyARunningLease(t *testing.T) {
	const lease = time.Minute
	running := StaticLease{UntilUS: 30 * sec}
	if got := running.NoGlobalLeader(20*sec, 21*sec, lease); got.UntilUS != 80*sec {
		t.Errorf("running lease extended to %d µs, want 80 s (read start + region_lease)", got.UntilUS)
	}
	if got := running.NoGlobalLeader(29*sec, 30*sec, lease); got != running {
		t.Errorf("a lease ending before the read answered was extended: %+v", got)
	}
	if got := (StaticLease{}).NoGlobalLeader(20*sec, 21*sec, lease); got.UntilUS != 0 {
		t.Errorf("an empty Redis (no lease) was given one: %+v", got)
	}
	long := StaticLease{UntilUS: 500 * sec}
	if got := long.NoGlobalLeader(20*sec, 21*sec, lease); got != long {
		t.Errorf("the rule shortened a longer lease: %+v", got)
	}
	if got := running.NoGlobalLeader(21*sec, 20*sec, lease); got != running {
		t.Errorf("a read answered before it was sent extended the lease: %+v", got)
	}
	if got := running.NoGlobalLeader(20*sec, 21*sec, 0); got != running {
		t.Errorf("region_lease 0 extended the lease: %+v", got)
	}
}

// TestReplicaChoosesStaticOrFloor: a replica hands its scripts the static
// share while its conservative Redis-time estimate plus the margin is
// before the lease's end, else the floor; before any reading of Redis
// time it knows no lease to be valid.
func TestReplicaChoosesStaticOrFloor(t *testing.T) {
	t0 := time.Unix(1000, 0)
	clock := RedisClock{RedisUS: 50 * sec, Sent: t0}
	if got := clock.Estimate(t0.Add(3 * time.Second)); got != 53*sec {
		t.Fatalf("estimate %d, want 53 s", got)
	}
	if got := clock.Estimate(t0.Add(-time.Second)); got != 50*sec {
		t.Fatalf("estimate before the reading %d, want the reading itself", got)
	}
	if got := (RedisClock{}).Estimate(t0); got != math.MaxInt64 {
		t.Fatalf("no reading estimates %d, want the far future", got)
	}
	static, floor := Share{Rate: 10, Burst: 20}, Share{Rate: 2, Burst: 4}
	lease := StaticLease{UntilUS: 60 * sec}
	margin := time.Second
	for _, c := range []struct {
		at   time.Duration
		want Share
	}{{0, static}, {8*time.Second + 999*time.Millisecond, static}, {9 * time.Second, floor}, {20 * time.Second, floor}} {
		if got := Choose(clock.Estimate(t0.Add(c.at)), lease, margin, static, floor); got != c.want {
			t.Errorf("at +%v: %v, want %v", c.at, got, c.want)
		}
	}
	if got := Choose((RedisClock{}).Estimate(t0), lease, margin, static, floor); got != floor {
		t.Errorf("without a reading: %v, want the floor", got)
	}
	if got := Choose(50*sec, StaticLease{}, margin, static, floor); got != floor {
		t.Errorf("without a lease: %v, want the floor", got)
	}
}

// partitionConfig has a write class with the given partition_share (nil:
// left out, on_failure local).
func partitionConfig(t *testing.T, w [3]float64, share string, unit int) *config.Config {
	t.Helper()
	ps := ""
	if share != "" {
		ps = ", partition_share: " + share
	}
	y := fmt.Sprintf(`
regions: {ap: {weight: %g}, eu: {weight: %g}, us: {weight: %g}}
classes: {write: {mode: lease, max_cost: %d%s}}
tiers: {free: {write: {rate: 100/s, burst: 100}}}
default_tier: free
`, w[0], w[1], w[2], unit, ps)
	c, err := config.Parse([]byte(y))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return c
}

// TestChainFloorIsTheSmallestAndLeasedPicks: the floor is partition_share
// of the static share (burst rounded down to whole units), the smallest
// among the chain's configs; Leased picks the static share while on lease,
// else the floor; a class left without partition_share (on_failure local)
// has floor 0.
func TestChainFloorIsTheSmallestAndLeasedPicks(t *testing.T) {
	half := partitionConfig(t, [3]float64{1, 1, 2}, "0.5", 3) // eu: 25/s, burst 24 (whole units of 3)
	quarter := partitionConfig(t, [3]float64{1, 1, 2}, "0.25", 3)
	c := NewChain(1, half)
	res, err := half.Resolve(chainKey)
	if err != nil {
		t.Fatal(err)
	}
	sr, sb, _ := c.Share("eu", chainKey, half, res)
	r, b, err := c.Floor("eu", chainKey, half, res)
	if err != nil || r != sr/2 || b != math.Floor(sb/2/3)*3 {
		t.Fatalf("floor %v/%v (%v), want half of %v/%v with the burst in whole units of 3", r, b, err, sr, sb)
	}
	c = c.Adopt(2, quarter)
	if r2, _, _ := c.Floor("eu", chainKey, half, res); r2 != sr/4 {
		t.Fatalf("floor %v under a chain holding partition_share 0.25, want %v", r2, sr/4)
	}
	lease := StaticLease{UntilUS: 100 * sec}
	if r, _, _ := c.Leased("eu", chainKey, half, res, 10*sec, lease, time.Second); r != sr {
		t.Errorf("on lease: rate %v, want the static share %v", r, sr)
	}
	if r, _, _ := c.Leased("eu", chainKey, half, res, 99*sec, lease, time.Second); r != sr/4 {
		t.Errorf("lease ending within the margin: rate %v, want the floor %v", r, sr/4)
	}
	local := partitionConfig(t, [3]float64{1, 1, 2}, "", 1)
	lres, _ := local.Resolve(chainKey)
	if r, b, _ := NewChain(1, local).Floor("eu", chainKey, local, lres); r != 0 || b != 0 {
		t.Errorf("on_failure local without partition_share: floor %v/%v, want 0", r, b)
	}
	if f := FloorOf(Share{Rate: sr, Burst: sb}, res); f.Rate != sr/2 || f.Burst != math.Floor(sb/2/3)*3 {
		t.Errorf("FloorOf %v, want the config's floor", f)
	}
}

// TestLeaderCarriesTheStaticLease: the leader's reports carry the lease's
// remaining validity; answers and the etcd rule say when it grew (to be
// stored); a new leadership holds only what it loads from Redis.
func TestLeaderCarriesTheStaticLease(t *testing.T) {
	l := NewLeader()
	read := []KeyRead{{Key: keyA, State: luascripts.State{NowUS: 10 * sec}}}
	if rep, _ := l.Report("eu", 10*sec, time.Second, Epoch, read); rep.GetStaticValidMs() != 0 {
		t.Fatalf("a leader with no lease reports %d ms", rep.GetStaticValidMs())
	}
	grew, err := l.StaticAnswered(conferred(60_000), 10*sec)
	if !grew || err != nil {
		t.Fatalf("conferral: grew %v, %v", grew, err)
	}
	if grew, _ := l.StaticAnswered(conferred(60_000), 5*sec); grew {
		t.Fatalf("an older answer grew the lease")
	}
	if rep, _ := l.Report("eu", 20*sec, time.Second, Epoch, read); rep.GetStaticValidMs() != 50_000 {
		t.Fatalf("static_valid_ms %d, want 50000", rep.GetStaticValidMs())
	}
	if !l.NoGlobalLeader(30*sec, 31*sec, time.Minute) || l.Static().UntilUS != 90*sec {
		t.Fatalf("etcd rule: lease %+v, want until 90 s", l.Static())
	}
	l.Elected()
	if l.Static().UntilUS != 0 {
		t.Fatalf("a new leadership kept the old lease %+v before loading it", l.Static())
	}
	l.Load(StaticLease{UntilUS: 90 * sec})
	l.Load(StaticLease{UntilUS: 40 * sec})
	if l.Static().UntilUS != 90*sec {
		t.Fatalf("loaded lease %+v, want the longer, 90 s", l.Static())
	}
}

// TestStaticLeaseAtItsBounds: the lease's arithmetic at its exact edges.
// The largest static_lease_ms (MaxWireMillis) is accepted, as is a lease
// ending exactly at the largest Redis time; one microsecond further would
// overflow and is refused. The etcd rule extends a lease still running at
// the read's answer even when the read took no time (answered at the
// instant it was sent), and never one ending at that instant.
func TestStaticLeaseAtItsBounds(t *testing.T) {
	s := StaticLease{UntilUS: 50 * sec}
	edge := int64(math.MaxInt64) - MaxWireMillis*1000
	for _, c := range []struct {
		name  string
		ms    int64
		send  int64
		until int64 // 0: refused, the lease unchanged
	}{
		{"one millisecond", 1, 60 * sec, 60*sec + 1000},
		{"the largest static_lease_ms", MaxWireMillis, 10 * sec, 10*sec + MaxWireMillis*1000},
		{"ending at the largest Redis time", MaxWireMillis, edge, math.MaxInt64},
		{"one microsecond past it", MaxWireMillis, edge + 1, 0},
		{"one second ending at the largest Redis time", 1000, math.MaxInt64 - sec, math.MaxInt64},
		{"one second ending past it", 1000, math.MaxInt64 - sec + 1, 0},
	} {
		got, err := s.Answered(conferred(c.ms), c.send)
		switch {
		case c.until == 0 && (err == nil || got != s):
			t.Errorf("%s: lease %+v, err %v; want refused and unchanged", c.name, got, err)
		case c.until != 0 && (err != nil || got.UntilUS != c.until):
			t.Errorf("%s: lease %+v, err %v; want until %d", c.name, got, err, c.until)
		}
	}
	const lease = time.Minute
	running := StaticLease{UntilUS: 30 * sec}
	for _, c := range []struct {
		name     string
		from, to int64
		until    int64
	}{
		{"a read that took no time", 20 * sec, 20 * sec, 80 * sec},
		{"answered one microsecond before the end", 29 * sec, 30*sec - 1, 89 * sec},
		{"answered at the end", 29 * sec, 30 * sec, 30 * sec},
		{"answered one microsecond after the end", 29 * sec, 30*sec + 1, 30 * sec},
		{"answered one microsecond before it was sent", 20 * sec, 20*sec - 1, 30 * sec},
	} {
		if got := running.NoGlobalLeader(c.from, c.to, lease); got.UntilUS != c.until {
			t.Errorf("%s: lease until %d, want %d", c.name, got.UntilUS, c.until)
		}
	}
}

// TestUnresolvedCountsAsNothing: a config under which a key does not
// resolve, that lacks the region, or that is absent gives the region a
// static share and a floor of 0 for it, and a chain holding such a config
// runs the key on 0; a region the serving config lacks is an error that
// gives nothing.
func TestUnresolvedCountsAsNothing(t *testing.T) {
	cfg := partitionConfig(t, [3]float64{1, 1, 2}, "0.5", 1)
	other := quota.Key{Tenant: "acme", Class: "unknown"}
	for _, c := range []struct {
		name   string
		cfg    *config.Config
		region string
		k      quota.Key
	}{
		{"no config", nil, "eu", chainKey},
		{"a region not configured", cfg, "mars", chainKey},
		{"a class not configured", cfg, "eu", other},
	} {
		if r, b := ShareUnder(c.cfg, c.region, c.k); r != 0 || b != 0 {
			t.Errorf("%s: share %v/%v, want 0", c.name, r, b)
		}
		if r, b := FloorUnder(c.cfg, c.region, c.k); r != 0 || b != 0 {
			t.Errorf("%s: floor %v/%v, want 0", c.name, r, b)
		}
	}
	res, err := cfg.Resolve(chainKey)
	if err != nil {
		t.Fatal(err)
	}
	wr, wb, _ := cfg.FloorOf("eu", res)
	if r, b := FloorUnder(cfg, "eu", chainKey); r != wr || b != wb || r < 12 || b != 12 {
		t.Fatalf("eu's floor %v/%v, want the config's %v/%v (about half of 25/25)", r, b, wr, wb)
	}
	for _, c := range []struct {
		name  string
		chain Chain
	}{
		{"a chain holding no config", NewChain(1, nil).Adopt(2, cfg)},
		{"a chain holding a config without the class", NewChain(1, config.Default()).Adopt(2, cfg)},
	} {
		if r, b, err := c.chain.Floor("eu", chainKey, cfg, res); err != nil || r != 0 || b != 0 {
			t.Errorf("%s: floor %v/%v (%v), want 0", c.name, r, b, err)
		}
		if r, b, err := c.chain.Share("eu", chainKey, cfg, res); err != nil || r != 0 || b != 0 {
			t.Errorf("%s: share %v/%v (%v), want 0", c.name, r, b, err)
		}
	}
	c := NewChain(1, cfg)
	if r, b, err := c.Floor("mars", chainKey, cfg, res); err == nil || r != 0 || b != 0 {
		t.Errorf("floor of an unconfigured region %v/%v (%v), want 0 and an error", r, b, err)
	}
	if r, b, err := c.Leased("mars", chainKey, cfg, res, 0, StaticLease{UntilUS: 100 * sec}, time.Second); err == nil || r != 0 || b != 0 {
		t.Errorf("leased share of an unconfigured region %v/%v (%v), want 0 and an error", r, b, err)
	}
}

// TestScriptDeadlineIsTheLeaseEndOfAStaticChoice: a script handed the
// static share (its estimate a margin before the lease's end) must run by
// the lease's end; one handed the floor (within the margin, past the end,
// no lease) has no deadline.
func TestScriptDeadlineIsTheLeaseEndOfAStaticChoice(t *testing.T) {
	lease := StaticLease{UntilUS: 10_000_000}
	const margin = time.Second
	for _, tc := range []struct {
		estUS int64
		lease StaticLease
		want  int64
	}{
		{8_999_999, lease, 10_000_000},
		{9_000_000, lease, 0},
		{10_000_000, lease, 0},
		{1, StaticLease{}, 0},
	} {
		if got := ScriptDeadline(tc.estUS, tc.lease, margin); got != tc.want {
			t.Errorf("ScriptDeadline(%d, %+v, %v) = %d, want %d", tc.estUS, tc.lease, margin, got, tc.want)
		}
	}
}

// TestStaticMarginIsOneEpoch: a replica hands its scripts the floor from
// one epoch before its static lease ends: its static share while its
// estimate of Redis time is more than one epoch before the end, its floor
// from exactly one epoch before it.
func TestStaticMarginIsOneEpoch(t *testing.T) {
	const epoch = 2 * time.Second
	if m := StaticMargin(epoch); m != epoch {
		t.Fatalf("StaticMargin(%v) = %v, want one epoch", epoch, m)
	}
	lease := StaticLease{UntilUS: 100 * sec}
	static, floor := Share{Rate: 10, Burst: 20}, Share{Rate: 1, Burst: 2}
	end := lease.UntilUS - epoch.Microseconds()
	for _, c := range []struct {
		estUS int64
		want  Share
	}{{end - 1, static}, {end, floor}, {lease.UntilUS - 1, floor}} {
		if got := Choose(c.estUS, lease, StaticMargin(epoch), static, floor); got != c.want {
			t.Errorf("estimate %d µs, lease until %d µs: %+v, want %+v", c.estUS, lease.UntilUS, got, c.want)
		}
	}
}
