package regional_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
	"github.com/sluicehq/sluice/pkg/regional"
	"github.com/sluicehq/sluice/pkg/regionsync"
)

// TestIdleReplicaAdoptsWhatItsWatchDelivers: a replica that serves nothing
// adopts a config its watch delivers as it arrives, not at its next call
// or confirmation read (an epoch later): its chain, and what OnChain shows,
// follow etcd. Real etcd, a real configstore.Watcher, a real Redis; an
// hour-long epoch leaves the confirmation read out of it.
func TestIdleReplicaAdoptsWhatItsWatchDelivers(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	hourly := func(us float64) *config.Config {
		c := weightsConfig(t, 1, us)
		c.Epoch = config.Duration(time.Hour)
		c.GrantValidity = config.Duration(4 * time.Hour)
		c.RegionLease = config.Duration(8 * time.Hour)
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		return c
	}
	cli := etcdtest.Start(t).Client(t)
	store := configstore.NewStore(cli, "/adopt")
	first, err := store.Apply(ctx, hourly(1), 0)
	if err != nil {
		t.Fatal(err)
	}
	w := configstore.NewWatcher(store, nil, slog.New(slog.DiscardHandler), nil)
	wdone := make(chan struct{})
	go func() { defer close(wdone); _ = w.Run(ctx) }()
	defer func() { cancel(); <-wdone }()
	for w.Revision() != first {
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
	chains := make(chan regionsync.Chain, 64)
	srv, err := regional.New(regional.Options{Region: "us", Redis: redistest.Start(t).Client(), Config: w,
		OnChain: func(c regionsync.Chain) {
			select {
			case chains <- c:
			default:
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	rdone := make(chan struct{})
	go func() { defer close(rdone); _ = srv.Run(ctx, time.Hour) }()
	defer func() { cancel(); <-rdone }()

	second, err := store.Apply(ctx, hourly(3), first) // us 50/s → 25/s
	if err != nil {
		t.Fatal(err)
	}
	// Once the watch delivered it, the replica's chain follows well within
	// an epoch (the hour a confirmation read would take).
	for w.Revision() != second {
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
	bound := time.After(time.Hour / 60)
	for {
		select {
		case <-bound:
			t.Fatalf("revision %d delivered but not adopted within a sixtieth of an epoch", second)
		case c := <-chains:
			if c.Current().Rev == second {
				return
			}
		}
	}
}
