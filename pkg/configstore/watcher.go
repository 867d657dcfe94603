package configstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluicehq/sluice/pkg/config"
)

const (
	// watchRequestTimeout bounds one read of the config key.
	watchRequestTimeout = 5 * time.Second
	// watchRetryMin and watchRetryMax bound the wait between attempts after
	// etcd failed; the wait doubles per failure and resets on success.
	watchRetryMin = 50 * time.Millisecond
	watchRetryMax = 5 * time.Second
)

// applied is one live config and the etcd revision it came from (0 for the
// fallback).
type applied struct {
	cfg *config.Config
	rev int64
}

// Watcher keeps the live config: the last valid one seen in etcd, or the
// fallback until there is one. It never applies an invalid config and
// keeps the last good one through any etcd outage. Safe for concurrent
// use; a second Run while one is running returns an error at once.
type Watcher struct {
	store  *Store
	logger *slog.Logger
	live   atomic.Pointer[applied]
	// running refuses a second concurrent Run, which would race on seenRev.
	running atomic.Bool

	// seenRev is the newest revision handled, applied or refused, so that a
	// re-read after a watch error never counts a refusal twice. Touched only
	// by the Run goroutine.
	seenRev int64

	mu      sync.Mutex // guards subs and updates
	subs    map[chan *config.Config]struct{}
	updates <-chan *config.Config

	rejected    prometheus.Counter
	appliedN    prometheus.Counter
	watchErrors prometheus.Counter
	revision    prometheus.Gauge
}

// NewWatcher makes a Watcher serving fallback (Default() if nil) until etcd
// holds a valid config. Its metrics, all named sluice_config_*, are
// registered on reg unless reg is nil; registering two Watchers on one
// registry panics. A nil logger discards logs.
func NewWatcher(store *Store, fallback *config.Config, logger *slog.Logger, reg prometheus.Registerer) *Watcher {
	if fallback == nil {
		fallback = config.Default()
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	w := &Watcher{
		store:  store,
		logger: logger,
		subs:   make(map[chan *config.Config]struct{}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_config_rejected_total",
			Help: "Configs found in etcd that failed validation and were not applied.",
		}),
		appliedN: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_config_applied_total",
			Help: "Valid configs from etcd made live.",
		}),
		watchErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_config_watch_errors_total",
			Help: "Failed reads or broken watches of the config key; each is followed by a re-read.",
		}),
		revision: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_config_last_applied_revision",
			Help: "etcd mod revision of the live config; 0 while the built-in fallback is live.",
		}),
	}
	w.live.Store(&applied{cfg: fallback})
	if reg != nil {
		reg.MustRegister(w.rejected, w.appliedN, w.watchErrors, w.revision)
	}
	return w
}

// Current is the live config. Lock-free. The caller must not modify it.
func (w *Watcher) Current() *config.Config { return w.live.Load().cfg }

// Revision is the etcd mod revision of the live config, 0 for the fallback.
func (w *Watcher) Revision() int64 { return w.live.Load().rev }

// Live is the live config and its etcd mod revision (0 for the fallback),
// read together. Lock-free. The caller must not modify the config.
func (w *Watcher) Live() (*config.Config, int64) {
	a := w.live.Load()
	return a.cfg, a.rev
}

// Subscribe returns a channel that receives every config made live from
// now on, and a function ending the subscription. The channel holds one
// config: when the subscriber falls behind, an undelivered older config is
// replaced by the newer one (latest wins), so the watcher never blocks.
// The channel is never closed. Subscribe before reading Current to miss no
// change.
func (w *Watcher) Subscribe() (<-chan *config.Config, func()) {
	ch := make(chan *config.Config, 1)
	w.mu.Lock()
	w.subs[ch] = struct{}{}
	w.mu.Unlock()
	return ch, func() {
		w.mu.Lock()
		delete(w.subs, ch)
		w.mu.Unlock()
	}
}

// Updates is one shared subscription, made on first call and kept for the
// Watcher's life, for a daemon with a single consumer of config changes;
// it has Subscribe's latest-wins semantics.
func (w *Watcher) Updates() <-chan *config.Config {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.updates == nil {
		ch := make(chan *config.Config, 1)
		w.subs[ch] = struct{}{}
		w.updates = ch
	}
	return w.updates
}

func (w *Watcher) publish(cfg *config.Config) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.subs {
		select {
		case ch <- cfg:
			continue
		default:
		}
		// Full: drop the stale config. Only publish sends, under mu, so the
		// second send finds room unless the subscriber raced us to it.
		select {
		case <-ch:
		default:
		}
		select {
		case ch <- cfg:
		default:
		}
	}
}

// Run reads the config, then follows changes with an etcd watch that
// continues from the revision read. When the watch breaks (compaction, lost
// leader, etcd restart) or etcd cannot be read, it reads again after a
// growing pause, and the live config stays meanwhile. Run returns nil when
// ctx is done, and an error when the etcd client was closed or Run is
// already running.
func (w *Watcher) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("config watcher: Run is already running")
	}
	defer w.running.Store(false)
	wait := watchRetryMin
	for {
		rev, err := w.load(ctx)
		if err == nil {
			wait = watchRetryMin
			err = w.follow(ctx, rev)
		}
		if ctx.Err() != nil {
			return nil
		}
		if cerr := w.store.cli.Ctx().Err(); cerr != nil {
			return fmt.Errorf("config watcher: etcd client closed: %w", cerr)
		}
		w.logger.Warn("config watch interrupted; live config kept, reading again",
			"key", w.store.key, "live_revision", w.Revision(), "retry_in", wait, "error", err)
		w.watchErrors.Inc()
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		}
		wait = min(2*wait, watchRetryMax)
	}
}

// load reads the config key, considers its value, and returns the store
// revision the watch must continue after.
func (w *Watcher) load(ctx context.Context) (int64, error) {
	rctx, cancel := context.WithTimeout(ctx, watchRequestTimeout)
	defer cancel()
	// A closed client would otherwise keep the read in its retry loop.
	defer context.AfterFunc(w.store.cli.Ctx(), cancel)()
	resp, err := w.store.cli.Get(rctx, w.store.key)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", w.store.key, err)
	}
	if resp.Header.Revision < w.seenRev {
		// etcd's history went backwards (restored from a backup): revisions
		// seen before mean nothing now.
		w.logger.Warn("etcd revision went backwards; forgetting revisions seen before",
			"key", w.store.key, "etcd_revision", resp.Header.Revision, "seen_revision", w.seenRev)
		w.seenRev = 0
	}
	if len(resp.Kvs) == 0 {
		if w.Revision() == 0 {
			w.logger.Info("no config in etcd; running on the built-in fallback", "key", w.store.key)
		} else {
			w.logger.Warn("config key is gone from etcd; keeping the last good config",
				"key", w.store.key, "live_revision", w.Revision())
		}
		return resp.Header.Revision, nil
	}
	kv := resp.Kvs[0]
	w.consider(kv.Value, kv.ModRevision)
	return resp.Header.Revision, nil
}

// follow watches the key from rev+1 until the watch ends, which is always
// an error (or ctx ending).
func (w *Watcher) follow(ctx context.Context, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for resp := range w.store.cli.Watch(wctx, w.store.key, clientv3.WithRev(rev+1)) {
		if err := resp.Err(); err != nil {
			return fmt.Errorf("watch %s from revision %d: %w", w.store.key, rev+1, err)
		}
		for _, ev := range resp.Events {
			switch ev.Type {
			case clientv3.EventTypePut:
				w.consider(ev.Kv.Value, ev.Kv.ModRevision)
			case clientv3.EventTypeDelete:
				w.logger.Warn("config key deleted from etcd; keeping the last good config",
					"key", w.store.key, "revision", ev.Kv.ModRevision, "live_revision", w.Revision())
			}
		}
		rev = resp.Header.Revision
	}
	return errors.New("watch channel closed")
}

// consider applies a config value found at rev if it is new and valid.
func (w *Watcher) consider(value []byte, rev int64) {
	if rev <= w.seenRev {
		return
	}
	w.seenRev = rev
	cfg, err := config.Parse(value)
	if err != nil {
		// Log before counting: whoever sees the counter move can rely on
		// the line that explains it being there already.
		w.logger.Error("refused invalid config from etcd; the last good config stays live",
			"key", w.store.key, "revision", rev, "live_revision", w.Revision(), "error", err)
		w.rejected.Inc()
		return
	}
	w.live.Store(&applied{cfg: cfg, rev: rev})
	w.revision.Set(float64(rev))
	w.appliedN.Inc()
	w.logger.Info("applied config from etcd", "key", w.store.key, "revision", rev)
	w.publish(cfg)
}
