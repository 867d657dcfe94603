package rpcauth

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestRefusalsAreLoggedOncePerIdentityPerMinute: a caller refused over and
// over is logged once a minute; another identity is logged on its own.
func TestRefusalsAreLoggedOncePerIdentityPerMinute(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1000, 0)
	a := &Authorizer{o: Options{Logger: slog.New(slog.NewTextHandler(&buf, nil)), LogEvery: time.Minute,
		Now: func() time.Time { return now }}, logged: map[string]time.Time{}}
	lines := func() int { return strings.Count(buf.String(), "call refused") }
	x, y := &Caller{Name: "spiffe://t/x"}, &Caller{Name: "spiffe://t/y"}
	for range 100 {
		a.logOnce(x, "/m", "instance", "none")
	}
	a.logOnce(y, "/m", "instance", "none")
	if got := lines(); got != 2 {
		t.Fatalf("%d log lines for 100 refusals of x and one of y, want 2", got)
	}
	now = now.Add(59 * time.Second)
	a.logOnce(x, "/m", "instance", "none")
	if got := lines(); got != 2 {
		t.Fatalf("x logged again within the minute")
	}
	now = now.Add(time.Second)
	a.logOnce(x, "/m", "instance", "none")
	if got := lines(); got != 3 {
		t.Fatalf("x not logged again after a minute: %d lines", got)
	}
}

func TestPolicyCoversServicesAndRefusesTheRest(t *testing.T) {
	p := Policy{"/s.A/*": {Role: "instance"}, "/s.B/Get": {Role: "operator"}}
	for _, tc := range []struct {
		method string
		role   string
		ok     bool
	}{
		{"/s.A/Sync", "instance", true},
		{"/s.B/Get", "operator", true},
		{"/s.B/Put", "", false},
		{"/s.C/Get", "", false},
	} {
		r, ok := p.rule(tc.method)
		if ok != tc.ok || r.Role != tc.role {
			t.Errorf("%s: rule %+v %v, want role %q %v", tc.method, r, ok, tc.role, tc.ok)
		}
	}
}
