// Package election holds what the regional and global leader loops share
// about etcd elections.
package election

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Campaign is el.Campaign(ctx, val) that returns ctx's error as soon as ctx
// ends. When its context ends while it waits behind earlier candidates,
// etcd's Campaign resigns with the client's own context, so against an
// unreachable etcd it blocks until the client is closed, and a daemon
// stopping while etcd is down would never finish stopping. The abandoned
// call ends by itself once etcd answers or the client is closed.
func Campaign(ctx context.Context, el *concurrency.Election, val string) error {
	done := make(chan error, 1)
	go func() { done <- el.Campaign(ctx, val) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ErrKeyLost is Confirm's answer when the candidate's key is gone.
var ErrKeyLost = errors.New("election key lost while campaigning")

// Confirm reads, within timeout, whether el's candidate still holds its
// election key under lease after Campaign returned, and returns ErrKeyLost
// when it does not. etcd's Campaign waits only for the keys created before
// the candidate's own to go; it returns just as well when the candidate's
// own key went with its lease meanwhile (a session that lapsed during an
// etcd outage, its lease dropped once etcd was back), so two replicas
// could each take the lead, one of them with no key at all: after an etcd
// outage two region leaders of one region were both elected within a
// millisecond. Only a key still held under the candidate's lease, with
// every earlier key gone, is the lead.
func Confirm(ctx context.Context, cli *clientv3.Client, el *concurrency.Election, lease clientv3.LeaseID, timeout time.Duration) error {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := cli.Get(rctx, el.Key())
	if err != nil {
		return fmt.Errorf("check the election key: %w", err)
	}
	if len(resp.Kvs) != 1 || clientv3.LeaseID(resp.Kvs[0].Lease) != lease {
		return ErrKeyLost
	}
	return nil
}
