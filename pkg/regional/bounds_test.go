package regional_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestEachBoundTakesItsEdgeAndRefusesOnePast: every number a LeaseService
// request carries is served exactly at its bound (a seq of 2^53, a lease
// equal to its seq, cumulative totals of 2^53, min equal to want or to
// the key's burst, want at MaxWant, a min with no want, a cost equal to
// the burst, a Sync of
// exactly reports_per_sync reports) and refused one past it with
// InvalidArgument naming the field, Redis left as it was.
func TestEachBoundTakesItsEdgeAndRefusesOnePast(t *testing.T) {
	const perSync = 3
	reg := regiontest.Start(t, regiontest.MustConfig(t, oneRegion), "local",
		func(o *regional.Options) { o.MaxKeysPerSync = perSync })
	client := sluicev1.NewLeaseServiceClient(reg.Dial(t))
	ctx := context.Background()
	const top = 1 << 53
	acquire := func(instance string, r *sluicev1.KeyReport) func() error {
		return func() error {
			if r.Key == nil {
				r.Key = qk("acme", "read")
			}
			_, err := client.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: instance, Report: r})
			return err
		}
	}
	check := func(cost int64) func() error {
		return func() error {
			_, err := client.Check(ctx, &sluicev1.CheckRequest{Key: qk("acme", "export"), Cost: cost})
			return err
		}
	}
	syncOf := func(instance string, n int) func() error {
		return func() error {
			req := &sluicev1.SyncRequest{InstanceId: instance}
			for i := range n {
				req.Reports = append(req.Reports, &sluicev1.KeyReport{Key: qk(fmt.Sprintf("t%d", i), "read"), Seq: 1, Want: 1})
			}
			_, err := client.Sync(ctx, req)
			return err
		}
	}
	release := func(instance string, r *sluicev1.KeyReport) func() error {
		return func() error {
			r.Key = qk("acme", "read")
			_, err := client.Release(ctx, &sluicev1.ReleaseRequest{InstanceId: instance, Reports: []*sluicev1.KeyReport{r}})
			return err
		}
	}

	// Served at the bound. Each case runs under its own instance, so no
	// case's lease record meets another's.
	served := []struct {
		name string
		call func() error
	}{
		{"seq 2^53", acquire("e1", &sluicev1.KeyReport{Seq: top, Want: 1})},
		{"lease equal to its seq", acquire("e2", &sluicev1.KeyReport{Seq: 7, Lease: 7, Want: 1})},
		{"used 2^53", acquire("e3", &sluicev1.KeyReport{Seq: 1, Used: top})},
		{"denied 2^53", acquire("e4", &sluicev1.KeyReport{Seq: 1, Denied: top})},
		{"returned 2^53", release("e5", &sluicev1.KeyReport{Seq: 1, Returned: top})},
		{"built_us 2^53", acquire("e6", &sluicev1.KeyReport{Seq: 1, BuiltUs: top, Want: 1})},
		{"min equal to want", acquire("e7", &sluicev1.KeyReport{Seq: 1, Want: 5, Min: 5})},
		{"want at MaxWant, min at the key's burst", acquire("e8", &sluicev1.KeyReport{Seq: 1, Want: quota.MaxWant, Min: 100})},
		{"min without want", acquire("e9", &sluicev1.KeyReport{Seq: 1, Want: 0, Min: 5})},
		{"cost equal to the burst", check(20)},
		{"reports_per_sync reports", syncOf("e10", perSync)},
	}
	for _, tc := range served {
		if err := tc.call(); err != nil {
			t.Errorf("%s: %v, want it served", tc.name, err)
		}
	}

	before := dump(t, reg)
	refused := []struct {
		name    string
		call    func() error
		message string
	}{
		{"seq 2^53+1", acquire("r1", &sluicev1.KeyReport{Seq: top + 1, Want: 1}), "report.seq 9007199254740993 exceeds 2^53"},
		{"lease one above its seq", acquire("r2", &sluicev1.KeyReport{Seq: 7, Lease: 8, Want: 1}), "report.lease 8 is above its seq 7"},
		{"min one above the key's burst", acquire("r2b", &sluicev1.KeyReport{Seq: 1, Want: 101, Min: 101}), "report.min: cost 101 exceeds the burst 100 of acme/read"},
		{"used 2^53+1", acquire("r3", &sluicev1.KeyReport{Seq: 1, Used: top + 1}), "report.used 9007199254740993 exceeds the maximum 9007199254740992"},
		{"denied 2^53+1", acquire("r4", &sluicev1.KeyReport{Seq: 1, Denied: top + 1}), "report.denied 9007199254740993 exceeds the maximum"},
		{"returned 2^53+1", release("r5", &sluicev1.KeyReport{Seq: 1, Returned: top + 1}), "reports[0].returned 9007199254740993 exceeds the maximum"},
		{"built_us 2^53+1", acquire("r6", &sluicev1.KeyReport{Seq: 1, BuiltUs: top + 1}), "report.built_us 9007199254740993 exceeds the maximum"},
		{"denied -1", acquire("r7", &sluicev1.KeyReport{Seq: 1, Denied: -1}), "report.denied -1 is negative"},
		{"built_us -1", acquire("r8", &sluicev1.KeyReport{Seq: 1, BuiltUs: -1}), "report.built_us -1 is negative"},
		{"min -1", acquire("r9", &sluicev1.KeyReport{Seq: 1, Min: -1}), "report.min -1 is negative"},
		{"min one above MaxWant", acquire("r10", &sluicev1.KeyReport{Seq: 1, Want: quota.MaxWant, Min: quota.MaxWant + 1}), "report.min 1073741825 exceeds the maximum 1073741824"},
		{"min one above want", acquire("r11", &sluicev1.KeyReport{Seq: 1, Want: 5, Min: 6}), "report.min 6 exceeds want 5"},
		{"min one above the least want", acquire("r13", &sluicev1.KeyReport{Seq: 1, Want: 1, Min: 2}), "report.min 2 exceeds want 1"},
		{"cost one above the burst", check(21), "cost 21 exceeds the burst 20"},
		{"one report over reports_per_sync", syncOf("r12", perSync+1), "4 reports exceed the bound reports_per_sync=3"},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			refusedChangingNothing(t, reg, before, tc.call(), tc.message)
		})
	}
}

// TestNewLeaderNeedsEveryRequiredOption: NewLeader refuses options that
// lack any one of Etcd, Global, ElectionPrefix and Identity, and takes
// them all.
func TestNewLeaderNeedsEveryRequiredOption(t *testing.T) {
	cfg := regiontest.MustConfig(t, oneRegion)
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer rdb.Close()
	srv, err := regional.New(regional.Options{Region: "local", Redis: rdb, Config: regional.StaticConfig{C: cfg}, Unleased: true})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	full := func() regional.LeaderOptions {
		return regional.LeaderOptions{Etcd: &clientv3.Client{}, ElectionPrefix: "/sl/election/",
			Global: serviceTier{}, Identity: "local-1"}
	}
	for _, c := range []struct {
		name string
		drop func(*regional.LeaderOptions)
	}{
		{"Etcd", func(o *regional.LeaderOptions) { o.Etcd = nil }},
		{"Global", func(o *regional.LeaderOptions) { o.Global = nil }},
		{"ElectionPrefix", func(o *regional.LeaderOptions) { o.ElectionPrefix = "" }},
		{"Identity", func(o *regional.LeaderOptions) { o.Identity = "" }},
	} {
		o := full()
		c.drop(&o)
		if _, err := regional.NewLeader(srv, o); err == nil {
			t.Errorf("NewLeader without %s: no error", c.name)
		}
	}
	if _, err := regional.NewLeader(srv, full()); err != nil {
		t.Fatalf("NewLeader with every required option: %v", err)
	}
}

// TestNewNeedsEveryRequiredOption: New refuses options without a Redis,
// without a config (or with a source holding none), with a region name
// that is not an id or not a region of the config, or with a negative
// ReapBudget; it takes the required options alone.
func TestNewNeedsEveryRequiredOption(t *testing.T) {
	cfg := regiontest.MustConfig(t, oneRegion)
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer rdb.Close()
	full := func() regional.Options {
		return regional.Options{Region: "local", Redis: rdb, Config: regional.StaticConfig{C: cfg}}
	}
	for _, c := range []struct {
		name string
		edit func(*regional.Options)
	}{
		{"no Redis", func(o *regional.Options) { o.Redis = nil }},
		{"no Config", func(o *regional.Options) { o.Config = nil }},
		{"a Config holding no config", func(o *regional.Options) { o.Config = regional.StaticConfig{} }},
		{"no Region", func(o *regional.Options) { o.Region = "" }},
		{"a Region not in the config", func(o *regional.Options) { o.Region = "mars" }},
		{"ReapBudget -1", func(o *regional.Options) { o.ReapBudget = -1 }},
	} {
		o := full()
		c.edit(&o)
		if srv, err := regional.New(o); err == nil {
			srv.Close()
			t.Errorf("New with %s: no error", c.name)
		}
	}
	srv, err := regional.New(full())
	if err != nil {
		t.Fatalf("New with the required options: %v", err)
	}
	srv.Close()
}

// TestAnotherProcessUnderTheSameInstanceIsAborted: a report under an
// instance id whose lease another process (another incarnation) holds is
// refused with Aborted by Acquire, Sync and Release alike.
func TestAnotherProcessUnderTheSameInstanceIsAborted(t *testing.T) {
	reg := regiontest.Start(t, regiontest.MustConfig(t, oneRegion), "local")
	client := sluicev1.NewLeaseServiceClient(reg.Dial(t))
	ctx := context.Background()
	for _, c := range []struct {
		name string
		call func(instance string) error
	}{
		{"Acquire", func(instance string) error {
			_, err := client.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: instance, Incarnation: 2,
				Report: &sluicev1.KeyReport{Key: qk("acme", "read"), Seq: 2, Lease: 1, Want: 1}})
			return err
		}},
		{"Sync", func(instance string) error {
			_, err := client.Sync(ctx, &sluicev1.SyncRequest{InstanceId: instance, Incarnation: 2,
				Reports: []*sluicev1.KeyReport{{Key: qk("acme", "read"), Seq: 2, Lease: 1, Want: 1}}})
			return err
		}},
		{"Release", func(instance string) error {
			_, err := client.Release(ctx, &sluicev1.ReleaseRequest{InstanceId: instance, Incarnation: 2,
				Reports: []*sluicev1.KeyReport{{Key: qk("acme", "read"), Seq: 2, Lease: 1}}})
			return err
		}},
	} {
		instance := "shared-" + c.name
		if _, err := client.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: instance, Incarnation: 1,
			Report: &sluicev1.KeyReport{Key: qk("acme", "read"), Seq: 1, Lease: 1, Want: 1}}); err != nil {
			t.Fatal(err)
		}
		if err := c.call(instance); status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "another process") {
			t.Errorf("%s by another process: %v, want Aborted", c.name, err)
		}
	}
}
