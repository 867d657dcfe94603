package allocator

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/configtest"
)

// TestConfirmationLogsSayWhatHappened: a leader whose regions all report,
// first, the revision already confirmed to them confirms it at once: it
// logs that, and not that it counts the regions' shares under it "until it
// is confirmed" (a wait it does not make). A later revision every region
// reports is assumed, logged with the wait, and confirmed once the wait
// has passed.
func TestConfirmationLogsSayWhatHappened(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := configtest.NewSource(parseConfig(t, loopConfig), 1)
		s, logs := loggedService(t, src)
		s.promote(1, time.Now().Add(time.Hour), nil)
		seq := uint64(0)
		round := func(revs ...int64) {
			t.Helper()
			seq++
			for _, r := range []string{"a", "b"} {
				if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: r, Seq: seq, ConfigRevisions: revs}); err != nil {
					t.Fatalf("%s: %v", r, err)
				}
			}
		}
		const (
			assumed   = "every region reported a config revision; counting their shares under it until it is confirmed"
			confirmed = "config revision confirmed to the regions"
		)
		round(1)
		if n := logs.Count(confirmed + `" revision=1`); n != 1 {
			t.Fatalf("revision 1 logged confirmed %d times, want 1:\n%s", n, logs)
		}
		if strings.Contains(logs.String(), assumed) {
			t.Fatalf("revision 1, confirmed at once, logged as waiting to be confirmed:\n%s", logs)
		}
		src.Next(parseConfig(t, strings.Replace(loopConfig, "weight: 1}\n  b", "weight: 2}\n  b", 1)))
		s.step(time.Now())
		round(1, 2)
		if n := logs.Count(assumed + `" revision=2`); n != 1 {
			t.Fatalf("revision 2 logged assumed %d times, want 1:\n%s", n, logs)
		}
		if logs.Count(confirmed+`" revision=2`) != 0 {
			t.Fatalf("revision 2 confirmed before its wait:\n%s", logs)
		}
		cfg := src.Current()
		time.Sleep(time.Duration(cfg.GrantValidity+cfg.Epoch) + time.Millisecond)
		round(1, 2)
		if n := logs.Count(confirmed + `" revision=2`); n != 1 {
			t.Fatalf("revision 2 logged confirmed %d times after its wait, want 1:\n%s", n, logs)
		}
	})
}
