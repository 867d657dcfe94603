package allocator

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
	"github.com/sluicehq/sluice/pkg/quota"
)

// weightsConfig is loopConfig (one class, 100/s) with regions a and b
// weighted wa and wb: a's static share is 100·wa/(wa+wb) per second.
func weightsConfig(t *testing.T, wa, wb int) *config.Config {
	t.Helper()
	yaml := strings.Replace(loopConfig, "a: {weight: 1}", fmt.Sprintf("a: {weight: %d}", wa), 1)
	yaml = strings.Replace(yaml, "b: {weight: 1}", fmt.Sprintf("b: {weight: %d}", wb), 1)
	return parseConfig(t, yaml)
}

// capturedLogs keeps a daemon's log lines for the test to search.
type capturedLogs struct {
	mu    sync.Mutex
	lines []string // guarded by mu
}

func (c *capturedLogs) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lines = append(c.lines, strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// with is the lines holding every one of parts.
func (c *capturedLogs) with(parts ...string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, l := range c.lines {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			out = append(out, l)
		}
	}
	return out
}

// startReplica starts a global replica on srv's etcd with config source
// src, keeping its log.
func startReplica(t *testing.T, srv *etcdtest.Server, src ConfigSource) (*Daemon, *capturedLogs) {
	t.Helper()
	logs := &capturedLogs{}
	d, err := StartDaemon(context.Background(), DaemonOptions{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", Etcd: srv.Client(t), Prefix: "/test",
		SessionTTL: time.Second, Config: src, DrainTimeout: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	return d, logs
}

// awaitLeading waits for d to lead within the election's bound (SessionTTL
// 1 s, retries).
func awaitLeading(t *testing.T, d *Daemon, logs *capturedLogs) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !d.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatalf("the replica never led:\n%s", strings.Join(logs.with(""), "\n"))
		}
		time.Sleep(5 * time.Millisecond) // polling the election with a deadline
	}
}

// startHistoryLeader starts a global replica on etcd that leads with a
// config source holding revA's config and then revB's (it ran both),
// never the later revisions written to etcd: a leader that never saw them.
func startHistoryLeader(t *testing.T, srv *etcdtest.Server, a, b *config.Config, revA, revB int64) (*Daemon, *capturedLogs) {
	t.Helper()
	src := configtest.NewSource(a, revA)
	d, logs := startReplica(t, srv, src)
	awaitLeading(t, d, logs)
	src.Set(b, revB)
	d.Service.step(time.Now())
	d.Service.mu.Lock()
	held := len(d.Service.held)
	d.Service.mu.Unlock()
	if held != 2 {
		t.Fatalf("the leader holds %d configs, want 2 (revisions %d and %d)", held, revA, revB)
	}
	return d, logs
}

// historyFailures is sluice_global_config_history_failed_total on d's
// registry.
func historyFailures(t *testing.T, d *Daemon) float64 {
	t.Helper()
	fams, err := d.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "sluice_global_config_history_failed_total" {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("sluice_global_config_history_failed_total is not registered")
	return 0
}

// reserveOfA is the static rate the allocator reserves for region a
// (index 0) for key k.
func reserveOfA(s *Service, k quota.Key) (float64, bool) {
	for _, kv := range s.View(time.Now()).Keys {
		if kv.Key == k {
			return kv.Regions[0].StaticRate, true
		}
	}
	return 0, false
}

func reportRevisions(t *testing.T, s *Service, region string, seq uint64, k quota.Key, revs ...int64) {
	t.Helper()
	if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: region, Seq: seq, ConfigRevisions: revs,
		Keys: []*sluicev1.KeyDemand{{Key: &sluicev1.QuotaKey{Tenant: k.Tenant, Class: k.Class}, Admitted: 10, WindowMs: 100}}}); err != nil {
		t.Fatal(err)
	}
}

// TestLeaderReadsTheConfigOfARevisionItNeverHeld: a leader that ran the
// configs of revisions A (a's share 50/s) and B (40/s) hears region a
// report revision X, committed in etcd but never live at this leader,
// under which a's share is 60/s. It reserves a only the largest share
// under the configs it holds, 50/s, until it read X's config from etcd,
// then a's share under X, 60/s: what a may actually run.
func TestLeaderReadsTheConfigOfARevisionItNeverHeld(t *testing.T) {
	srv := etcdtest.Start(t)
	store := configstore.NewStore(srv.Client(t), "/test")
	a, b, x := weightsConfig(t, 1, 1), weightsConfig(t, 2, 3), weightsConfig(t, 3, 2)
	revs := applyAll(t, store, a, b, x)
	revA, revB, revX := revs[0], revs[1], revs[2]
	d, _ := startHistoryLeader(t, srv, a, b, revA, revB)
	s := d.Service
	k := quota.Key{Tenant: "t", Class: "write"}

	reportRevisions(t, s, "a", 1, k, revX)
	// Answered at once: meanwhile the largest share under the held configs.
	if got, ok := reserveOfA(s, k); ok && math.Abs(got-60) > 1e-6 && math.Abs(got-50) > 1e-6 {
		t.Fatalf("a's reserve right after its report %v, want 50 (the largest under A and B) or already 60", got)
	}
	// a reports every epoch, as a region does (an idle key is forgotten).
	seq := uint64(1)
	deadline := time.Now().Add(historyReadTimeout + time.Second)
	for {
		got, ok := reserveOfA(s, k)
		if ok && math.Abs(got-60) < 1e-6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a's reserve %v (key tracked: %v), want 60/s, its share under revision %d it reported, within the read bound %v",
				got, ok, revX, historyReadTimeout)
		}
		time.Sleep(100 * time.Millisecond) // one epoch of loopConfig; polling for the read with a deadline derived from its bound
		seq++
		reportRevisions(t, s, "a", seq, k, revX)
	}
	// It holds X now, and a new report naming X reads nothing more.
	reportRevisions(t, s, "a", seq+1, k, revX)
	if got, _ := reserveOfA(s, k); math.Abs(got-60) > 1e-6 {
		t.Fatalf("a's reserve after another report %v, want 60", got)
	}
	if n := historyFailures(t, d); n != 0 {
		t.Fatalf("%v failed history reads, want 0", n)
	}
}

// TestLeaderKeepsTheConservativeReserveWhenTheRevisionIsCompacted: the
// same, but etcd compacted X and a later commit changed the config, so X's
// config cannot be read: a's reserve stays the largest share under the
// held configs (the residual gap of docs/architecture.md), the failure is
// counted and logged once, and a later report naming X does not read again
// before historyRetryAfter.
func TestLeaderKeepsTheConservativeReserveWhenTheRevisionIsCompacted(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	store := configstore.NewStore(cli, "/test")
	ctx := t.Context()
	a, b, x := weightsConfig(t, 1, 1), weightsConfig(t, 2, 3), weightsConfig(t, 3, 2)
	revs := applyAll(t, store, a, b, x, weightsConfig(t, 4, 1))
	revA, revB, revX, revY := revs[0], revs[1], revs[2], revs[3]
	if _, err := cli.Compact(ctx, revY); err != nil {
		t.Fatal(err)
	}
	d, logs := startHistoryLeader(t, srv, a, b, revA, revB)
	s := d.Service
	k := quota.Key{Tenant: "t", Class: "write"}

	reportRevisions(t, s, "a", 1, k, revX)
	deadline := time.Now().Add(historyReadTimeout + time.Second)
	for historyFailures(t, d) < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("no failed history read of revision %d counted within the read bound %v", revX, historyReadTimeout)
		}
		time.Sleep(5 * time.Millisecond) // polling for the read with a deadline derived from its bound
	}
	reportRevisions(t, s, "a", 2, k, revX)
	if got, ok := reserveOfA(s, k); !ok || math.Abs(got-50) > 1e-6 {
		t.Fatalf("a's reserve %v (key tracked: %v) after the read failed, want 50, the largest share under the held configs", got, ok)
	}
	s.mu.Lock()
	queued, pending := len(s.hist.queue), len(s.hist.pending)
	s.mu.Unlock()
	if queued != 0 || pending != 0 {
		t.Fatalf("a report naming revision %d again queued a read (%d queued, %d pending) within historyRetryAfter", revX, queued, pending)
	}
	if n := historyFailures(t, d); n != 1 {
		t.Fatalf("%v failed history reads, want 1", n)
	}
	if warned := logs.with("level=WARN", fmt.Sprintf("revision=%d", revX)); len(warned) != 1 {
		t.Fatalf("WARN lines naming revision %d: %q, want one", revX, warned)
	}
	// Nor past historyRetryAfter: etcd compacted it for good, so a region
	// that stays on it costs no further read, warning or count.
	s.mu.Lock()
	s.queueUnheldLocked(time.Now().Add(2*historyRetryAfter), []int64{revX})
	queued, pending = len(s.hist.queue), len(s.hist.pending)
	s.mu.Unlock()
	if queued != 0 || pending != 0 {
		t.Fatalf("a report naming compacted revision %d after historyRetryAfter queued a read (%d queued, %d pending)", revX, queued, pending)
	}
}

// TestNewLeaderHoldsTheConfigsCommittedBeforeItsOwn: a replica that starts
// leading on revision C (a's share 40/s), having never run the configs
// committed before it, A (50/s) and X (60/s), reads those back from etcd:
// region a, not heard from, may still run either (it may be cut off from
// etcd), so its reserve becomes the largest share under them, 60/s, not
// its share under the one config the leader ran.
func TestNewLeaderHoldsTheConfigsCommittedBeforeItsOwn(t *testing.T) {
	srv := etcdtest.Start(t)
	store := configstore.NewStore(srv.Client(t), "/test")
	a, x, c := weightsConfig(t, 1, 1), weightsConfig(t, 3, 2), weightsConfig(t, 2, 3)
	revs := applyAll(t, store, a, x, c)
	revA, revX, revC := revs[0], revs[1], revs[2]
	d := startLiveLeader(t, srv, c, revC)
	s := d.Service
	k := quota.Key{Tenant: "t", Class: "write"}
	// b reports every epoch (an idle key is forgotten); a never does.
	seq := uint64(0)
	// The revisions before the leader's are read back in the background,
	// not necessarily together: X's share may show before A is held.
	heldA := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		_, ok := s.held[revA]
		return ok
	}
	deadline := time.Now().Add(10*time.Second + historyReadTimeout)
	for {
		if d.IsLeader() {
			seq++
			reportRevisions(t, s, "b", seq, k, revC)
			if got, ok := reserveOfA(s, k); ok && math.Abs(got-60) < 1e-6 && heldA() {
				break
			}
		}
		if time.Now().After(deadline) {
			got, ok := reserveOfA(s, k)
			if !heldA() {
				t.Fatalf("revision %d, committed before the leader's, is not held (a's reserve %v, key tracked: %v)", revA, got, ok)
			}
			t.Fatalf("silent a's reserve %v (key tracked: %v), want 60/s, its share under revision %d committed before the leader's %d, within the election and read bounds",
				got, ok, revX, revC)
		}
		time.Sleep(100 * time.Millisecond) // one epoch of loopConfig; polling with a deadline
	}
	// Once a reports only C, the configs nobody reports are dropped and
	// a's reserve is its share under C.
	reportRevisions(t, s, "a", 1, k, revC)
	if got, _ := reserveOfA(s, k); math.Abs(got-40) > 1e-6 {
		t.Fatalf("a's reserve %v once it reported revision %d only, want 40", got, revC)
	}
}

// weightsABC is loopConfig with regions a, b and c weighted wa,
// wb and wc.
func weightsABC(t *testing.T, wa, wb, wc int) *config.Config {
	t.Helper()
	yaml := strings.Replace(loopConfig, "a: {weight: 1}", fmt.Sprintf("a: {weight: %d}", wa), 1)
	yaml = strings.Replace(yaml, "b: {weight: 1}", fmt.Sprintf("b: {weight: %d}\n  c: {weight: %d}", wb, wc), 1)
	return parseConfig(t, yaml)
}

// TestReportedRevisionOutranksTheConfigsReadAtElection: a replica leads on
// the 17th config committed; at election it reads back the 15 before it
// and holds them for c, never heard from. Region a reports revision A,
// committed before those (a cut off from etcd since): a's share under A
// is 66.7/s, under every config held at most 33.3/s. The leader reads A
// back and holds it, over the bound dropping one only c might run: a's
// reserve becomes its share under A, not the largest under the others.
func TestReportedRevisionOutranksTheConfigsReadAtElection(t *testing.T) {
	srv := etcdtest.Start(t)
	store := configstore.NewStore(srv.Client(t), "/test")
	ctx := t.Context()
	revA, err := store.Apply(ctx, weightsABC(t, 4, 1, 1), 0)
	if err != nil {
		t.Fatal(err)
	}
	rev, live := revA, (*config.Config)(nil)
	for w := 1; w <= 16; w++ {
		live = weightsABC(t, 1, 1, w)
		if rev, err = store.Apply(ctx, live, rev); err != nil {
			t.Fatal(err)
		}
	}
	d := startLiveLeader(t, srv, live, rev)
	s := d.Service
	k := quota.Key{Tenant: "t", Class: "write"}
	// a and b report every epoch (an idle key is forgotten); c never does.
	seq := uint64(0)
	deadline := time.Now().Add(10*time.Second + 2*historyReadTimeout)
	for {
		if d.IsLeader() {
			seq++
			reportRevisions(t, s, "b", seq, k, rev)
			reportRevisions(t, s, "a", seq, k, revA)
			if got, ok := reserveOfA(s, k); ok && math.Abs(got-400.0/6) < 1e-6 {
				break
			}
		}
		if time.Now().After(deadline) {
			got, ok := reserveOfA(s, k)
			s.mu.Lock()
			_, heldA := s.held[revA]
			s.mu.Unlock()
			t.Fatalf("a's reserve %v (key tracked: %v; revision %d held: %v), want 66.7/s, its share under the revision it reports, within the election and read bounds",
				got, ok, revA, heldA)
		}
		time.Sleep(100 * time.Millisecond) // one epoch of loopConfig; polling with a deadline
	}
}

// TestConfigOfAnotherShardCountIsNotReadBackAtElection: the read back at
// election holds the configs committed before the live one, for regions
// not heard from yet, but not one of another shard count: held while a
// region stays silent, it would keep the shard learning (a reshard in
// play) for as long, re-issuing only what regions hold. With a silent
// region and such a config behind the live one, the leader holds the
// other configs and leaves learning a grant validity and an epoch on.
func TestConfigOfAnotherShardCountIsNotReadBackAtElection(t *testing.T) {
	srv := etcdtest.Start(t)
	store := configstore.NewStore(srv.Client(t), "/test")
	sharded, x, c := parseConfig(t, loopConfig+"global_shards: 2\n"), weightsConfig(t, 3, 2), weightsConfig(t, 2, 3)
	revs := applyAll(t, store, sharded, x, c)
	revS, revX, revC := revs[0], revs[1], revs[2]
	d := startLiveLeader(t, srv, c, revC)
	s := d.Service
	k := quota.Key{Tenant: "t", Class: "write"}
	// b reports every epoch; a never does. Once x is held (read back
	// newest first, so the sharded config's turn has come and gone), the
	// leader must leave learning within a validity and an epoch.
	seq := uint64(0)
	deadline := time.Now().Add(10*time.Second + 2*historyReadTimeout)
	var heldSince time.Time
	for {
		if d.IsLeader() {
			seq++
			reportRevisions(t, s, "b", seq, k, revC)
		}
		s.mu.Lock()
		_, heldX := s.held[revX]
		_, heldS := s.held[revS]
		learning, reading := s.alloc.Learning(time.Now()), s.hist.recent
		s.mu.Unlock()
		if heldS {
			t.Fatalf("revision %d of another shard count was read back and held", revS)
		}
		if heldX && heldSince.IsZero() {
			heldSince = time.Now()
		}
		if heldX && !learning && !reading {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still learning (x held %v since %v) with a silent region and a config of another shard count behind the live one", heldX, heldSince)
		}
		time.Sleep(100 * time.Millisecond) // one epoch of loopConfig; polling with a deadline
	}
}

// applyAll writes cfgs to store one after another, each fenced on the
// revision the one before committed, and returns their revisions.
func applyAll(t *testing.T, store *configstore.Store, cfgs ...*config.Config) []int64 {
	t.Helper()
	revs := make([]int64, len(cfgs))
	prev := int64(0)
	for i, c := range cfgs {
		rev, err := store.Apply(t.Context(), c, prev)
		if err != nil {
			t.Fatal(err)
		}
		revs[i], prev = rev, rev
	}
	return revs
}

// startLiveLeader starts a global replica on srv's etcd whose config
// source holds live at rev (it never ran the revisions before).
func startLiveLeader(t *testing.T, srv *etcdtest.Server, live *config.Config, rev int64) *Daemon {
	t.Helper()
	d, _ := startReplica(t, srv, configtest.NewSource(live, rev))
	return d
}
