package regional_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestRegionLeadershipPassesWhenTheLeaderStops: of two replicas of a
// region the first to run leads (Leading says true, IsLeading and the
// sluice_regional_leader gauge follow) on an etcd session of the default
// 5 s; when it stops it says false, and only that (Leading holds the
// latest value alone), its gauge reads 0, and the other replica leads.
func TestRegionLeadershipPassesWhenTheLeaderStops(t *testing.T) {
	ctx := context.Background()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	start := replicaStarter(ctx, t, cli, "/lp")
	waitLeading := func(r *leaderReplica, want bool) { t.Helper(); awaitLeading(t, r, want) }
	const sessionTTL = 5 * time.Second // the default

	a := start("eu-a")
	waitLeading(a, true)
	if !a.l.IsLeading() || metrictest.Gauge(t, a.reg, "sluice_regional_leader") != 1 {
		t.Fatalf("the elected replica: IsLeading %v, sluice_regional_leader %v; want true and 1",
			a.l.IsLeading(), metrictest.Gauge(t, a.reg, "sluice_regional_leader"))
	}
	// The leader campaigns under its own session, of the default TTL.
	leases, err := cli.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ttls []int64
	for _, ls := range leases.Leases {
		ttl, err := cli.TimeToLive(ctx, ls.ID, clientv3.WithAttachedKeys())
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range ttl.Keys {
			if strings.HasPrefix(string(k), "/lp/election/region/eu/") {
				ttls = append(ttls, ttl.GrantedTTL)
			}
		}
	}
	if len(ttls) != 1 || ttls[0] != int64(sessionTTL/time.Second) {
		t.Fatalf("sessions holding eu's election keys have TTLs %v s, want one of %v", ttls, sessionTTL)
	}

	b := start("eu-b")
	a.stop()
	// Leading holds only the latest value: false, nothing after it.
	waitLeading(a, false)
	select {
	case v := <-a.l.Leading():
		t.Fatalf("Leading held %v after false", v)
	default:
	}
	if a.l.IsLeading() || metrictest.Gauge(t, a.reg, "sluice_regional_leader") != 0 {
		t.Fatalf("the stopped replica: IsLeading %v, sluice_regional_leader %v; want false and 0",
			a.l.IsLeading(), metrictest.Gauge(t, a.reg, "sluice_regional_leader"))
	}
	waitLeading(b, true)
	if !b.l.IsLeading() || metrictest.Gauge(t, b.reg, "sluice_regional_leader") != 1 {
		t.Fatalf("the next leader: IsLeading %v, sluice_regional_leader %v; want true and 1",
			b.l.IsLeading(), metrictest.Gauge(t, b.reg, "sluice_regional_leader"))
	}
}

// TestRegionLeaderWhoseSessionEndsCampaignsAgain: a leader whose etcd
// session ends (its lease revoked, as when etcd expires it) stops leading,
// logs that it lost the leadership and campaigns again under a new
// session, which it wins: no other replica runs.
func TestRegionLeaderWhoseSessionEndsCampaignsAgain(t *testing.T) {
	ctx := context.Background()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	cfg := weightsConfig(t, 1, 1)
	d := startLeadingAllocator(ctx, t, cli, "/se", configtest.NewSource(cfg, 1))
	rdb := redistest.Start(t).Client()
	logs := &logtest.Buffer{}
	srv, err := regional.New(regional.Options{Region: "eu", Redis: rdb, Config: regional.StaticConfig{C: cfg},
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	l, err := regional.NewLeader(srv, regional.LeaderOptions{
		Etcd: cli, ElectionPrefix: "/se/election/", Global: serviceTier{d.Service}, Identity: "eu-a", SessionTTL: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); l.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })
	// Elections take a few session TTLs at most, however starved.
	patience := 50 * time.Second
	select {
	case got := <-l.Leading():
		if !got {
			t.Fatal("Leading said false first")
		}
	case <-time.After(patience):
		t.Fatalf("not elected in %v", patience)
	}
	// The session holding eu's election key.
	resp, err := cli.Get(ctx, "/se/election/region/eu/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatalf("%d keys in eu's election, want 1", len(resp.Kvs))
	}
	lease := clientv3.LeaseID(resp.Kvs[0].Lease)
	if _, err := cli.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	const lost = `msg="region leadership lost; campaigning again"`
	for deadline := time.Now().Add(patience); ; {
		resp, err := cli.Get(ctx, "/se/election/region/eu/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		if logs.Count(lost) == 1 && l.IsLeading() && len(resp.Kvs) == 1 && clientv3.LeaseID(resp.Kvs[0].Lease) != lease {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not leading again under a new session within %v after its session ended (leading %v, election %v)\n%s",
				patience, l.IsLeading(), resp.Kvs, logs.String())
		}
		time.Sleep(100 * time.Millisecond) // polling the campaign with a deadline
	}
	if !strings.Contains(logs.String(), `err="etcd session expired"`) {
		t.Errorf("the lost leadership logged without its cause\n%s", logs.String())
	}

	// A replica stopped while it campaigns lost no leadership: it logs
	// nothing.
	standbyLogs := &logtest.Buffer{}
	standby, err := regional.New(regional.Options{Region: "eu", Redis: rdb, Config: regional.StaticConfig{C: cfg},
		Logger: slog.New(slog.NewTextHandler(standbyLogs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(standby.Close)
	sl, err := regional.NewLeader(standby, regional.LeaderOptions{
		Etcd: cli, ElectionPrefix: "/se/election/", Global: serviceTier{d.Service}, Identity: "eu-b", SessionTTL: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	sctx, stopStandby := context.WithCancel(ctx)
	standbyDone := make(chan struct{})
	go func() { defer close(standbyDone); sl.Run(sctx) }()
	for deadline := time.Now().Add(patience); ; {
		resp, err := cli.Get(ctx, "/se/election/region/eu/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the standby's campaign key not in the election within %v", patience)
		}
		time.Sleep(100 * time.Millisecond) // polling the campaign with a deadline
	}
	stopStandby()
	<-standbyDone
	if sl.IsLeading() || standbyLogs.String() != "" {
		t.Errorf("a standby stopped while campaigning: leading %v, logged\n%s", sl.IsLeading(), standbyLogs)
	}
}

// leaderReplica is one replica of region eu with its leader loop running.
type leaderReplica struct {
	l    *regional.Leader
	reg  *prometheus.Registry
	stop func()
}

// replicaStarter returns a function that starts replicas of region eu
// (weights 1:1 with another region) on one redis-server, each with its
// own registry and leader loop under prefix, beside a leading allocator;
// each stops at t's cleanup if not before.
func replicaStarter(ctx context.Context, t *testing.T, cli *clientv3.Client, prefix string) func(identity string) *leaderReplica {
	t.Helper()
	cfg := weightsConfig(t, 1, 1)
	d := startLeadingAllocator(ctx, t, cli, prefix, configtest.NewSource(cfg, 1))
	rdb := redistest.Start(t).Client()
	return func(identity string) *leaderReplica {
		t.Helper()
		reg := prometheus.NewRegistry()
		srv, err := regional.New(regional.Options{Region: "eu", Redis: rdb, Config: regional.StaticConfig{C: cfg}, Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Close)
		l, err := regional.NewLeader(srv, regional.LeaderOptions{
			Etcd: cli, ElectionPrefix: prefix + "/election/", Global: serviceTier{d.Service}, Identity: identity,
		})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); l.Run(rctx) }()
		r := &leaderReplica{l: l, reg: reg, stop: func() { cancel(); <-done }}
		t.Cleanup(r.stop)
		return r
	}
}

// awaitLeading waits for r's Leading to say want; elections take a few
// session TTLs (the default 5 s) at most, however starved.
func awaitLeading(t *testing.T, r *leaderReplica, want bool) {
	t.Helper()
	const sessionTTL = 5 * time.Second
	select {
	case got := <-r.l.Leading():
		if got != want {
			t.Fatalf("Leading said %v, want %v", got, want)
		}
	case <-time.After(10 * sessionTTL):
		t.Fatalf("Leading said nothing in %v, want %v", 10*sessionTTL, want)
	}
}

// TestARegionReplicaWhoseKeyWentWhileWaitingDoesNotLead: a replica waiting
// behind the region's leader loses its session's lease (as one that lapsed
// during an etcd outage does, once etcd is back); when the leader stops,
// etcd's Campaign returns for it all the same. It must not lead on a key
// it no longer holds: after an etcd outage two replicas of one region both
// said they were elected. It campaigns again and leads under a key etcd
// holds.
func TestARegionReplicaWhoseKeyWentWhileWaitingDoesNotLead(t *testing.T) {
	ctx := context.Background()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	start := replicaStarter(ctx, t, cli, "/kw")
	const pfx = "/kw/election/region/eu/"
	a := start("eu-a")
	awaitLeading(t, a, true)
	b := start("eu-b")
	// b's key is the later of the two once it campaigns.
	deadline := time.Now().Add(time.Minute)
	var keys *clientv3.GetResponse
	for {
		var err error
		if keys, err = cli.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)); err != nil {
			t.Fatal(err)
		}
		if len(keys.Kvs) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("eu-b never campaigned: %d election keys", len(keys.Kvs))
		}
		time.Sleep(10 * time.Millisecond) // polling etcd; the deadline is above
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(keys.Kvs[1].Lease)); err != nil {
		t.Fatal(err)
	}
	a.stop()
	awaitLeading(t, b, true)
	// Read at once: a replica that took the lead on its revoked lease
	// holds no key (it learns its session ended only later, then waits
	// before campaigning again).
	held, err := cli.Get(ctx, pfx, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(held.Kvs) != 1 || string(held.Kvs[0].Value) != "eu-b" {
		t.Fatalf("eu-b leads, and eu's election holds %d keys, want eu-b's alone", len(held.Kvs))
	}
	if held.Kvs[0].Lease == keys.Kvs[1].Lease {
		t.Fatalf("eu-b leads under the lease that was revoked")
	}
}
