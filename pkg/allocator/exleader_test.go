package allocator_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/pkg/allocator"
)

// TestExLeaderExportsNoLeaderGauges: a leader answers a region's report,
// so it exports that region's granted rate and the key it tracks; once it
// lost its leadership (its path to etcd cut, the standby leads), its
// scrape has no granted rate and 0 keys, so a sum over the replicas
// counts the new leader's alone. The ex-leader exported its last values
// for as long as it ran.
func TestExLeaderExportsNoLeaderGauges(t *testing.T) {
	srv := etcdtest.Start(t)
	src := allocator.StaticConfig{C: mustConfig(t, twoRegions)}
	old, standby := startLeaderAndStandby(t, srv, src, testTTL)
	if _, err := old.api.Sync(rpcCtx(t), report("a", 2, demand("acme", 10))); err != nil {
		t.Fatalf("Sync to the leader: %v", err)
	}
	const rate, keys = `sluice_global_granted_rate{region="a"} `, "sluice_global_keys "
	if m := scrape(t, old.Daemon); !strings.Contains(m, rate) || !strings.Contains(m, keys+"1\n") {
		t.Fatalf("the leader exports no granted rate for region a or not 1 key:\n%s", grep(m, "sluice_global_"))
	}

	old.link.Cut()
	waitFor(t, testTTL+testEpoch+slack, "the standby leads after the leader was cut off", standby.IsLeader)
	waitFor(t, testTTL+slack, "the old leader stops leading", func() bool { return !old.IsLeader() })
	m := scrape(t, old.Daemon)
	if strings.Contains(m, rate) || !strings.Contains(m, keys+"0\n") {
		t.Errorf("the ex-leader still exports a granted rate, or keys other than 0:\n%s", grep(m, "sluice_global_"))
	}

	// Leading again, it exports the rates of this term's answers only:
	// none before a region reported.
	old.link.Mend()
	waitFor(t, 10*time.Second, "the old leader rejoins as a standby naming the new one", func() bool {
		return redirectsTo(t, old, standby.Advertise(), 3)
	})
	standby.Stop()
	waitFor(t, testTTL+testEpoch+slack, "the old leader leads again", old.IsLeader)
	if m := scrape(t, old.Daemon); strings.Contains(m, rate) {
		t.Errorf("leading again, it exports the granted rate of its earlier term:\n%s", grep(m, "sluice_global_"))
	}
}
