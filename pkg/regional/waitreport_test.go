package regional

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// TestNudgeCutsARoundsWaitShort: a round waiting to report again for a
// raise (the answer's report_again_ms) sends that report as soon as the
// global leader nudges the region, and spends the nudge on it; without a
// nudge it waits the whole wait; a lost leadership or an ended context
// ends the round instead.
func TestNudgeCutsARoundsWaitShort(t *testing.T) {
	const wait = 333 * time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		nudges := make(chan struct{}, 1)
		start := time.Now()
		go func() {
			time.Sleep(wait / 4)
			nudges <- struct{}{}
		}()
		if !waitToReport(ctx, nil, nudges, wait) {
			t.Fatal("a nudged wait ended the round")
		}
		if got := time.Since(start); got != wait/4 {
			t.Fatalf("nudged wait took %v, want %v (when the nudge came)", got, wait/4)
		}
		if len(nudges) != 0 {
			t.Fatal("the nudge was not spent on the report")
		}

		start = time.Now()
		if !waitToReport(ctx, nil, nudges, wait) {
			t.Fatal("a wait without nudges ended the round")
		}
		if got := time.Since(start); got != wait {
			t.Fatalf("wait without nudges took %v, want %v", got, wait)
		}
		if !waitToReport(ctx, nil, nil, wait) { // SyncOnce: no nudges at all
			t.Fatal("a wait with no nudge channel ended the round")
		}

		lost := make(chan struct{})
		close(lost)
		if waitToReport(ctx, lost, nudges, wait) {
			t.Fatal("the round went on after leadership was lost")
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if waitToReport(cctx, nil, nudges, wait) {
			t.Fatal("the round went on after its context ended")
		}
	})
}
