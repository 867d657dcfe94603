package election

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/sluicehq/sluice/internal/etcdtest"
)

// TestCampaignReturnsWhenEtcdIsGone waits behind a leader, makes etcd
// unreachable, and cancels: Campaign returns at once, where etcd's own
// would wait for the unreachable server to take its resignation. etcd
// hangs rather than stops: a stopped etcd resets the connections, and the
// waiting candidate could then return etcd's error before the cancel.
func TestCampaignReturnsWhenEtcdIsGone(t *testing.T) {
	srv := etcdtest.Start(t)
	link := srv.Link(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	session := func() *concurrency.Session {
		s, err := concurrency.NewSession(link.Client(t), concurrency.WithTTL(5))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	leader := concurrency.NewElection(session(), "/election-test")
	if err := Campaign(ctx, leader, "a"); err != nil {
		t.Fatalf("the first candidate: %v", err)
	}

	wctx, stopWaiting := context.WithCancel(ctx)
	done := make(chan error, 1)
	second := concurrency.NewElection(session(), "/election-test")
	go func() { done <- Campaign(wctx, second, "b") }()
	// Wait until the second candidate is queued behind the leader (its
	// key is in etcd): only then is etcd's going away what it waits on.
	awaitQueued(ctx, t, srv.Client(t), done)
	select {
	case err := <-done:
		t.Fatalf("the second candidate returned %v while the first leads", err)
	default:
	}
	link.Hang()
	stopWaiting()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Campaign returned %v, want context.Canceled", err)
		}
	case <-ctx.Done():
		t.Fatal("Campaign did not return after its context ended while etcd was unreachable")
	}
}

// TestConfirmRefusesACandidateWhoseKeyWentWithItsLease: a candidate
// waiting behind a leader loses its lease (as a session does that lapsed
// during an etcd outage, its lease dropped once etcd is back); when the
// leader steps down, etcd's Campaign returns for it all the same, and
// Confirm says its key is lost. The leader itself is confirmed.
func TestConfirmRefusesACandidateWhoseKeyWentWithItsLease(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	session := func() *concurrency.Session {
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	leaderSess := session()
	leader := concurrency.NewElection(leaderSess, "/election-test")
	if err := Campaign(ctx, leader, "a"); err != nil {
		t.Fatalf("the first candidate: %v", err)
	}
	if err := Confirm(ctx, cli, leader, leaderSess.Lease(), 5*time.Second); err != nil {
		t.Fatalf("the leader is not confirmed: %v", err)
	}
	waitingSess := session()
	waiting := concurrency.NewElection(waitingSess, "/election-test")
	done := make(chan error, 1)
	go func() { done <- Campaign(ctx, waiting, "b") }()
	awaitQueued(ctx, t, cli, done)
	if _, err := cli.Revoke(ctx, waitingSess.Lease()); err != nil {
		t.Fatal(err)
	}
	if err := leader.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("etcd's Campaign returned %v; this test expects it to return as if won", err)
	}
	if err := Confirm(ctx, cli, waiting, waitingSess.Lease(), 5*time.Second); !errors.Is(err, ErrKeyLost) {
		t.Fatalf("Confirm of a candidate whose key went with its lease: %v, want ErrKeyLost", err)
	}
}

// awaitQueued waits until a second candidate's key is in etcd under
// /election-test, queued behind the leader; done is the second's
// Campaign, which must not return meanwhile. The deadline is ctx's.
func awaitQueued(ctx context.Context, t *testing.T, cli *clientv3.Client, done <-chan error) {
	t.Helper()
	for {
		resp, err := cli.Get(ctx, "/election-test", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count >= 2 {
			return
		}
		select {
		case err := <-done:
			t.Fatalf("the second candidate returned %v while the first leads", err)
		case <-time.After(10 * time.Millisecond): // polling etcd; the deadline is ctx's
		}
	}
}
