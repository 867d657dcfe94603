package configstore

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/sluicehq/sluice/pkg/config"
)

// startTimeout bounds one attempt at reading or writing the config while
// a daemon starts.
const startTimeout = 10 * time.Second

// AwaitEtcdConfig makes a daemon start on the config etcd holds, never on
// a fallback that differs from it (a daemon on the wrong limits hands out
// wrong grants and leases, and one whose region or shard is only in etcd's
// config would refuse to start): it waits until etcd answers, writes
// bootstrap (when not nil) if etcd holds no config (etcd's own config
// wins: a conflict is no error), and then until w, which the caller runs,
// serves etcd's config. It returns the revision served, 0 when etcd holds
// no config and no bootstrap was given (w serves its fallback).
//
// An invalid config in etcd, or an invalid bootstrap, is an error wrapping
// config.ErrInvalidConfig; an unreachable etcd is waited for (logged,
// retried with backoff up to 5 s) until ctx ends.
func AwaitEtcdConfig(ctx context.Context, s *Store, bootstrap *config.Config, w *Watcher, logger *slog.Logger) (int64, error) {
	wait := 100 * time.Millisecond
	var rev int64
	for {
		var err error
		rev, err = bootstrapAndRead(ctx, s, bootstrap, logger)
		if err == nil {
			break
		}
		if errors.Is(err, config.ErrInvalidConfig) {
			return 0, err
		}
		logger.Warn("etcd not reachable; waiting for it before starting", "error", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
	if rev == 0 {
		logger.Warn("etcd holds no config; running on the built-in sample config until one is applied", "key", s.Key())
		return 0, nil
	}
	ticker := time.NewTicker(20 * time.Millisecond)
	defer ticker.Stop()
	for w.Revision() < rev {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-ticker.C:
		}
	}
	return w.Revision(), nil
}

// bootstrapAndRead writes bootstrap (when given) if etcd holds no config
// and returns the revision of the config etcd holds (0 for none).
func bootstrapAndRead(ctx context.Context, s *Store, bootstrap *config.Config, logger *slog.Logger) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if bootstrap != nil {
		rev, err := s.Apply(ctx, bootstrap, 0)
		switch {
		case err == nil:
			logger.Info("bootstrap config written to etcd", "key", s.Key(), "revision", rev)
			return rev, nil
		case errors.Is(err, ErrConflict):
			logger.Info("etcd already holds a config; it wins over the bootstrap file", "key", s.Key())
		default:
			return 0, err
		}
	}
	cfg, rev, err := s.Get(ctx)
	if err != nil {
		return 0, err
	}
	if cfg == nil {
		return 0, nil
	}
	return rev, nil
}
