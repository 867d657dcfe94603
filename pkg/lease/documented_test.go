package lease

import (
	"testing"
	"time"
)

// TestDefaultsAreTheDocumentedValues: the client's defaults are the
// numbers docs/architecture.md's failure table and docs/operations.md
// promise operators (a 50 ms wait for the region, the breaker opening
// after 3 consecutive failures for 1 s, a Sync every second bounded by
// half of it, at most 2 synchronous acquires and 6 slow rounds per
// request), so a change to one is a change to the docs.
func TestDefaultsAreTheDocumentedValues(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"DefaultBreakerTimeout", DefaultBreakerTimeout, 50 * time.Millisecond},
		{"DefaultBreakerFailures", DefaultBreakerFailures, 3},
		{"DefaultBreakerCooldown", DefaultBreakerCooldown, time.Second},
		{"DefaultRefresh", DefaultRefresh, time.Second},
		{"DefaultSyncTimeout(1s)", DefaultSyncTimeout(time.Second), 500 * time.Millisecond},
		{"MaxSyncAcquires", MaxSyncAcquires, 2},
		{"MaxSlowRounds", MaxSlowRounds, 6},
		{"RefillSpacing(1s)", RefillSpacing(time.Second), 50 * time.Millisecond},
		{"RefillSpacing(20ms)", RefillSpacing(20 * time.Millisecond), 5 * time.Millisecond},
		{"CapHeldSpacing(1s)", CapHeldSpacing(time.Second), 5 * time.Millisecond},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

// TestBuiltTimesCountFromTheFirstReport: a report's build time is the µs
// since the table's first report plus 1 (0 on the wire means not given),
// never below 1 for a clock read before that first report, and never
// above 2^53 µs, the largest the region's Lua numbers hold exactly.
func TestBuiltTimesCountFromTheFirstReport(t *testing.T) {
	tb := newTestTable(t)
	for _, c := range []struct {
		at   time.Duration
		want int64
	}{
		{0, 1}, // the first report: the origin
		{1500 * time.Microsecond, 1501},
		{1500*time.Microsecond + 999*time.Nanosecond, 1501}, // whole µs
		{-time.Second, 1},
		{time.Duration(maxBuiltUS-2) * time.Microsecond, maxBuiltUS - 1},
		{time.Duration(maxBuiltUS-1) * time.Microsecond, maxBuiltUS},
		{time.Duration(maxBuiltUS+5) * time.Microsecond, maxBuiltUS},
	} {
		if got := tb.builtUS(t0.Add(c.at)); got != c.want {
			t.Errorf("built at origin%+v: %d µs, want %d", c.at, got, c.want)
		}
	}
	if maxBuiltUS != 1<<53 {
		t.Errorf("maxBuiltUS = %d, want 2^53", int64(maxBuiltUS))
	}
}

// TestConnectParamsCapTheReconnectWait: an instance dialing its region
// with ConnectParams tries a lost connection again at most
// MaxReconnectDelay (2 s, the scale of the breaker's cooldown) apart, not
// gRPC's default 120 s, keeps gRPC's other backoff settings (1 s base,
// 1.6 multiplier, 0.2 jitter) and gives an attempt up after
// ConnectTimeout (5 s, not gRPC's 20 s).
func TestConnectParamsCapTheReconnectWait(t *testing.T) {
	p := ConnectParams()
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"MaxReconnectDelay", MaxReconnectDelay, 2 * time.Second},
		{"Backoff.MaxDelay", p.Backoff.MaxDelay, MaxReconnectDelay},
		{"Backoff.BaseDelay", p.Backoff.BaseDelay, time.Second},
		{"Backoff.Multiplier", p.Backoff.Multiplier, 1.6},
		{"Backoff.Jitter", p.Backoff.Jitter, 0.2},
		{"ConnectTimeout", ConnectTimeout, 5 * time.Second},
		{"MinConnectTimeout", p.MinConnectTimeout, ConnectTimeout},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if MaxReconnectDelay > 2*DefaultBreakerCooldown {
		t.Errorf("MaxReconnectDelay %v is beyond the scale of the breaker's cooldown %v", MaxReconnectDelay, DefaultBreakerCooldown)
	}
}
