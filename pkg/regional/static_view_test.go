package regional

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/regionsync"
)

// TestStaticViewOnlyMovesForward: a replica's view of the static lease
// keeps the newest Redis TIME reading (by when it was sent): an older
// reading that arrives late, or none (a leader's own update), leaves it;
// and each shard's lease end only grows.
func TestStaticViewOnlyMovesForward(t *testing.T) {
	cfg, err := config.Parse([]byte(`
regions: {eu: {weight: 1}}
classes: {write: {mode: lease}}
tiers: {free: {write: {rate: 100/s, burst: 100}}}
default_tier: free
`))
	if err != nil {
		t.Fatal(err)
	}
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
	s.noteStatic(regionsync.ShardLeases{{UntilUS: 9_000_000}}, newer)
	s.noteStatic(regionsync.ShardLeases{{UntilUS: 5_000_000}}, older)
	s.noteStatic(nil, regionsync.RedisClock{})
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
	s.noteStatic(nil, same)
	if v := s.static.Load(); v.clock != same {
		t.Fatalf("clock %+v, want %+v", v.clock, same)
	}
}
