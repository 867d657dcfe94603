package luascripts

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestRetryAfterNeverWhenCostExceedsCap: a region whose cap is below a
// request's cost (a small burst split among regions) can never admit it.
// Check and a lease request must answer "never" (-1 on the wire), not a
// Retry-After after which the bucket still could not hold the cost; one
// that fits gets a wait the bucket does honour.
func TestRetryAfterNeverWhenCostExceedsCap(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	sc := newVirtual()
	m := NewModel()
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "free", Class: "export"})
	c := Common{StaticRate: 0.025, StaticBurst: 0.5, LeaseTTL: 5 * time.Second, ReapBudget: 8, DemandWindow: time.Millisecond}
	now := int64(1_700_000_000_000_000)
	sc.setNow(now)
	cr, err := sc.Check(ctx, rdb, k, c, 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := m.Check(now, k, c, 1); cr != want {
		t.Fatalf("check: lua %+v, model %+v", cr, want)
	}
	if cr.Allowed || cr.RetryAfter >= 0 || WireMS(cr.RetryAfter) != -1 {
		t.Errorf("cost 1 on a cap of 0.5: allowed %v, retry after %v (wire %d), want never (-1)", cr.Allowed, cr.RetryAfter, WireMS(cr.RetryAfter))
	}
	r := Report{Instance: "i-1", Seq: 1, Want: 1, Min: 1}
	lr, err := sc.Acquire(ctx, rdb, k, c, r)
	if err != nil {
		t.Fatal(err)
	}
	if want := m.Acquire(now, k, c, r); lr != want {
		t.Fatalf("acquire: lua %+v, model %+v", lr, want)
	}
	if lr.Granted != 0 || WireMS(lr.RetryAfter) != -1 {
		t.Errorf("lease of min 1 on a cap of 0.5: granted %d, retry after %v, want never", lr.Granted, lr.RetryAfter)
	}

	// A cap of 1 at the same rate: the wait is honoured to the µs.
	k2 := KeysFor(DefaultPrefix, quota.Key{Tenant: "free2", Class: "export"})
	c.StaticBurst = 1
	if cr, err = sc.Check(ctx, rdb, k2, c, 1); err != nil || !cr.Allowed {
		t.Fatalf("first token: %+v, %v", cr, err)
	}
	if cr, err = sc.Check(ctx, rdb, k2, c, 1); err != nil || cr.Allowed || cr.RetryAfter <= 0 {
		t.Fatalf("second token at once: %+v, %v, want a denial with a wait", cr, err)
	}
	sc.setNow(now + cr.RetryAfter.Microseconds())
	if cr, err = sc.Check(ctx, rdb, k2, c, 1); err != nil || !cr.Allowed {
		t.Errorf("after the promised wait: %+v, %v, want admitted", cr, err)
	}
}

// TestWireMS: a wait goes on the wire as whole milliseconds (no wait is
// 0), and only "never" as -1.
func TestWireMS(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int64
	}{{-1, -1}, {0, 0}, {999 * time.Microsecond, 0}, {time.Millisecond, 1}, {1500 * time.Millisecond, 1500}} {
		if got := WireMS(tc.d); got != tc.want {
			t.Errorf("WireMS(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
}
