// Package election holds what the regional and global leader loops share
// about etcd elections.
package election

import (
	"context"

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
