package world

import (
	"testing"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestNeverReplyReachesTheInstances: the simulated region answers through
// pkg/regional/reply as the regional service does, so a request a region's
// bucket can never hold (burst 1 split 1:3, region a's cap below one
// token) is answered retry_after_ms -1 ("never") on both the strict and
// the lease path, not a wait.
func TestNeverReplyReachesTheInstances(t *testing.T) {
	h := buildFrom(t, `
name: never
duration: 10s
sluice:
  regions: {a: {weight: 1}, b: {weight: 3}}
  classes: {export: {mode: strict}, bulk: {mode: lease}}
  tiers: {t: {export: {rate: 6/m, burst: 1}, bulk: {rate: 6/m, burst: 1}}}
  default_tier: t
topology:
  regions: [{name: a, instances: 1}, {name: b, instances: 1}]
  global: {primary: a}
workload:
  - {tenant: x, class: export, rate: {a: 1/s}}
  - {tenant: x, class: bulk, rate: {a: 1/s}}
`)
	a := h.w.regions[0]
	export := h.w.keyByQK[quota.Key{Tenant: "x", Class: "export"}]
	bulk := h.w.keyByQK[quota.Key{Tenant: "x", Class: "bulk"}]
	cr, ok := a.check(export, 1)
	if !ok || cr.Allowed || cr.RetryAfterMs != -1 {
		t.Errorf("strict check of cost 1 on a cap below 1: %v (ok %v), want denied with retry_after_ms -1", cr, ok)
	}
	rep := &sluicev1.KeyReport{Key: bulk.wire, Seq: 1, Lease: 1, Want: 1, Min: 1}
	gs, ok := a.leaseOp("a-probe", []*sluicev1.KeyReport{rep}, true)
	if !ok || len(gs) != 1 || gs[0].Granted != 0 || gs[0].RetryAfterMs != -1 {
		t.Errorf("lease of min 1 on a cap below 1: %v (ok %v), want nothing granted and retry_after_ms -1", gs, ok)
	}
}
