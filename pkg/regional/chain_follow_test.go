package regional

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestReplicaAppliesTheStoredConfirmedRevision: a replica reads the
// confirmed revision the region leader stored in the region's Redis every
// epoch and applies it to its chain: the configs older than it are
// dropped, the later ones kept, and a later confirmation moves it on.
func TestReplicaAppliesTheStoredConfirmedRevision(t *testing.T) {
	parse := func(eu int) *config.Config { return euWeighted(t, "epoch: 50ms", eu) }
	src := configtest.NewSource(parse(1), 10)
	rdb := redistest.Start(t).Client()
	s, err := New(Options{Region: "eu", Redis: rdb, Config: src, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	src.Set(parse(2), 20)
	s.staticChain()
	src.Set(parse(3), 30)
	s.staticChain()
	if c := s.chain.Load(); c.Confirmed() != 10 || c.Len() != 3 {
		t.Fatalf("chain confirmed %d holding %d configs, want 10 holding 3", c.Confirmed(), c.Len())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.followConfirmations(ctx) }()
	defer func() { cancel(); <-done }()

	epoch := time.Duration(src.Current().Epoch)
	for _, step := range []struct {
		rev  int64
		left int // configs the chain holds once rev is applied
	}{{20, 2}, {30, 1}} {
		if err := rdb.Set(ctx, s.confirmedKey(), strconv.FormatInt(step.rev, 10), 0).Err(); err != nil {
			t.Fatal(err)
		}
		// One read per epoch; many epochs allowed for a starved machine.
		deadline := time.Now().Add(200 * epoch)
		for s.chain.Load().Confirmed() != step.rev {
			if time.Now().After(deadline) {
				t.Fatalf("revision %d stored as confirmed; the replica's chain still confirms %d after %v",
					step.rev, s.chain.Load().Confirmed(), 200*epoch)
			}
			time.Sleep(epoch / 10) // polling with a deadline
		}
		if got := s.chain.Load().Len(); got != step.left {
			t.Fatalf("chain holds %d configs once %d is confirmed, want %d", got, step.rev, step.left)
		}
	}
}

// TestIdleReplicaAppliesAConfirmationOfAConfigItNeverServed: a replica
// that served no request since its config source moved on (so it never
// adopted the new config on a request) still applies the confirmation of
// that revision once the leader stores it, so its first request runs the
// new, confirmed config's share rather than the smaller of old and new.
func TestIdleReplicaAppliesAConfirmationOfAConfigItNeverServed(t *testing.T) {
	parse := func(rate int) *config.Config {
		c, err := config.Parse(fmt.Appendf(nil, `
epoch: 50ms
regions: {eu: {weight: 1}, us: {weight: 1}}
classes: {write: {mode: lease}}
tiers: {free: {write: {rate: %d/s, burst: %d}}}
default_tier: free
`, rate, rate))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	src := configtest.NewSource(parse(6), 10)
	rdb := redistest.Start(t).Client()
	s, err := New(Options{Region: "eu", Redis: rdb, Config: src, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.staticChain()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.followConfirmations(ctx) }()
	defer func() { cancel(); <-done }()

	src.Set(parse(20), 20) // a raise, served by no request of this replica
	if err := rdb.Set(ctx, s.confirmedKey(), "20", 0).Err(); err != nil {
		t.Fatal(err)
	}
	epoch := time.Duration(src.Current().Epoch)
	deadline := time.Now().Add(200 * epoch) // one read per epoch; many allowed for a starved machine
	for s.chain.Load().Confirmed() != 20 {
		if time.Now().After(deadline) {
			t.Fatalf("revision 20 stored as confirmed; the idle replica's chain still confirms %d after %v",
				s.chain.Load().Confirmed(), 200*epoch)
		}
		time.Sleep(epoch / 10) // polling with a deadline
	}
	cfg := src.Current()
	res, err := cfg.Resolve(quota.Key{Tenant: "acme", Class: "write"})
	if err != nil {
		t.Fatal(err)
	}
	wantRate, wantBurst, err := cfg.StaticShareOf("eu", res)
	if err != nil || wantRate < 9 {
		t.Fatalf("the raised config's share %v/s (%v); want about 10/s", wantRate, err)
	}
	rate, burst, err := s.staticChain().Share("eu", quota.Key{Tenant: "acme", Class: "write"}, cfg, res)
	if err != nil || rate != wantRate || burst != wantBurst {
		t.Fatalf("first request's share %v/s, burst %v (%v); want the raised config's %v/s, burst %v", rate, burst, err, wantRate, wantBurst)
	}
}

// euWeighted is a config of regions eu (weight eu) and us (weight 1)
// sharing one class at 100/s, burst 100, with extra (YAML lines) on top.
func euWeighted(t *testing.T, extra string, eu int) *config.Config {
	t.Helper()
	c, err := config.Parse(fmt.Appendf(nil, `%s
regions: {eu: {weight: %d}, us: {weight: 1}}
classes: {write: {mode: lease}}
tiers: {free: {write: {rate: 100/s, burst: 100}}}
default_tier: free
`, extra, eu))
	if err != nil {
		t.Fatal(err)
	}
	return c
}
