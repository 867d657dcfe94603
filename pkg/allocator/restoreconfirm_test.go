package allocator

import (
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/configtest"
)

// TestRestoreConfirmedOnlyOnceGrantsLeaveRoom: a drained region (floor 0)
// that is restored runs its static share again once the global tier
// confirms the restoring revision. The others' grants were sized with it
// at its floor, so the confirmation may reach it only once those grants
// have ended: at every instant a's grant (or static share) and b's rate
// under the revision confirmed to it sum to at most the key's 100/s. b
// reports no keys (it has no demand), so no grant of its own covers it
// but the zero grants of the contended key, and in one case not even
// those: b loses every grant (its set_rate calls time out on a loaded
// Redis) while it takes the confirmation, so it holds nothing the moment
// its share rises (seen in live mode). The global tier runs the restoring
// revision late (its watch lags the regions') in one case, at once in the
// other.
func TestRestoreConfirmedOnlyOnceGrantsLeaveRoom(t *testing.T) {
	for _, lost := range []bool{false, true} {
		for _, lag := range []bool{true, false} {
			for wait := range 12 {
				t.Run(fmt.Sprintf("b loses its grants=%v, global tier lags=%v, restored after %d more epochs", lost, lag, wait), func(t *testing.T) {
					synctest.Test(t, func(t *testing.T) { restoreConfirmed(t, lost, lag, wait) })
				})
			}
		}
	}
}

func restoreConfirmed(t *testing.T, lost, lag bool, wait int) {
	base := strings.Replace(loopConfig, "write: {}", "write: {partition_share: 0}", 1)
	drained := strings.Replace(base, "b: {weight: 1}", "b: {weight: 1, drained: true}", 1)
	src := configtest.NewSource(parseConfig(t, drained), 1)
	s := quietService(t, src)
	reg := prometheus.NewRegistry()
	newMetrics(reg, s)
	s.promote(1, time.Now().Add(time.Hour), nil)
	// The metrics show the two steps: the revision assumed, and the one
	// confirmed, never past it.
	var waited bool // assumed 2 seen while 1 was still confirmed
	gauges := func() (assumed, confirmed float64) {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			switch mf.GetName() {
			case "sluice_global_config_revision_assumed":
				assumed = mf.GetMetric()[0].GetGauge().GetValue()
			case "sluice_global_config_revision_confirmed":
				confirmed = mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return assumed, confirmed
	}
	type grant struct {
		rate   float64
		expiry time.Time
	}
	var (
		held      = map[string]grant{}
		revs      = map[string][]int64{"a": {1}, "b": {1}}
		confirmed = map[string]int64{"a": 1, "b": 1}
		seq       = map[string]uint64{}
		silent    int // b's reports still to skip
	)
	// b's static share under the revisions it honours: 0 while the
	// draining revision 1 is among them, 50/s after.
	bStatic := func() float64 {
		if confirmed["b"] >= 2 {
			return 50
		}
		return 0
	}
	cycle := func() {
		s.step(time.Now())
		for _, r := range []string{"a", "b"} {
			if r == "b" && silent > 0 {
				silent--
				continue
			}
			now := time.Now()
			rep := &sluicev1.RegionReport{Region: r, ConfigRevisions: revs[r]}
			if r == "a" {
				kd := &sluicev1.KeyDemand{Key: &sluicev1.QuotaKey{Tenant: "t", Class: "write"}, Admitted: 20, WindowMs: 100, Holding: 10}
				if g := held[r]; g.expiry.After(now) {
					kd.HeldRate, kd.HeldBurst, kd.HeldValidMs = g.rate, g.rate, g.expiry.Sub(now).Milliseconds()
				}
				rep.Keys = []*sluicev1.KeyDemand{kd}
			}
			seq[r]++
			rep.Seq = seq[r]
			resp, err := s.Sync(t.Context(), rep)
			if err != nil {
				t.Fatalf("%s report %d: %v", r, seq[r], err)
			}
			want := float64(resp.GetConfirmedRevision())
			if !resp.GetConfirmedKnown() {
				want = -1
			}
			if as, co := gauges(); co > as || co != want {
				t.Fatalf("metrics: revision %v assumed, %v confirmed; the answer confirms %v", as, co, want)
			} else if as == 2 && co == 1 {
				waited = true
			}
			if resp.GetConfirmedKnown() && resp.GetConfirmedRevision() > confirmed[r] {
				confirmed[r] = resp.GetConfirmedRevision()
				if r == "b" {
					// Its reports are late from here (a starved leader):
					// what it holds ends and it runs its static share.
					silent = 10
				}
				// The region drops the older revisions it reported.
				revs[r] = []int64{confirmed[r]}
			}
			for _, g := range resp.GetGrants() {
				if r == "b" && lost {
					break
				}
				held[r] = grant{g.GetRate(), now.Add(time.Duration(g.GetValidMs()) * time.Millisecond)}
			}
			in := func(r string, static float64) (float64, string) {
				if g := held[r]; g.expiry.After(time.Now()) {
					return g.rate, fmt.Sprintf("a grant until %v from now", g.expiry.Sub(time.Now()))
				}
				return static, "its static share"
			}
			a, aWhy := in("a", 50)
			b, bWhy := in("b", bStatic())
			if a+b > 100*(1+1e-9) {
				t.Fatalf("a runs %v/s (%s), b %v/s (%s, revision %d confirmed to it): %v/s in force, above the key's 100/s",
					a, aWhy, b, bWhy, confirmed["b"], a+b)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Until a holds a grant above its static share: b's share is free.
	for range 20 + wait {
		cycle()
	}
	if g := held["a"]; !g.expiry.After(time.Now()) || g.rate <= 60 {
		t.Fatalf("before the restore a holds %v/s until %v from now; want most of the 100/s", g.rate, g.expiry.Sub(time.Now()))
	}
	// The operator restores b: both regions adopt revision 2 and report it.
	restored := parseConfig(t, base)
	if !lag {
		src.Set(restored, 2)
	}
	revs["a"], revs["b"] = []int64{1, 2}, []int64{1, 2}
	for i := range 40 {
		if lag && i == 5 {
			src.Set(restored, 2)
		}
		cycle()
	}
	if confirmed["b"] != 2 {
		t.Fatalf("b never confirmed the restore: confirmed %d", confirmed["b"])
	}
	if !waited {
		t.Fatal("the metrics never showed revision 2 assumed and 1 still confirmed")
	}
}
