package allocator_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/pkg/allocator"
)

// slack absorbs scheduling on a loaded machine and etcd checking lease
// expiry only every half second.
const slack = 2 * time.Second

// redirectsTo reports whether r answers Sync with "not leader" naming addr.
func redirectsTo(t *testing.T, r *replica, addr string, seq uint64) bool {
	_, err := r.api.Sync(rpcCtx(t), report("a", seq, demand("acme", 10)))
	got, ok := allocator.NotLeaderAddr(err)
	return ok && got == addr
}

// TestStandbyRedirectsAndHandsOverOnStop runs a leader and a standby on
// one etcd: exactly one leads, the standby redirects to it, the Client
// follows the redirect, both are healthy, and a graceful Stop of the
// leader hands over without waiting for its lease to expire.
func TestStandbyRedirectsAndHandsOverOnStop(t *testing.T) {
	srv := etcdtest.Start(t)
	src := allocator.StaticConfig{C: mustConfig(t, twoRegions)}
	ttl := 2 * time.Second
	a, b := startLeaderAndStandby(t, srv, src, ttl)
	if b.IsLeader() || !a.IsLeader() {
		t.Fatalf("leader a=%v b=%v, want exactly a", a.IsLeader(), b.IsLeader())
	}
	_, err := b.api.Sync(rpcCtx(t), report("a", 1, demand("acme", 10)))
	if st, _ := status.FromError(err); st.Code() != codes.FailedPrecondition || st.Message() != "not leader; leader="+a.Advertise() {
		t.Fatalf("standby Sync: %v", err)
	}
	for _, r := range []*replica{a, b} {
		conn, err := grpc.NewClient(r.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		h, err := healthpb.NewHealthClient(conn).Check(rpcCtx(t), &healthpb.HealthCheckRequest{})
		conn.Close()
		if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health of %s: %v %v (every replica that is up serves)", r.GRPCAddr(), h, err)
		}
	}
	sa, err := a.api.Status(rpcCtx(t), &sluicev1.StatusRequest{})
	if err != nil || !sa.Leader || sa.LeaderAddr != a.Advertise() || len(sa.Regions) != 2 {
		t.Fatalf("leader status: %v %v", sa, err)
	}
	sb, err := b.api.Status(rpcCtx(t), &sluicev1.StatusRequest{})
	if err != nil || sb.Leader || sb.LeaderAddr != a.Advertise() || len(sb.Regions) != 0 {
		t.Fatalf("standby status: %v %v", sb, err)
	}

	// The Client skips a dead address, is redirected by the standby, and
	// then keeps talking to the leader directly.
	cl, err := allocator.NewClient([]string{grpctest.RefusedAddr(t), b.GRPCAddr()}, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	redirected := func() string {
		return grep(scrape(t, b.Daemon), `sluice_global_reports_total{region="a",result="not_leader"}`)
	}
	var afterFirst string
	for seq := uint64(2); seq <= 4; seq++ {
		resp, err := cl.Sync(rpcCtx(t), report("a", seq, demand("acme", 10)))
		if err != nil || resp.Region != "a" || resp.Seq != seq {
			t.Fatalf("client Sync %d: %v %v", seq, resp, err)
		}
		if seq == 2 {
			afterFirst = redirected()
		}
	}
	if now := redirected(); now != afterFirst {
		t.Fatalf("the client went through the standby again after finding the leader: %q -> %q", afterFirst, now)
	}
	if m := scrape(t, a.Daemon); !strings.Contains(m, `sluice_global_reports_total{region="a",result="ok"} 3`) ||
		!strings.Contains(m, "sluice_global_leader 1") {
		t.Fatalf("leader metrics lack 3 ok reports or leader 1:\n%s", grep(m, "sluice_global_"))
	}
	// The standby counted its redirects and says it does not lead.
	if m := scrape(t, b.Daemon); !strings.Contains(m, `sluice_global_reports_total{region="a",result="not_leader"} `) ||
		!strings.Contains(m, "sluice_global_leader 0") {
		t.Fatalf("standby metrics:\n%s", grep(m, "sluice_global_"))
	}
	// A refusal every replica would repeat comes back at once.
	_, err = cl.Sync(rpcCtx(t), report("nowhere", 1, demand("acme", 10)))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "via "+a.Advertise()) {
		t.Fatalf("client Sync of a bad report: %v, want InvalidArgument from the leader only", err)
	}

	stopped := time.Now()
	a.Stop()
	took := waitFor(t, ttl+testEpoch+slack, "the standby leads after the leader stopped", b.IsLeader)
	t.Logf("handover after a graceful Stop: %v (session TTL %v)", time.Since(stopped), ttl)
	if took >= ttl {
		t.Errorf("handover took %v, no faster than lease expiry (%v): the leader did not resign", took, ttl)
	}
	resp, err := cl.Sync(rpcCtx(t), report("a", 5, demand("acme", 10)))
	if err != nil || !resp.Learning {
		t.Fatalf("client Sync after the handover: %v %v, want an answer in learning mode", resp, err)
	}
	cl.Close()
	if _, err := cl.Sync(rpcCtx(t), report("a", 6, demand("acme", 10))); err == nil {
		t.Fatal("Sync on a closed client succeeded")
	}
}

// syncSample is one Sync answer seen by the failover poller.
type syncSample struct {
	who      string // "old" or "new"
	ok       bool
	learning bool
	code     codes.Code
	at       time.Time // when the answer arrived
}

// TestFailoverWhenLeaderIsCutFromEtcd cuts the leader's path to etcd while
// a poller keeps asking both replicas, one after the other: the old
// leader stops granting by itself before the standby starts, the standby
// leads within TTL + one epoch (+ slack) in learning mode, and once the
// path is mended the old leader rejoins as a standby.
func TestFailoverWhenLeaderIsCutFromEtcd(t *testing.T) {
	srv := etcdtest.Start(t)
	src := allocator.StaticConfig{C: mustConfig(t, twoRegions)}
	old, standby := startLeaderAndStandby(t, srv, src, testTTL)

	var (
		mu         sync.Mutex
		samples    []syncSample
		bothLeader int
	)
	stop := make(chan struct{})
	pollerDone := make(chan struct{})
	go func() {
		defer close(pollerDone)
		seq := uint64(100)
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, r := range []struct {
				who string
				r   *replica
			}{{"old", old}, {"new", standby}} {
				seq++
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				resp, err := r.r.api.Sync(ctx, report("a", seq, demand("acme", 10)))
				cancel()
				s := syncSample{who: r.who, ok: err == nil, code: status.Code(err), at: time.Now()}
				if err == nil {
					s.learning = resp.Learning
				}
				mu.Lock()
				samples = append(samples, s)
				if old.IsLeader() && standby.IsLeader() {
					bothLeader++
				}
				mu.Unlock()
			}
		}
	}()
	newOKs := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, s := range samples {
			if s.who == "new" && s.ok {
				n++
			}
		}
		return n
	}
	waitFor(t, 5*time.Second, "the poller sees the old leader grant", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(samples) >= 4
	})

	cutAt := time.Now()
	old.link.Cut()
	took := waitFor(t, testTTL+testEpoch+slack, "the standby leads after the leader was cut off", standby.IsLeader)
	waitFor(t, 5*time.Second, "the poller sees the new leader grant", func() bool { return newOKs() >= 3 })
	close(stop)
	<-pollerDone

	mu.Lock()
	defer mu.Unlock()
	if bothLeader != 0 {
		t.Errorf("both replicas said they lead at %d checks", bothLeader)
	}
	firstNew := -1
	var oldStopped time.Time
	for i, s := range samples {
		if s.who == "new" && s.ok && firstNew < 0 {
			firstNew = i
			if !s.learning {
				t.Errorf("the new leader's first answer is not in learning mode")
			}
		}
		if s.who == "old" && !s.ok && s.at.After(cutAt) && oldStopped.IsZero() {
			oldStopped = s.at
			if s.code != codes.FailedPrecondition {
				t.Errorf("the old leader refused with %v, want FailedPrecondition", s.code)
			}
		}
		if s.who == "old" && s.ok && firstNew >= 0 {
			t.Errorf("the old leader granted (sample %d) after the new one started (sample %d)", i, firstNew)
		}
	}
	if oldStopped.IsZero() || !oldStopped.Before(samples[firstNew].at) {
		t.Errorf("the old leader did not refuse before the new one granted (stopped %v, new at %v)", oldStopped, samples[firstNew].at)
	}
	t.Logf("after the cut: old leader refused within %v, standby led after %v (TTL %v, epoch %v)",
		oldStopped.Sub(cutAt), took, testTTL, testEpoch)

	old.link.Mend()
	waitFor(t, 10*time.Second, "the old leader rejoins as a standby naming the new one", func() bool {
		return redirectsTo(t, old, standby.Advertise(), 1)
	})
	if old.IsLeader() || !standby.IsLeader() {
		t.Fatalf("after mending: old leads %v, new leads %v", old.IsLeader(), standby.IsLeader())
	}
}

func grep(text, substr string) string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
