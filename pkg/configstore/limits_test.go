package configstore

import (
	"context"
	"errors"
	"reflect"
	"strings"
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

// documentOfSize is a valid config without tenants whose document is n
// bytes: the sample with one more Envoy descriptor, whose domain (a string
// of no bounded length, on one line) fills the bytes. Its size is checked
// by the caller (a 1 MiB document is slow to render under the race
// detector).
func documentOfSize(t *testing.T, n int) *config.Config {
	t.Helper()
	with := func(domain int) *config.Config {
		c := config.Default()
		c.Tenants = nil
		c.Envoy.Descriptors = append(c.Envoy.Descriptors, config.EnvoyDescriptor{
			Domain: strings.Repeat("d", domain), TenantKey: "tenant", ClassKey: "class"})
		return c
	}
	return with(n - documentBytes(t, with(1)) + 1)
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
	// Rendering and parsing megabytes of YAML is slow under the race
	// detector on a busy machine.
	ctx, cancel := context.WithTimeout(context.Background(), 5*waitFor)
	defer cancel()
	// The refusal's count checks documentOfSize to the byte.
	_, err := store.Apply(ctx, documentOfSize(t, mib+1), 0)
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
		last = documentOfSize(t, step.docBytes)
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
