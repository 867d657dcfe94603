package allocator

import (
	"strings"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/internal/etcdtest"
)

// TestConfirmsTheRevisionsOfAnEtcdRestoredFromABackup: etcd restored from
// an older backup numbers its configs below the revision the leader had
// confirmed (the config watcher follows it: configstore's "etcd revision
// went backwards"). The leader confirmed only revisions above the one it
// had confirmed, so no config applied after the restore was ever
// confirmed: regions kept the smallest share under the old and every new
// config, a raised share never applied, and sluicectl status and
// sluice_global_config_revision_confirmed named the old revision, until
// etcd's revision passed it. The leader must confirm the restored etcd's
// revisions as a leader started on it does.
func TestConfirmsTheRevisionsOfAnEtcdRestoredFromABackup(t *testing.T) {
	srv := etcdtest.Start(t)
	const before, after = 30, 8
	src := configtest.NewSource(weightsConfig(t, 1, 1), before)
	d, logs := startReplica(t, srv, src)
	awaitLeading(t, d, logs)
	s := d.Service
	seq := uint64(0)
	report := func(revs ...int64) (confirmed int64, known bool) {
		t.Helper()
		var g *sluicev1.RegionGrants
		for _, region := range []string{"a", "b"} {
			seq++
			var err error
			g, err = s.Sync(t.Context(), &sluicev1.RegionReport{Region: region, Seq: seq, ConfigRevisions: revs})
			if err != nil {
				t.Fatal(err)
			}
		}
		return g.GetConfirmedRevision(), g.GetConfirmedKnown()
	}
	if rev, known := report(before); !known || rev != before {
		t.Fatalf("confirmed %d (known %v) with every region on revision %d, want it", rev, known, before)
	}

	src.Set(weightsConfig(t, 2, 3), after)
	s.step(time.Now())
	// The regions adopted the restored etcd's config after the old one, and
	// report every epoch. Its confirmation takes one validity and epoch.
	wait := 10 * (500*time.Millisecond + 100*time.Millisecond)
	for deadline := time.Now().Add(wait); ; {
		rev, known := report(before, after)
		if known && rev == after {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("confirmed revision %d (known %v) %v after every region reported revision %d, want %d\n%s",
				rev, known, wait, after, after, strings.Join(logs.with(""), "\n"))
		}
		time.Sleep(100 * time.Millisecond) // one epoch of loopConfig: regions report each epoch
	}
	if rev, known := report(after); !known || rev != after {
		t.Fatalf("confirmed %d (known %v) once every region dropped revision %d, want %d", rev, known, before, after)
	}
	if warned := logs.with("level=WARN", "config revision went back"); len(warned) != 1 {
		t.Fatalf("WARN lines on the revision going back: %q, want one", warned)
	}
}
