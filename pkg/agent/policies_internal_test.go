package agent

import (
	"testing"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/lease"
)

// TestClassPoliciesLeaveOutAClassTheLeaseClientCannotRead: a class whose
// mode or on_failure the lease client does not know gets no policy; the
// others get theirs.
func TestClassPoliciesLeaveOutAClassTheLeaseClientCannotRead(t *testing.T) {
	cfg := config.Default()
	cfg.Classes["odd-mode"] = config.Class{Mode: "sometimes", OnFailure: cfg.Classes["read"].OnFailure}
	cfg.Classes["odd-failure"] = config.Class{Mode: cfg.Classes["read"].Mode, OnFailure: "shrug"}
	got := classPolicies(cfg)
	if len(got) != len(cfg.Classes)-2 {
		t.Fatalf("policies for %d classes, want %d: %v", len(got), len(cfg.Classes)-2, got)
	}
	for _, odd := range []string{"odd-mode", "odd-failure"} {
		if p, ok := got[odd]; ok {
			t.Errorf("class %s got policy %+v, want none", odd, p)
		}
	}
	if p := got["export"]; p.Mode != lease.ModeStrict {
		t.Errorf("export = %+v, want strict", p)
	}
}
