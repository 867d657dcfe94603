package etcdtest

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// getWithin polls key until a Get succeeds or the deadline passes.
func getWithin(t *testing.T, cli *clientv3.Client, key string, within time.Duration) *clientv3.GetResponse {
	t.Helper()
	deadline := time.Now().Add(within)
	var lastErr error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		resp, err := cli.Get(ctx, key)
		cancel()
		if err == nil {
			return resp
		}
		lastErr = err
	}
	t.Fatalf("get %q did not succeed within %v: %v", key, within, lastErr)
	return nil
}

func TestStartServesPutAndGet(t *testing.T) {
	srv := Start(t)
	cli := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	put, err := cli.Put(ctx, "/k", "v1")
	if err != nil {
		t.Fatalf("put: %v", err)
	}
	resp, err := cli.Get(ctx, "/k")
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v1" || resp.Kvs[0].ModRevision != put.Header.Revision {
		t.Fatalf("get returned %v, want v1 at revision %d", resp.Kvs, put.Header.Revision)
	}
}

func TestRestartKeepsDataAndEndpoints(t *testing.T) {
	srv := Start(t)
	cli := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "/k", "kept"); err != nil {
		t.Fatalf("put: %v", err)
	}
	before := srv.Endpoints()

	srv.Stop()
	srv.Stop() // idempotent
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	if _, err := cli.Get(short, "/k"); err == nil {
		t.Fatal("get succeeded while etcd was stopped")
	}
	cancelShort()

	srv.Restart()
	if after := srv.Endpoints(); after[0] != before[0] {
		t.Fatalf("endpoints changed across restart: %v -> %v", before, after)
	}
	resp := getWithin(t, cli, "/k", 15*time.Second)
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "kept" {
		t.Fatalf("after restart get returned %v, want kept", resp.Kvs)
	}
}

// linked starts a server and a link to it, with a client through the link
// (which has written /k = 1) and one on the main endpoint.
func linked(t *testing.T, ctx context.Context) (link *Link, viaLink, direct *clientv3.Client) {
	t.Helper()
	srv := Start(t)
	link = srv.Link(t)
	viaLink, direct = link.Client(t), srv.Client(t)
	if _, err := viaLink.Put(ctx, "/k", "1"); err != nil {
		t.Fatalf("put through link: %v", err)
	}
	return link, viaLink, direct
}

func TestLinkCutIsolatesOnlyItsClients(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	link, viaLink, direct := linked(t, ctx)

	link.Cut()
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	if _, err := viaLink.Get(short, "/k"); err == nil {
		t.Fatal("get through a cut link succeeded")
	}
	cancelShort()
	if _, err := direct.Put(ctx, "/k", "2"); err != nil {
		t.Fatalf("put on the main endpoint while the link is cut: %v", err)
	}

	link.Mend()
	resp := getWithin(t, viaLink, "/k", 15*time.Second)
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "2" {
		t.Fatalf("after mend get returned %v, want 2", resp.Kvs)
	}
}

func TestLinkHangHoldsRequestsUntilMend(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	link, viaLink, direct := linked(t, ctx)

	link.Hang()
	got := make(chan *clientv3.GetResponse, 1)
	go func() {
		resp, err := viaLink.Get(ctx, "/k")
		if err != nil {
			t.Errorf("get through a hung link failed instead of waiting: %v", err)
		}
		got <- resp
	}()
	// The main endpoint still serves, and the held Get reaches etcd only
	// after this write: it reads the new value once the link mends.
	if _, err := direct.Put(ctx, "/k", "2"); err != nil {
		t.Fatalf("put on the main endpoint while the link hangs: %v", err)
	}
	select {
	case <-got:
		t.Fatal("get through a hung link returned before Mend")
	default:
	}

	link.Mend()
	select {
	case resp := <-got:
		if resp == nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "2" {
			t.Fatalf("after mend the held get returned %v, want 2", resp)
		}
	case <-ctx.Done():
		t.Fatal("the held get did not return after Mend")
	}
}
