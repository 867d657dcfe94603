package httplimit_test

import (
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/httplimit"
	"github.com/sluicehq/sluice/pkg/quota"
)

func TestClassByMethodSplitsSafeMethodsFromTheRest(t *testing.T) {
	class := httplimit.ClassByMethod("read", "write")
	for method, want := range map[string]string{
		http.MethodGet: "read", http.MethodHead: "read", http.MethodOptions: "read", http.MethodTrace: "read",
		http.MethodPost: "write", http.MethodPut: "write", http.MethodPatch: "write", http.MethodDelete: "write",
		"PROPFIND": "write",
	} {
		if got := class(httptest.NewRequest(method, "/", nil)); got != want {
			t.Errorf("%s -> %q, want %q", method, got, want)
		}
	}
}

func TestReadAndWriteClassesHaveSeparateBuckets(t *testing.T) {
	f := newFixture(t, testLimits, nil)
	for range 5 {
		f.do(http.MethodGet, "acme", nil)
	}
	if rec := f.do(http.MethodGet, "acme", nil); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("read bucket not exhausted: status %d", rec.Code)
	}
	if rec := f.do(http.MethodDelete, "acme", nil); rec.Code != http.StatusOK {
		t.Errorf("write request throttled by the read bucket: status %d", rec.Code)
	}
}

func TestHeaderKey(t *testing.T) {
	key := httplimit.HeaderKey("x-tenant-id", "export")
	req := httptest.NewRequest(http.MethodPost, "/reports?format=csv", nil)
	req.Header.Set("X-Tenant-ID", "acme-01")
	got, err := key(req)
	if err != nil || got != (quota.Key{Tenant: "acme-01", Class: "export"}) {
		t.Errorf("key = %v, %v; want acme-01/export", got, err)
	}

	req.Header.Set("X-Tenant-ID", strings.Repeat("a", quota.MaxTenantLen+1))
	if _, err := key(req); err == nil || !strings.Contains(err.Error(), "X-Tenant-Id") {
		t.Errorf("over-long tenant: err %v, want one naming the header", err)
	}
}

func TestKeyHelpersPanicOnWiringMistakes(t *testing.T) {
	for name, build := range map[string]func(){
		"empty header":      func() { httplimit.HeaderKey("", "read") },
		"bad class":         func() { httplimit.HeaderKey("X-Tenant-ID", "read/write") },
		"empty class":       func() { httplimit.HeaderKey("X-Tenant-ID", "") },
		"nil class func":    func() { httplimit.HeaderKeyClass("X-Tenant-ID", nil) },
		"bad read class":    func() { httplimit.ClassByMethod("{read}", "write") },
		"empty write class": func() { httplimit.ClassByMethod("read", "") },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			build()
		})
	}
}

func TestRefillWindow(t *testing.T) {
	for _, tc := range []struct {
		limit quota.Limit
		want  time.Duration
	}{
		{quota.Limit{Rate: 1, Burst: 5}, 5 * time.Second},
		{quota.Limit{Rate: 10, Burst: 2}, 200 * time.Millisecond},
		{quota.Limit{Rate: 3, Burst: 1}, 333_333_334 * time.Nanosecond},
		{quota.Limit{Rate: 0.1, Burst: 1}, 10 * time.Second},
		{quota.Limit{Rate: 0, Burst: 5}, 0},
		{quota.Limit{Rate: math.NaN(), Burst: 5}, 0},
		{quota.Limit{Rate: 1, Burst: 0}, 0},
		{quota.Limit{Rate: 1e-12, Burst: 1 << 40}, time.Duration(math.MaxInt64)},
		{quota.Limit{Rate: 1, Burst: -1}, 0},
		// 2^40 tokens at 1953125/2^14 per second take exactly 2^63 ns,
		// one more than the longest Duration: it saturates too.
		{quota.Limit{Rate: 1953125.0 / 16384, Burst: 1 << 40}, time.Duration(math.MaxInt64)},
	} {
		if got := httplimit.RefillWindow(tc.limit); got != tc.want {
			t.Errorf("RefillWindow(%+v) = %v, want %v", tc.limit, got, tc.want)
		}
	}
}
