package regional

import (
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/regionsync"
)

// euWriteConfig is one region, eu, with one lease class at 100/s, and
// extra (YAML lines) before it.
func euWriteConfig(t *testing.T, extra string) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(extra + `
regions: {eu: {weight: 1}}
classes: {write: {mode: lease}}
tiers: {free: {write: {rate: 100/s, burst: 100}}}
default_tier: free
`))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestStaticViewOnlyMovesForward: a replica's view of the static lease
// keeps the newest Redis TIME reading (by when it was sent): an older
// reading that arrives late, or none (a leader's own update), leaves it;
// and each shard's lease end only grows.
func TestStaticViewOnlyMovesForward(t *testing.T) {
	cfg := euWriteConfig(t, "")
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer rdb.Close()
	s, err := New(Options{Region: "eu", Redis: rdb, Config: StaticConfig{C: cfg}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sent := time.Now()
	newer := regionsync.RedisClock{RedisUS: 2_000_000, Sent: sent}
	older := regionsync.RedisClock{RedisUS: 1_000_000, Sent: sent.Add(-time.Millisecond)}
	s.noteStatic(regionsync.ShardLeases{{UntilUS: 9_000_000}}, nil, newer)
	s.noteStatic(regionsync.ShardLeases{{UntilUS: 5_000_000}}, nil, older)
	s.noteStatic(nil, nil, regionsync.RedisClock{})
	v := s.static.Load()
	if v.clock != newer {
		t.Fatalf("clock %+v, want the newest reading %+v", v.clock, newer)
	}
	if got := v.leases.Of(0).UntilUS; got != 9_000_000 {
		t.Fatalf("lease end %d, want the later 9000000", got)
	}
	// A reading sent at the same instant replaces it (a later read of the
	// same send time is no older).
	same := regionsync.RedisClock{RedisUS: 2_500_000, Sent: sent}
	s.noteStatic(nil, nil, same)
	if v := s.static.Load(); v.clock != same {
		t.Fatalf("clock %+v, want %+v", v.clock, same)
	}
}

// TestOnStaticNeedsEveryShardsLeaseAMarginAhead pins what the on-floor and
// static-lease gauges read: the replica is on static shares only while
// its estimate of Redis time plus the margin (one epoch) is before the end
// of every shard's lease, and what remains is the least of the shards'
// leases on that estimate, 0 once one has ended.
func TestOnStaticNeedsEveryShardsLeaseAMarginAhead(t *testing.T) {
	cfg := euWriteConfig(t, "epoch: 100ms\nglobal_shards: 2\n")
	const readUS = 10_000_000 // Redis time of the replica's reading
	margin := regionsync.StaticMargin(time.Duration(cfg.Epoch))
	sec := time.Second.Microseconds()
	for _, tc := range []struct {
		name     string
		unleased bool
		ends     [2]int64      // each shard's lease end, Redis µs
		after    time.Duration // local time since the reading was sent
		on       bool
		left     time.Duration
	}{
		{name: "both leases ahead: the shorter remains", ends: [2]int64{readUS + 5*sec, readUS + 3*sec}, on: true, left: 3 * time.Second},
		{name: "the estimate moves with local time", ends: [2]int64{readUS + 5*sec, readUS + 3*sec}, after: time.Second, on: true, left: 2 * time.Second},
		{name: "shard 0 the shorter", ends: [2]int64{readUS + 2*sec, readUS + 3*sec}, on: true, left: 2 * time.Second},
		{name: "one microsecond more than the margin", ends: [2]int64{readUS + 5*sec, readUS + 3*sec}, after: 3*time.Second - margin - time.Microsecond, on: true, left: margin + time.Microsecond},
		{name: "exactly the margin left is the floor", ends: [2]int64{readUS + 5*sec, readUS + 3*sec}, after: 3*time.Second - margin, on: false, left: margin},
		{name: "a lease at its end leaves nothing", ends: [2]int64{readUS + 5*sec, readUS + 3*sec}, after: 3 * time.Second, on: false, left: 0},
		{name: "a lease past its end leaves nothing", ends: [2]int64{readUS + 5*sec, readUS + 3*sec}, after: 4 * time.Second, on: false, left: 0},
		{name: "shard 0 lapsed, shard 1 running", ends: [2]int64{readUS - sec, readUS + 3*sec}, on: false, left: 0},
		{name: "shard 1 never leased", ends: [2]int64{readUS + 3*sec, 0}, on: false, left: 0},
		{name: "unleased runs static shares with no end", unleased: true, ends: [2]int64{0, 0}, on: true, left: time.Duration(math.MaxInt64)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
			defer rdb.Close()
			s, err := New(Options{Region: "eu", Redis: rdb, Config: StaticConfig{C: cfg}, Unleased: tc.unleased})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			sent := time.Now()
			s.noteStatic(regionsync.ShardLeases{{UntilUS: tc.ends[0]}, {UntilUS: tc.ends[1]}}, nil,
				regionsync.RedisClock{RedisUS: readUS, Sent: sent})
			on, left := s.onStatic(sent.Add(tc.after))
			if on != tc.on || left != tc.left {
				t.Fatalf("onStatic %v after the reading = (%v, %v), want (%v, %v)", tc.after, on, left, tc.on, tc.left)
			}
		})
	}
}

// TestStaticViewNoticesALeaseComeBack: the view raises a shard's rise to
// its estimate of Redis time when a lease it held ended at that estimate
// and the update runs one, whether the update is a reading or the
// leader's own (no clock); not on its first reading, not on an extension
// of a running lease, not for a shard it never held a lease of; and a
// stored rise read only ever raises it.
func TestStaticViewNoticesALeaseComeBack(t *testing.T) {
	cfg := euWriteConfig(t, "global_shards: 3\n")
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer rdb.Close()
	s, err := New(Options{Region: "eu", Redis: rdb, Config: StaticConfig{C: cfg}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const readUS = 10_000_000
	sent := time.Now()
	at := regionsync.RedisClock{RedisUS: readUS, Sent: sent}
	// The first reading: shard 0 ended a grant validity ago (the global
	// tier may count it at its floor since), shard 1 running, shard 2
	// none; the stored rise of shard 1 is read as is.
	validity := time.Duration(cfg.GrantValidity).Microseconds()
	s.noteStatic(regionsync.ShardLeases{{UntilUS: readUS - validity - 5}, {UntilUS: readUS + 1_000_000}, {}}, regionsync.ShardRises{0, 7}, at)
	if got := s.static.Load().rises; got.Of(0) != 0 || got.Of(1) != 7 || got.Of(2) != 0 {
		t.Fatalf("first reading: rises %v, want only the stored 7 of shard 1", got)
	}
	// The leader's answer: shard 0 back, shard 1 extended, shard 2 its
	// first lease.
	far := int64(readUS + 60_000_000)
	s.noteStatic(regionsync.ShardLeases{{UntilUS: far}, {UntilUS: far}, {UntilUS: far}}, nil, regionsync.RedisClock{})
	v := s.static.Load()
	est := v.clock.Estimate(time.Now())
	if r := v.rises.Of(0); r < readUS || r > est {
		t.Fatalf("shard 0 came back: rise %d, want the estimate then, in [%d, %d]", r, readUS, est)
	}
	if v.rises.Of(1) != 7 || v.rises.Of(2) != 0 {
		t.Fatalf("an extension or a first lease moved a rise: %v", v.rises)
	}
	// A later reading: the stored rise only raises the view's.
	r0 := v.rises.Of(0)
	s.noteStatic(nil, regionsync.ShardRises{r0 - 1, 9}, regionsync.RedisClock{RedisUS: readUS + 10, Sent: time.Now()})
	if got := s.static.Load().rises; got.Of(0) != r0 || got.Of(1) != 9 {
		t.Fatalf("rises %v after reading %d and 9, want %d and 9", got, r0-1, r0)
	}
}
