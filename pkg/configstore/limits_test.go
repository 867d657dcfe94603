package configstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/pkg/config"
)

// documentBytes is the size of cfg's document as the store writes it:
// everything but the tenants.
func documentBytes(t *testing.T, cfg *config.Config) int {
	t.Helper()
	base := *cfg
	base.Tenants = nil
	data, err := base.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return len(data)
}

// documentsNear returns configs whose documents are n+k bytes for any k
// in [0, 5]: the sample with 80 more classes and as many more tiers as
// fit, longer bursts, then a tier whose name is k bytes longer. The
// configs share all but their tier maps.
func documentsNear(t *testing.T, n int) func(k int) *config.Config {
	t.Helper()
	c := config.Default()
	var classes []string
	for i := range 80 {
		name := fmt.Sprintf("class-%044d", i)
		c.Classes[name] = c.Classes["read"]
		classes = append(classes, name)
	}
	for _, tier := range c.Tiers {
		for _, class := range classes {
			tier[class] = config.LimitSpec{Rate: 10, Burst: 20}
		}
	}
	addTier := func(name string) {
		tier := map[string]config.LimitSpec{}
		for class := range c.Classes {
			tier[class] = config.LimitSpec{Rate: 10, Burst: 20}
		}
		c.Tiers[name] = tier
	}
	// Tiers of a fixed-width name, all the same size, while two more fit.
	before := documentBytes(t, c)
	addTier("tier-0000")
	perTier := documentBytes(t, c) - before
	for i := 1; i < (n-before)/perTier-1; i++ {
		addTier(fmt.Sprintf("tier-%04d", i))
	}
	// Longer bursts in the added tiers, widen bytes each.
	wide := config.LimitSpec{Rate: 10, Burst: 999999}
	var spots [][2]string
	for _, tier := range slices.Sorted(maps.Keys(c.Tiers)) {
		for _, class := range slices.Sorted(maps.Keys(c.Classes)) {
			if tier != "free" && tier != "pro" {
				spots = append(spots, [2]string{tier, class})
			}
		}
	}
	before = documentBytes(t, c)
	c.Tiers[spots[0][0]][spots[0][1]] = wide
	widen := documentBytes(t, c) - before
	for _, s := range spots[1 : (n-before)/widen] {
		c.Tiers[s[0]][s[1]] = wide
	}
	// The last bytes: a longer name for tier-0000.
	gap := n - documentBytes(t, c)
	if gap < 0 || gap >= widen {
		t.Fatalf("document of %d bytes, %d short of %d", documentBytes(t, c), gap, n)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return func(k int) *config.Config {
		t.Helper()
		sized := *c
		sized.Tiers = maps.Clone(c.Tiers)
		delete(sized.Tiers, "tier-0000")
		sized.Tiers[fmt.Sprintf("tier-%0*d", 4+gap+k, 0)] = c.Tiers["tier-0000"]
		if got := documentBytes(t, &sized); got != n+k {
			t.Fatalf("document of %d bytes, want %d", got, n+k)
		}
		return &sized
	}
}

// TestStoreApplyAtTheDocumentAndTransactionLimits: a document of
// MaxDocumentBytes (1 MiB, as docs/operations.md documents it) is written
// and read back, one byte more is refused with a LimitError naming the
// limit and nothing is written; a change whose document and tenant keys
// reach 1 MiB is written through the applying marker (marker, batches,
// commit: one revision each), one byte less in one transaction.
func TestStoreApplyAtTheDocumentAndTransactionLimits(t *testing.T) {
	const mib = 1 << 20
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	store := NewStore(cli, "")
	ctx := testContext(t)
	sized := documentsNear(t, mib-1)

	_, err := store.Apply(ctx, sized(2), 0)
	var limit *config.LimitError
	if !errors.As(err, &limit) || limit.Limit != "configstore.MaxDocumentBytes" || limit.Got != mib+1 || limit.Max != mib ||
		!errors.Is(err, config.ErrInvalidConfig) {
		t.Fatalf("Apply of a document of 1 MiB + 1 byte: %v, want a LimitError of configstore.MaxDocumentBytes", err)
	}
	if all, _ := snapshot(t, cli, config.DefaultPrefix); all != "" {
		t.Fatalf("a refused apply wrote:\n%.500s", all)
	}

	// Every step changes the document or a tenant from the step before.
	var rev int64
	_, storeRev := snapshot(t, cli, config.DefaultPrefix)
	var last *config.Config
	for _, step := range []struct {
		name      string
		docBytes  int
		tenant    bool // the config lists tenant "beta" (a value longer than its key), else none
		revisions int64
	}{
		{"document of 1 MiB - 1 byte, no tenant key written", mib - 1, false, 1},
		{"document of 1 MiB, no tenant key written", mib, false, 2},
		{"document of 1 MiB - 1 byte and a new tenant", mib - 1, true, 3},
		{"document of 1 MiB - 1 byte and a tenant deleted", mib - 1, false, 3},
	} {
		last = sized(step.docBytes - (mib - 1))
		last.Tenants = nil
		if step.tenant {
			last.Tenants = map[string]config.Tenant{"beta": {Tier: "pro", Overrides: map[string]config.LimitSpec{
				"write": {Rate: 100, Burst: 100}, "read": {Rate: 100, Burst: 100}}}}
		}
		if rev, err = store.Apply(ctx, last, rev); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if rev-storeRev != step.revisions {
			t.Errorf("%s: written in %d revisions, want %d", step.name, rev-storeRev, step.revisions)
		}
		storeRev = rev
	}
	got, gotRev, err := store.Get(ctx)
	if err != nil || gotRev != rev || !reflect.DeepEqual(got, last) {
		t.Fatalf("Get = revision %d (want %d), %v", gotRev, rev, err)
	}
}

// TestStoreRequestTimeoutBoundsEachRequest: with a request timeout set,
// each etcd request gets that long, however long the caller's context
// lasts; without one (0) only the caller's context bounds it.
func TestStoreRequestTimeoutBoundsEachRequest(t *testing.T) {
	srv := etcdtest.Start(t)
	store := NewStore(srv.Client(t), "")
	ctx := testContext(t)
	rev, err := store.Apply(ctx, config.Default(), 0)
	if err != nil {
		t.Fatal(err)
	}

	// One nanosecond is over before any request reaches etcd.
	store.SetRequestTimeout(time.Nanosecond)
	for name, call := range map[string]func() error{
		"Get":         func() error { _, _, err := store.Get(ctx); return err },
		"Revision":    func() error { _, err := store.Revision(ctx); return err },
		"Applying":    func() error { _, err := store.Applying(ctx); return err },
		"Tenant":      func() error { _, err := store.Tenant(ctx, "acme"); return err },
		"Apply":       func() error { _, err := store.Apply(ctx, withReadRate(7), rev); return err },
		"ListTenants": func() error { _, err := store.ListTenants(ctx, "", func(TenantEntry) bool { return true }); return err },
	} {
		if err := call(); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s with a request timeout of 1ns: %v, want a deadline exceeded", name, err)
		}
	}
	if ctx.Err() != nil {
		t.Fatal("the caller's context ended: the test proves nothing")
	}

	store.SetRequestTimeout(0)
	if c, got, err := store.Get(ctx); err != nil || got != rev || readRate(c) != readRate(config.Default()) {
		t.Fatalf("Get without a request timeout = revision %d (want %d), %v", got, rev, err)
	}
}
