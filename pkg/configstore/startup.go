package configstore

import (
	"context"
	"errors"
	"fmt"
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
// A config stored in etcd that is refused (invalid, or with tenant keys
// written outside an apply) does not stop the start while etcd's history
// still holds a valid one: the newest valid config at or before the stored
// revision (Store.LastValid) is made live, which is the config the
// running daemons kept, logged at ERROR and counted
// (sluice_config_started_on_older_revision_total); the watcher reports the
// refusal (sluice_config_stored_refused stays 1) until a good config is
// applied. Without one in the history read, the start fails with an error
// wrapping config.ErrInvalidConfig and ErrNoValidHistory that names the
// key and the fix. An invalid bootstrap is an error wrapping
// config.ErrInvalidConfig; an unreachable etcd is waited for (logged,
// retried with backoff up to 5 s) until ctx ends.
func AwaitEtcdConfig(ctx context.Context, s *Store, bootstrap *config.Config, w *Watcher, logger *slog.Logger) (int64, error) {
	wait := 100 * time.Millisecond
	var rev int64
	for {
		var err error
		rev, err = startAttempt(ctx, s, bootstrap, w, logger)
		if err == nil {
			break
		}
		if errors.Is(err, config.ErrInvalidConfig) || ctx.Err() != nil {
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

// StartOnHistory is AwaitEtcdConfig's recovery for a daemon that serves
// no fallback and does not hold its start for etcd (the agent, which
// answers that no config is loaded meanwhile): until a config from etcd
// is live in w, it reads the stored config, and when that is refused it
// makes the newest valid config in etcd's history live (logged at ERROR
// and counted as AwaitEtcdConfig does), so the daemon runs the revision
// its running peers kept instead of no config at all. Without it such a
// daemon started (or restarted) while a bad config is stored stays
// without a config until a good one is applied.
//
// It returns nil once a config from etcd is live or will be (etcd stores
// a valid one, which w makes live) or etcd answered that it holds none
// (w makes the first one applied live); an error wrapping
// config.ErrInvalidConfig and ErrNoValidHistory when the stored config is
// refused and the history read holds no valid one; ctx.Err() when ctx
// ends. An unreachable etcd is read again with backoff up to 5 s, logged
// at DEBUG only: w reports the outage.
func StartOnHistory(ctx context.Context, s *Store, w *Watcher, logger *slog.Logger) error {
	wait := 100 * time.Millisecond
	for w.Revision() == 0 {
		_, err := startAttempt(ctx, s, nil, w, logger)
		if err == nil || errors.Is(err, config.ErrInvalidConfig) || ctx.Err() != nil {
			return err
		}
		logger.Debug("etcd not reachable; reading the config again", "key", s.Key(), "error", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
	return nil
}

// startAttempt is one try at a start on etcd's config: bootstrap written
// when given and etcd holds none, then etcd's config read, and a refused
// one replaced by the newest valid one in etcd's history (made live in
// w). It returns the revision to start on, 0 when etcd holds no config.
// An error wrapping config.ErrInvalidConfig is final (an invalid
// bootstrap, or no valid config in the history); any other is etcd
// failing, worth another try.
func startAttempt(ctx context.Context, s *Store, bootstrap *config.Config, w *Watcher, logger *slog.Logger) (int64, error) {
	rev, stored, err := bootstrapAndRead(ctx, s, bootstrap, logger)
	var gone *deletedError
	if errors.As(err, &gone) {
		return recoverDeleted(ctx, s, gone.at, w, logger)
	}
	if err == nil || !errors.Is(err, config.ErrInvalidConfig) || stored == 0 {
		return rev, err
	}
	return recoverFromHistory(ctx, s, stored, err, w, logger)
}

// deletedError: etcd holds no config because its key was deleted at
// revision at (Store.DeletedAt), not because none was ever applied.
type deletedError struct{ at int64 }

func (e *deletedError) Error() string {
	return fmt.Sprintf("config key deleted at revision %d", e.at)
}

// recoverDeleted makes the last config the key held before its deletion
// at revision deleted live in w, as the running daemons kept it, and
// returns its revision. No bootstrap is written and no sample run: either
// would put this daemon on other limits than its peers, and a bootstrap
// would move them onto it. With no valid config left in etcd's history the
// start fails (an error wrapping config.ErrInvalidConfig) naming the fix.
func recoverDeleted(ctx context.Context, s *Store, deleted int64, w *Watcher, logger *slog.Logger) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	cfg, rev, err := s.LastValid(ctx, deleted-1)
	if errors.Is(err, ErrNoValidHistory) {
		return 0, fmt.Errorf("%w: %s was deleted at revision %d past sluicectl, and %w, so there is no config to start on (the bootstrap file is not written over a deleted config: the running daemons keep the last one): apply a config with sluicectl apply -f FILE",
			config.ErrInvalidConfig, s.Key(), deleted, err)
	}
	if err != nil {
		return 0, fmt.Errorf("reading etcd's history of %s: %w", s.Key(), err)
	}
	logger.Error("the config key was deleted from etcd past sluicectl; starting on the last config it held (the one the running daemons kept), not on a bootstrap or the sample, until a config is applied with sluicectl apply",
		"key", s.Key(), "deleted_at_revision", deleted, "revision", rev)
	w.adoptDeleted(cfg, rev)
	return rev, nil
}

// recoverFromHistory makes the newest valid config at or before the
// refused stored revision live in w, and returns its revision.
func recoverFromHistory(ctx context.Context, s *Store, stored int64, refused error, w *Watcher, logger *slog.Logger) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	cfg, rev, err := s.LastValid(ctx, stored)
	if errors.Is(err, ErrNoValidHistory) {
		return 0, fmt.Errorf("%w; and %w, so there is no config to start on: apply a good config with sluicectl apply -f FILE", refused, err)
	}
	if err != nil {
		return 0, fmt.Errorf("reading etcd's history of %s: %w", s.Key(), err)
	}
	logger.Error("the config stored in etcd is refused; starting on the newest valid config in etcd's history (the one the running daemons kept) until a good config is applied with sluicectl apply",
		"key", s.Key(), "stored_revision", stored, "revision", rev, "error", refused)
	w.adopt(cfg, rev)
	return rev, nil
}

// bootstrapAndRead writes bootstrap (when given) if etcd holds no config
// and returns the revision of the config etcd holds (0 for none). When
// the stored config is refused it also returns that config's revision
// with the error.
func bootstrapAndRead(ctx context.Context, s *Store, bootstrap *config.Config, logger *slog.Logger) (int64, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	switch deleted, err := deletedNow(ctx, s, logger); {
	case err != nil:
		return 0, 0, err
	case deleted > 0:
		return 0, 0, &deletedError{at: deleted}
	}
	if bootstrap != nil {
		rev, err := s.Apply(ctx, bootstrap, 0)
		switch {
		case err == nil:
			logger.Info("bootstrap config written to etcd", "key", s.Key(), "revision", rev)
			return rev, 0, nil
		case errors.Is(err, ErrConflict):
			logger.Info("etcd already holds a config; it wins over the bootstrap file", "key", s.Key())
		default:
			return 0, 0, err
		}
	}
	cfg, rev, err := s.Get(ctx)
	if err != nil {
		return 0, rev, err
	}
	if cfg == nil {
		return 0, 0, nil
	}
	return rev, 0, nil
}

// historyReadTimeout bounds deletedNow's read of the config key's history.
const historyReadTimeout = 5 * time.Second

// deletedNow is the revision at which the config key was deleted when
// etcd holds no document now (Store.DeletedAt), 0 when it holds one or
// its key was never deleted in the history etcd keeps. A history that
// takes etcd longer than historyReadTimeout to send (a long one, never
// compacted) is taken as holding no deletion, with a warning: a start
// that waited on it would never happen.
func deletedNow(ctx context.Context, s *Store, logger *slog.Logger) (int64, error) {
	fence, err := s.readFence(ctx)
	if err != nil || fence.doc != nil {
		return 0, err
	}
	hctx, cancel := context.WithTimeout(ctx, historyReadTimeout)
	defer cancel()
	deleted, err := s.DeletedAt(hctx, fence.rev)
	if err != nil && ctx.Err() == nil {
		logger.Warn("etcd holds no config, and its key's history could not be read to tell a deleted key from one never written; taking it as never written",
			"key", s.Key(), "error", err)
		return 0, nil
	}
	return deleted, err
}
