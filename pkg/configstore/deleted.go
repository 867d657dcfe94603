package configstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
)

// progressEvery is how often DeletedAt asks etcd whether its watch has
// caught up: etcd answers a progress request only once every watch of the
// stream has sent its history, and drops one asked before.
const progressEvery = 20 * time.Millisecond

// DeletedAt is the revision at which the config document was last deleted
// at or before revision upTo, a revision at which etcd held no document:
// 0 when the history etcd keeps shows none (the key was never written, or
// its deletion is compacted away). It reads the key's history with a
// watch from etcd's oldest revision on a stream of its own, up to a
// progress notification at upTo or later.
//
// Why: with no document stored, a starting daemon writes its bootstrap
// file, or runs the built-in sample, which is right for a new deployment.
// After the key was deleted past sluicectl (etcdctl del) the running
// daemons keep the last config, so a daemon started then would run other
// limits than its peers, and its bootstrap would replace theirs at the
// next reload (docs/architecture.md, "Config in etcd").
func (s *Store) DeletedAt(ctx context.Context, upTo int64) (int64, error) {
	// A watch stream is shared by the watches of one outgoing metadata: on
	// a stream of its own, a progress notification is this watch's.
	ctx = metadata.AppendToOutgoingContext(clientv3.WithRequireLeader(ctx), "sluice-config-history", s.key)
	start := int64(1)
	for range 3 {
		deleted, compacted, err := s.deletedFrom(ctx, start, upTo)
		if err != nil || compacted == 0 {
			return deleted, err
		}
		// History before compacted is gone: what is left of it is read.
		start = compacted
	}
	return 0, fmt.Errorf("config: reading the history of %s: etcd compacted it three times while it was read", s.key)
}

// deletedFrom is DeletedAt's read of the history from revision start:
// compacted is etcd's compaction revision when start is older.
func (s *Store) deletedFrom(ctx context.Context, start, upTo int64) (deleted, compacted int64, err error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := s.cli.Watch(wctx, s.key, clientv3.WithRev(start), clientv3.WithProgressNotify())
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return 0, 0, fmt.Errorf("config: reading the history of %s: %w", s.key, ctx.Err())
		case <-tick.C:
			if err := s.cli.RequestProgress(wctx); err != nil && ctx.Err() == nil {
				return 0, 0, fmt.Errorf("config: reading the history of %s: %w", s.key, err)
			}
		case resp, ok := <-wch:
			switch {
			case !ok:
				return 0, 0, fmt.Errorf("config: reading the history of %s: %w", s.key, errors.Join(ctx.Err(), errors.New("watch closed")))
			case resp.CompactRevision > 0:
				return 0, resp.CompactRevision, nil
			case resp.Err() != nil:
				return 0, 0, fmt.Errorf("config: reading the history of %s: %w", s.key, resp.Err())
			}
			for _, ev := range resp.Events {
				if ev.Kv.ModRevision > upTo {
					return deleted, 0, nil
				}
				deleted = 0
				if ev.Type == clientv3.EventTypeDelete {
					deleted = ev.Kv.ModRevision
				}
			}
			if resp.IsProgressNotify() && resp.Header.Revision >= upTo {
				return deleted, 0, nil
			}
		}
	}
}
