package lease

import (
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// TestPeriodicSyncLeavesAKeyInFlightOut: one report per key at a time
// (doc.go, PrepareSync): a key whose acquire is in flight gets no report
// in the periodic Sync that runs meanwhile, while the other keys do; once
// the acquire is answered, the next Sync reports it again.
func TestPeriodicSyncLeavesAKeyInFlightOut(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0, kR, 1, 5)
	if _, act := allow(t, tb, t0, kW, 1); act != ActAcquire {
		t.Fatalf("first request on %s: action %v, want acquire", kW, act)
	}
	b, _ := tb.PrepareAcquire(t0, kW, 1)
	if b == nil {
		t.Fatal("no acquire prepared")
	}
	at := t0.Add(time.Second)
	syncs, _ := tb.PrepareSync(at)
	if len(syncs) != 1 || len(syncs[0].Reports) != 1 || syncs[0].Keys()[0] != kR {
		t.Fatalf("Sync while %s's acquire is in flight: %v, want one report, of %s", kW, syncs, kR)
	}
	if err := tb.Apply(at, syncs[0], grantBatch(syncs[0], 0)); err != nil {
		t.Fatal(err)
	}
	if err := tb.Apply(at, b, []*sluicev1.Grant{regionGrant(b.Reports[0], 1)}); err != nil {
		t.Fatal(err)
	}
	syncs, _ = tb.PrepareSync(at.Add(time.Second))
	if len(syncs) != 1 || len(syncs[0].Reports) != 2 {
		t.Fatalf("Sync after the acquire was answered: %v, want one batch of both keys", syncs)
	}
}
