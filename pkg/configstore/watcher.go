package configstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluicehq/sluice/internal/shrink"
	"github.com/sluicehq/sluice/pkg/config"
)

const (
	// watchRequestTimeout bounds one request of a read of the config.
	watchRequestTimeout = 5 * time.Second
	// watchRetryMin and watchRetryMax bound the wait between attempts after
	// etcd failed; the wait doubles per failure and resets on success.
	watchRetryMin = 50 * time.Millisecond
	watchRetryMax = 5 * time.Second
	// watchProbeInterval is how often a running watch reads the config
	// key's revision, bounded by the request timeout: the etcd client's
	// watch waits silently through a lost connection (a hung or stopped
	// etcd, a partition), so only a read that fails shows the outage.
	watchProbeInterval = 2 * time.Second
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
	// strayReported is the newest revision of a tenant key written outside
	// an apply that was reported, so that a re-read reports it once.
	// Touched only by the Run goroutine.
	strayReported int64
	// st is the config range as last seen. Touched only by the Run goroutine.
	st watchState
	// docRev is the mod revision of the document as last seen (0: none),
	// written by the Run goroutine and read by its probe: etcd holding an
	// older one went back in time.
	docRev atomic.Int64

	mu      sync.Mutex // guards subs and updates
	subs    map[chan *config.Config]struct{}
	updates <-chan *config.Config

	rejected    prometheus.Counter
	appliedN    prometheus.Counter
	watchErrors prometheus.Counter
	revision    prometheus.Gauge
	// storedRefused is 1 while the config stored in etcd is not live
	// because it was refused, or while etcd holds none after a config
	// from etcd was live (its key deleted), 0 once a stored config is
	// live (or etcd never held one here): unlike the counter, it stays
	// set as long as the bad config stays stored.
	storedRefused prometheus.Gauge
	recovered     prometheus.Counter
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
			Help: "etcd mod revision of the live config; 0 while no config from etcd is live.",
		}),
		storedRefused: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_config_stored_refused",
			Help: "1 while the config stored in etcd is refused (invalid, or tenant keys written outside an apply), or its key was deleted, and an older config stays live; 0 once a stored config is live.",
		}),
		recovered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_config_started_on_older_revision_total",
			Help: "Starts on an older valid config from etcd's history because the stored config was refused.",
		}),
	}
	w.live.Store(&applied{cfg: fallback})
	if reg != nil {
		reg.MustRegister(w.rejected, w.appliedN, w.watchErrors, w.revision, w.storedRefused, w.recovered)
	}
	return w
}

// Current is the live config. Lock-free. The caller must not modify it.
func (w *Watcher) Current() *config.Config { return w.live.Load().cfg }

// Revision is the etcd mod revision of the live config, 0 for the fallback.
func (w *Watcher) Revision() int64 { return w.live.Load().rev }

// ErrHistoryTruncated is wrapped by History when more configs were
// committed after the first revision than it reads: the older ones are
// left out, so a confirmation of one of them does not bound the reader.
var ErrHistoryTruncated = errors.New("configstore: more configs committed since than read")

// Committed is a config and the revision that committed it.
type Committed struct {
	Rev int64
	Cfg *config.Config
}

// History is the config revision from committed (Store.At), then those
// committed after it and before revision until, oldest first, at most
// max-1 of them (the newest; Store.RevisionsBetween): a process starting
// on a newer config reads with it the one last confirmed to its region
// and those its region may have run since. An error reading from's config
// is returned alone; one reading the later ones is returned with the
// configs read, and so is one wrapping ErrHistoryTruncated when more than
// max-1 were committed after from (the older ones are left out). max is
// at least 1. Each request is bounded as the watcher's reads are, the
// whole read as one attempt at start is: etcd not answering is an error
// then, never a longer wait.
func (w *Watcher) History(ctx context.Context, from, until int64, max int) ([]Committed, error) {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	// A closed client would otherwise keep the read in its retry loop.
	defer context.AfterFunc(w.store.cli.Ctx(), cancel)()
	store := *w.store
	if store.requestTimeout <= 0 {
		store.requestTimeout = watchRequestTimeout
	}
	cfg, err := store.At(ctx, from)
	if err != nil {
		return nil, err
	}
	out := []Committed{{Rev: from, Cfg: cfg}}
	// One more than kept: more committed than max-1 is said, not silent.
	revs, err := store.RevisionsBetween(ctx, from, until, max)
	if err != nil {
		return out, fmt.Errorf("the configs committed after revision %d: %w", from, err)
	}
	var truncated error
	if len(revs) > max-1 {
		truncated = fmt.Errorf("%w: more than %d configs committed after revision %d and before %d; left out revision %d and any before it",
			ErrHistoryTruncated, max-1, from, until, revs[0])
		revs = revs[1:]
	}
	for _, rev := range revs {
		cfg, err := store.At(ctx, rev)
		if err != nil {
			return out, err
		}
		out = append(out, Committed{Rev: rev, Cfg: cfg})
	}
	return out, truncated
}

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
// leader, etcd restart, etcd not answering a periodic read) or etcd cannot
// be read, it counts the failure, reads again after a growing pause, and
// the live config stays meanwhile. An outage is logged once at WARN
// ("config watch interrupted") and its end once ("config watch resumed"). Run returns nil when
// ctx is done, and an error when the etcd client was closed or Run is
// already running.
func (w *Watcher) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("config watcher: Run is already running")
	}
	defer w.running.Store(false)
	wait := watchRetryMin
	// failing is set from a failed read or watch until a read succeeds:
	// an outage is logged once at WARN, its further failures at DEBUG
	// (all counted), and its end once.
	failing := false
	for {
		rev, err := w.load(ctx)
		if err == nil {
			wait = watchRetryMin
			if failing {
				w.logger.Info("config watch resumed; etcd answers again",
					"key", w.store.key, "live_revision", w.Revision())
				failing = false
			}
			err = w.follow(ctx, rev)
		}
		if ctx.Err() != nil {
			return nil
		}
		if cerr := w.store.cli.Ctx().Err(); cerr != nil {
			return fmt.Errorf("config watcher: etcd client closed: %w", cerr)
		}
		level := slog.LevelWarn
		if failing {
			level = slog.LevelDebug
		}
		failing = true
		msg := "config watch interrupted; live config kept, reading again"
		if w.Revision() == 0 {
			msg = "config watch interrupted before any config from etcd was live; reading again"
		}
		w.logger.Log(ctx, level, msg,
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

// watchState is the config range as the Run goroutine last saw it: the
// document and every tenant key, with what changed since the last config
// made live. Touched only by the Run goroutine.
type watchState struct {
	doc    []byte
	docRev int64
	// docCfg is doc parsed, nil until it parsed; needFull is set while the
	// document changed since the last config made live, so the next one is
	// validated whole.
	docCfg   *config.Config
	needFull bool
	// applying is set while a batched apply's marker exists: its writes are
	// held until its commit.
	applying bool
	// commit is set when the document was written since the last attempt.
	commit bool
	// tenants are the tenant keys that parse; shared is set while the live
	// config uses the map itself, which must then be copied before a change.
	// removed counts the tenants deleted from the map since it was last
	// made to its size (see compactTenants).
	tenants map[string]config.Tenant
	shared  bool
	removed int
	// bad are tenant keys that do not parse; dirty the tenants changed
	// since the last config made live.
	bad   map[string]error
	dirty map[string]struct{}
	// stray are tenant keys written outside an apply (at a revision that
	// did not write the document, with no batched apply in progress), id
	// to revision; the next document write judges them with the rest.
	stray map[string]int64
}

// newWatchState is an empty state with room for n tenants.
func newWatchState(n int) watchState {
	return watchState{tenants: make(map[string]config.Tenant, n), bad: map[string]error{}, dirty: map[string]struct{}{}}
}

func (st *watchState) setTenant(id string, value []byte, deleted bool) {
	if st.shared {
		st.tenants = maps.Clone(st.tenants)
		st.shared = false
	}
	st.dirty[id] = struct{}{}
	delete(st.bad, id)
	if deleted {
		st.removeTenant(id)
		return
	}
	t, err := config.ParseTenant(value)
	if err != nil {
		st.removeTenant(id)
		st.bad[id] = err
		return
	}
	st.tenants[id] = t
}

func (st *watchState) removeTenant(id string) {
	if _, ok := st.tenants[id]; ok {
		delete(st.tenants, id)
		st.removed++
	}
}

// compactTenants replaces the tenant map by a copy made to its size once
// the tenants removed from it since it was last made number a quarter of
// those it holds. A Go map never gives back the room of deleted entries,
// and maps.Clone (the copy before each change) keeps that room, so without
// this the live config of a watcher that saw many tenants come and go (an
// apply that renames them) keeps room for removed tenants, more after each
// such reload (about 0.25 MiB per reload renaming 100,000 tenants). The
// copy is O(n), paid for by the n/4 removals before it. The map must not be
// shared.
func (st *watchState) compactTenants() {
	if st.removed < max(shrink.MinPeak, len(st.tenants)/4) {
		return
	}
	fresh := make(map[string]config.Tenant, len(st.tenants))
	maps.Copy(fresh, st.tenants)
	st.tenants, st.removed = fresh, 0
}

// load reads the config range and makes it live if it is new and valid,
// and returns the store revision the watch must continue after. While a
// batched apply is in progress it reads the range as it was before the
// apply began, and the watch replays the apply from there.
func (w *Watcher) load(ctx context.Context) (int64, error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A closed client would otherwise keep the read in its retry loop.
	defer context.AfterFunc(w.store.cli.Ctx(), cancel)()
	// Each request is bounded, not the whole read: a million tenants take
	// many pages.
	store := *w.store
	if store.requestTimeout <= 0 {
		store.requestTimeout = watchRequestTimeout
	}
	fence, err := store.readFence(rctx)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", w.store.key, err)
	}
	at := int64(0)
	if fence.applying != nil {
		at = fence.applying.Created - 1
		w.logger.Info("a batched config apply is in progress; reading the config committed before it",
			"key", w.store.key, "marker", fence.applying.String())
	}
	r, err := store.readRaw(rctx, at)
	if err != nil {
		return 0, err
	}
	docRev := int64(0)
	if r.doc != nil {
		docRev = r.doc.ModRevision
	}
	if seen := w.docRev.Load(); fence.rev < w.seenRev || docRev < seen {
		// etcd's history went backwards (restored from a backup): revisions
		// seen before mean nothing now. A restored etcd may have passed the
		// revisions seen already; its document is still older.
		w.logger.Warn("etcd revision went backwards; forgetting revisions seen before",
			"key", w.store.key, "etcd_revision", fence.rev, "seen_revision", w.seenRev,
			"document_revision", docRev, "seen_document_revision", seen)
		w.seenRev, w.strayReported = 0, 0
	}
	w.docRev.Store(docRev)
	st := newWatchState(len(r.tenants))
	for id, v := range r.tenants {
		st.setTenant(id, v, false)
	}
	st.dirty = map[string]struct{}{}
	st.needFull = true
	w.st = st
	if r.doc == nil {
		if w.Revision() == 0 {
			// What runs meanwhile is the daemon's to say: its fallback, or
			// (the agent) no config at all.
			w.storedRefused.Set(0)
			w.logger.Info("etcd holds no config yet; the first one applied becomes live", "key", w.store.key)
		} else {
			// The key was deleted past sluicectl: what runs is no longer
			// stored, so a daemon that starts runs something else.
			w.storedRefused.Set(1)
			w.logger.Error("config key is gone from etcd; keeping the last good config until one is applied with sluicectl apply",
				"key", w.store.key, "live_revision", w.Revision())
		}
		return r.rev, nil
	}
	w.st.doc, w.st.docRev = r.doc.Value, r.doc.ModRevision
	if len(r.stray) > 0 {
		// The stored range is not what the document's revision committed:
		// keep the live config (the start recovers the committed one from
		// etcd's history) and report it.
		w.st.stray = r.stray
		w.reportStray()
		return r.rev, nil
	}
	w.commit(ctx)
	return r.rev, nil
}

// follow watches the config range from rev+1 until the watch ends, which
// is always an error (or ctx ending). Changes are gathered per revision;
// a revision that wrote the document commits them. Every
// watchProbeInterval a bounded read checks that etcd still answers, at a
// revision no older than the watch has reached; one that fails ends the
// watch as broken.
func (w *Watcher) follow(ctx context.Context, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	// A failed probe ends the watch, even one still being set up (Watch
	// itself waits for etcd then).
	var probeErr error // written before probed closes
	probed := make(chan struct{})
	var reached atomic.Int64 // the newest revision the watch reported
	reached.Store(rev)
	go func() {
		defer close(probed)
		if err := w.probe(wctx, &reached); err != nil {
			probeErr = err
			cancel()
		}
	}()
	defer func() { cancel(); <-probed }()
	for resp := range w.store.cli.Watch(wctx, w.store.key, clientv3.WithRange(w.store.rangeEnd()), clientv3.WithRev(rev+1)) {
		if err := resp.Err(); err != nil {
			return fmt.Errorf("watch %s from revision %d: %w", w.store.key, rev+1, err)
		}
		for i, ev := range resp.Events {
			w.event(ev)
			if i+1 == len(resp.Events) || resp.Events[i+1].Kv.ModRevision != ev.Kv.ModRevision {
				w.commit(ctx)
			}
		}
		rev = resp.Header.Revision
		if rev > reached.Load() {
			reached.Store(rev)
		}
	}
	cancel()
	<-probed
	if errors.Is(probeErr, errWentBack) {
		return fmt.Errorf("watching %s from revision %d: %w", w.store.key, rev+1, probeErr)
	}
	if probeErr != nil {
		return fmt.Errorf("watching %s from revision %d, etcd did not answer a read of it: %w", w.store.key, rev+1, probeErr)
	}
	return errors.New("watch channel closed")
}

// errWentBack is a probe's read answered at a revision older than the
// watch had reached.
var errWentBack = errors.New("etcd went back in time (restored from a backup)")

// probe reads the config key's revision every watchProbeInterval, each read
// bounded by the request timeout, until one fails (its error) or ctx ends
// (nil). A read needs the etcd leader, as the watch does. A read answered
// at a revision older than reached, the newest the watch reported, or
// finding the document written at a revision older than the one seen
// (docRev; a restored etcd may have passed reached already), fails too:
// etcd was restored from a backup, and the etcd client resumed the watch
// silently at a revision of the old history; only a new read (load) sees
// what it holds.
func (w *Watcher) probe(ctx context.Context, reached *atomic.Int64) error {
	timeout := w.store.requestTimeout
	if timeout <= 0 {
		timeout = watchRequestTimeout
	}
	t := time.NewTicker(watchProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, timeout)
		// Seen before the read is sent: etcd had them when it answers.
		watched, seen := reached.Load(), w.docRev.Load()
		resp, err := w.store.cli.Get(pctx, w.store.key, clientv3.WithKeysOnly())
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		if at := resp.Header.Revision; at < watched {
			return fmt.Errorf("%w: a read answered at revision %d, older than the %d the watch reached", errWentBack, at, watched)
		}
		if len(resp.Kvs) > 0 && resp.Kvs[0].ModRevision < seen {
			return fmt.Errorf("%w: etcd holds the config written at revision %d, older than the one seen at %d", errWentBack, resp.Kvs[0].ModRevision, seen)
		}
	}
}

// event records one change of the config range.
func (w *Watcher) event(ev *clientv3.Event) {
	st := &w.st
	kind, id := w.store.classify(string(ev.Kv.Key))
	deleted := ev.Type == clientv3.EventTypeDelete
	switch kind {
	case kindDocument:
		if deleted {
			w.docRev.Store(0)
			// Not a change: the live config stays. But it is no longer
			// stored, so a daemon that starts would not run it: reported
			// as a refused stored config is, until a config is applied.
			w.logger.Error("config key deleted from etcd; keeping the last good config until one is applied with sluicectl apply",
				"key", w.store.key, "revision", ev.Kv.ModRevision, "live_revision", w.Revision())
			if w.Revision() != 0 {
				w.storedRefused.Set(1)
			}
			return
		}
		if !bytes.Equal(st.doc, ev.Kv.Value) {
			// Every commit writes the document; only a new one is parsed
			// and makes the next config validated whole.
			st.docCfg, st.needFull = nil, true
		}
		st.doc, st.docRev, st.commit = ev.Kv.Value, ev.Kv.ModRevision, true
		w.docRev.Store(ev.Kv.ModRevision)
	case kindApplying:
		if !deleted && !st.applying {
			w.logger.Info("a batched config apply began; its changes wait for its commit",
				"key", w.store.ApplyingKey(), "revision", ev.Kv.ModRevision, "live_revision", w.Revision())
		}
		st.applying = !deleted
	case kindTenant:
		st.setTenant(id, ev.Kv.Value, deleted)
		if !st.applying {
			// Stray unless the document is written in the same revision,
			// as every apply does (commit clears it then).
			if st.stray == nil {
				st.stray = map[string]int64{}
			}
			st.stray[id] = ev.Kv.ModRevision
		}
	}
}

// reportStray refuses the stored config for its tenant keys written
// outside an apply, once per newest such write: the live config stays.
// The config revision is the document's, which every daemon reports and
// compares; a key written past it would make daemons that read it at
// different times run different configs under one revision.
func (w *Watcher) reportStray() {
	st := &w.st
	newest := int64(0)
	for _, r := range st.stray {
		newest = max(newest, r)
	}
	if newest <= w.strayReported {
		return
	}
	w.strayReported = newest
	err := w.store.strayError(st.docRev, st.stray, func(id string) error { return st.bad[id] })
	w.logger.Error("refused config stored in etcd: tenant keys written outside an apply; the last good config stays live",
		"key", w.store.key, "revision", newest, "live_revision", w.Revision(), "error", err)
	w.storedRefused.Set(1)
	w.rejected.Inc()
}

// commit makes the gathered changes live when the document was written
// and no batched apply is in progress, and they are valid: the document
// and all tenants when the document changed, else only the tenants that
// changed. Otherwise the last good config stays live.
func (w *Watcher) commit(ctx context.Context) {
	st := &w.st
	if st.commit {
		st.stray = nil
	} else if len(st.stray) > 0 && !st.applying && st.doc != nil {
		w.reportStray()
		return
	}
	if !st.commit && st.docCfg != nil || st.applying || st.doc == nil {
		return
	}
	st.commit = false
	rev := st.docRev
	if rev <= w.seenRev {
		return
	}
	w.seenRev = rev
	refuse := func(err error) {
		// Log before counting: whoever sees the counter move can rely on
		// the line that explains it being there already.
		w.logger.Error("refused invalid config from etcd; the last good config stays live",
			"key", w.store.key, "revision", rev, "live_revision", w.Revision(), "error", err)
		w.storedRefused.Set(1)
		w.rejected.Inc()
	}
	if len(st.bad) > 0 {
		var errs []error
		for _, id := range slices.Sorted(maps.Keys(st.bad))[:min(len(st.bad), 5)] {
			errs = append(errs, fmt.Errorf("%s: %w", w.store.TenantKey(id), st.bad[id]))
		}
		if len(st.bad) > 5 {
			errs = append(errs, fmt.Errorf("and %d more tenant keys that do not parse", len(st.bad)-5))
		}
		refuse(errors.Join(errs...))
		return
	}
	if st.docCfg == nil {
		cfg, err := config.ParseContext(ctx, st.doc)
		if err != nil {
			if ctx.Err() == nil {
				refuse(err)
			}
			return
		}
		st.docCfg = cfg
	}
	next := *st.docCfg
	switch {
	case len(st.docCfg.Tenants) > 0:
		// A document written before tenants had keys: its tenants, with the
		// keys winning.
		next.Tenants = maps.Clone(st.docCfg.Tenants)
		maps.Copy(next.Tenants, st.tenants)
	case len(st.tenants) > 0:
		if !st.shared {
			st.compactTenants()
		}
		next.Tenants = st.tenants
	default:
		next.Tenants = nil
	}
	var err error
	if st.needFull {
		err = next.ValidateContext(ctx)
	} else {
		var errs []error
		for id := range st.dirty {
			if t, ok := next.Tenants[id]; ok {
				if e := next.TenantProblems(id, t); e != nil {
					errs = append(errs, e)
				}
			}
		}
		err = errors.Join(errs...)
	}
	if ctx.Err() != nil {
		w.seenRev = rev - 1 // not judged: the next load judges it
		return
	}
	if err != nil {
		refuse(err)
		return
	}
	if len(st.docCfg.Tenants) == 0 && len(st.tenants) > 0 {
		st.shared = true
	}
	changed := len(st.dirty)
	st.dirty = map[string]struct{}{}
	full := st.needFull
	st.needFull = false
	cfg := &next
	// The metrics move first: whoever sees this config live (Live, a
	// subscriber) also sees it counted.
	w.revision.Set(float64(rev))
	w.storedRefused.Set(0)
	w.appliedN.Inc()
	w.live.Store(&applied{cfg: cfg, rev: rev})
	w.logger.Info("applied config from etcd", "key", w.store.key, "revision", rev,
		"tenants", len(cfg.Tenants), "tenants_changed", changed, "validated_whole", full)
	w.publish(cfg)
}

// adopt makes cfg, valid and committed at rev, live unless a config of
// rev or newer already is: a start on an older revision from etcd's
// history while the stored one is refused (see AwaitEtcdConfig). It
// reports whether cfg became live.
func (w *Watcher) adopt(cfg *config.Config, rev int64) bool {
	next := &applied{cfg: cfg, rev: rev}
	for {
		cur := w.live.Load()
		if cur.rev >= rev {
			return false
		}
		if w.live.CompareAndSwap(cur, next) {
			break
		}
	}
	w.revision.Set(float64(w.Revision()))
	w.recovered.Inc()
	w.publish(cfg)
	return true
}

// adoptDeleted is adopt for a config whose key was deleted since: what runs
// is not stored, which sluice_config_stored_refused says until a config is
// applied (Run's first read may have come before, and seen no config yet).
func (w *Watcher) adoptDeleted(cfg *config.Config, rev int64) {
	if w.adopt(cfg, rev) {
		w.storedRefused.Set(1)
	}
}
