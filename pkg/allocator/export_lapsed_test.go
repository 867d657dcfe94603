package allocator

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Won is writeLapsed fenced on el's candidacy as it is now (won).
func Won(el *concurrency.Election) func(ctx context.Context, cli *clientv3.Client, key string, regions []string) error {
	electionKey, rev := el.Key(), el.Rev()
	return func(ctx context.Context, cli *clientv3.Client, key string, regions []string) error {
		return writeLapsed(ctx, cli, electionKey, rev, key, regions)
	}
}

// Campaign wins the election under pfx in a fresh session and returns it
// with a function that resigns and ends the session. Resigning clears the
// election's key, so take what WriteLapsed needs first (Won).
func Campaign(t *testing.T, cli *clientv3.Client, pfx string) (*concurrency.Election, func()) {
	t.Helper()
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	el := concurrency.NewElection(sess, pfx)
	if err := el.Campaign(t.Context(), "test"); err != nil {
		t.Fatal(err)
	}
	done := false
	resign := func() {
		if done {
			return
		}
		done = true
		if err := el.Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
		sess.Close()
	}
	t.Cleanup(resign)
	return el, resign
}
