package lease

import (
	"context"
	"errors"
	"log/slog"
	"regexp"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/pkg/quota"
)

// TestClientOptionsDefaults: every option left zero gets its default (the
// Sync timeout half the refresh, whatever the refresh), and every option
// set is kept as given, the smallest positive values included.
func TestClientOptionsDefaults(t *testing.T) {
	o, err := Options{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^inst-[0-9a-f]{16}$`).MatchString(o.InstanceID) {
		t.Errorf("default instance id %q, want inst- and 16 hex digits", o.InstanceID)
	}
	if o.Refresh != DefaultRefresh || o.BreakerTimeout != DefaultBreakerTimeout || o.BreakerCooldown != DefaultBreakerCooldown ||
		o.SyncTimeout != DefaultSyncTimeout(DefaultRefresh) || o.IdleTimeout != 0 || o.BreakerFailures != DefaultBreakerFailures || o.Logger == nil {
		t.Errorf("defaults %+v", o)
	}
	if o.Logger != slog.Default() {
		t.Errorf("default logger %v, want slog.Default(): the lines operators search for must reach the process's log", o.Logger)
	}
	if o, _ := (Options{Refresh: 300 * time.Millisecond}).withDefaults(); o.SyncTimeout != 150*time.Millisecond {
		t.Errorf("refresh 300ms: sync timeout %v, want 150ms", o.SyncTimeout)
	}

	for _, v := range []time.Duration{time.Nanosecond, 7 * time.Second} {
		refresh := max(v, quota.MinRefresh)
		set := Options{
			InstanceID: "given", Refresh: refresh, BreakerTimeout: v, BreakerCooldown: v, SyncTimeout: v, IdleTimeout: v,
			BreakerFailures: 1,
		}
		o, err := set.withDefaults()
		if err != nil {
			t.Fatalf("options %+v: %v", set, err)
		}
		if o.InstanceID != "given" || o.Refresh != refresh || o.BreakerTimeout != v || o.BreakerCooldown != v || o.SyncTimeout != v ||
			o.IdleTimeout != v || o.BreakerFailures != 1 {
			t.Errorf("set to %v and 1 failure: got %+v", v, o)
		}
	}
}

// TestClientOptionsInvalid: a negative duration or failure count, a
// refresh below quota.MinRefresh (the background Sync would run in a busy
// loop, each call timing out at half of it), or an instance id the region
// would refuse, is invalid input, as is a nil connection.
func TestClientOptionsInvalid(t *testing.T) {
	for name, o := range map[string]Options{
		"Refresh":                   {Refresh: -time.Nanosecond},
		"Refresh below the minimum": {Refresh: quota.MinRefresh - time.Nanosecond},
		"BreakerTimeout":            {BreakerTimeout: -time.Nanosecond},
		"BreakerCooldown":           {BreakerCooldown: -time.Nanosecond},
		"SyncTimeout":               {SyncTimeout: -time.Nanosecond},
		"IdleTimeout":               {IdleTimeout: -time.Nanosecond},
		"BreakerFailures":           {BreakerFailures: -1},
		"InstanceID":                {InstanceID: "bad id"},
	} {
		if _, err := o.withDefaults(); !errors.Is(err, quota.ErrInvalid) {
			t.Errorf("%s %+v: err %v, want quota.ErrInvalid", name, o, err)
		}
	}
	if _, err := NewClient(nil, Options{}); !errors.Is(err, quota.ErrInvalid) {
		t.Errorf("nil connection: err %v, want quota.ErrInvalid", err)
	}
}

// TestNewClientRefusesWhatItCannotRun: NewClient fails, starting nothing,
// on invalid options, on classes or a fallback limit its table refuses,
// and on metrics that another client registered already. (The connection
// is never used: the client fails before it would send anything, or holds
// no key.)
func TestNewClientRefusesWhatItCannotRun(t *testing.T) {
	conn, err := grpc.NewClient("passthrough:///unused", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	for name, o := range map[string]Options{
		"negative refresh":      {Refresh: -time.Second},
		"bad instance id":       {InstanceID: "bad id"},
		"negative failures":     {BreakerFailures: -1},
		"bad class":             {Classes: map[string]ClassPolicy{"bad class": {}}},
		"fallback without rate": {FallbackLimit: quota.Limit{Burst: 3}},
	} {
		c, err := NewClient(conn, o)
		if !errors.Is(err, quota.ErrInvalid) {
			t.Errorf("%s: err %v, want quota.ErrInvalid", name, err)
		}
		if c != nil {
			t.Errorf("%s: a client was started", name)
			c.Close(context.Background())
		}
	}

	reg := prometheus.NewRegistry()
	first, err := NewClient(conn, Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { first.Close(context.Background()) })
	if c, err := NewClient(conn, Options{Registerer: reg}); err == nil {
		c.Close(context.Background())
		t.Fatal("a second client registered the same metrics")
	}
}
