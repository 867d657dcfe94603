package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	randv2 "math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
)

// Options configures a Client.
type Options struct {
	// InstanceID names this process to the region (optional, default
	// "inst-" and 16 random hex digits; UniqueID makes one from a prefix).
	// 1-128 bytes of [A-Za-z0-9._:@-]; must not be shared by two live
	// processes. If it is, the region refuses the reports that conflict
	// (ABORTED, forfeiting the lease they hit) and the client takes a new
	// identity: InstanceID plus a random suffix.
	InstanceID string
	// Refresh is the period of the background Sync (optional, default 1s).
	// The region's lease TTL must exceed 2 × Refresh.
	Refresh time.Duration
	// SyncTimeout bounds one background Sync or Release RPC (optional,
	// default Refresh/2).
	SyncTimeout time.Duration
	// BreakerTimeout bounds a synchronous Acquire or Check, and a request's
	// wait for a refill already in flight (optional, default 50ms).
	BreakerTimeout time.Duration
	// BreakerFailures is how many consecutive failed RPCs open the circuit
	// breaker (optional, default 3).
	BreakerFailures int
	// BreakerCooldown is how long the open breaker skips synchronous RPCs
	// before letting one probe through (optional, default 1s).
	BreakerCooldown time.Duration
	// IdleTimeout: a key without demand for this long is forgotten and its
	// tokens released (optional, default 10 × Refresh).
	IdleTimeout time.Duration
	// Classes gives each class's mode and on_failure policy before the
	// region has answered for a key (optional; unknown classes are leased
	// and fail to the local policy).
	Classes map[string]ClassPolicy
	// FallbackLimit is the local policy's limit (tokens/s, tokens) for a
	// key the region never described (optional, default 10/s, burst 10).
	FallbackLimit quota.Limit
	// Logger receives degraded-mode transitions and protocol anomalies
	// (optional, default discards).
	Logger *slog.Logger
	// Registerer receives the sluice_client_* metrics (optional, default
	// none); they are unregistered by Close.
	Registerer prometheus.Registerer
}

var errBreakerOpen = errors.New("circuit breaker open")

func (o Options) withDefaults() (Options, error) {
	if o.InstanceID == "" {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return o, fmt.Errorf("lease: generating an instance id: %w", err)
		}
		o.InstanceID = "inst-" + hex.EncodeToString(b[:])
	}
	if err := quota.ValidateID("InstanceID", o.InstanceID); err != nil {
		return o, fmt.Errorf("lease client options: %w", err)
	}
	durations := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"Refresh", &o.Refresh, DefaultRefresh},
		{"BreakerTimeout", &o.BreakerTimeout, DefaultBreakerTimeout},
		{"BreakerCooldown", &o.BreakerCooldown, DefaultBreakerCooldown},
		{"SyncTimeout", &o.SyncTimeout, 0},
		{"IdleTimeout", &o.IdleTimeout, 0},
	}
	for _, d := range durations {
		if *d.v < 0 {
			return o, fmt.Errorf("%w: lease client option %s %v is negative", quota.ErrInvalid, d.name, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if o.SyncTimeout == 0 {
		o.SyncTimeout = DefaultSyncTimeout(o.Refresh)
	}
	if o.BreakerFailures < 0 {
		return o, fmt.Errorf("%w: lease client option BreakerFailures %d is negative", quota.ErrInvalid, o.BreakerFailures)
	}
	if o.BreakerFailures == 0 {
		o.BreakerFailures = DefaultBreakerFailures
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// Client is the instance side of the lease protocol: it answers Allow from
// leased tokens held in memory, refills and reports in the background, and
// falls back to each class's on_failure policy while the regional service
// cannot be reached. Safe for concurrent use. It satisfies the Limiter
// interface of pkg/httplimit.
type Client struct {
	opts    Options
	table   *Table
	rpc     sluicev1.LeaseServiceClient
	breaker *Breaker
	log     *slog.Logger
	m       *metrics

	kick     chan struct{} // buffered 1: a key crossed its low-water mark
	stop     chan struct{} // closed by Close
	loopDone chan struct{}
	bg       context.Context // parent of background RPCs; cancelled by Close
	cancelBg context.CancelFunc

	closed   atomic.Bool
	degraded atomic.Bool // last logged degraded state

	// id is the instance id reports go out under: opts.InstanceID until a
	// conflict makes the client take a new one. incarnation is drawn once.
	id          atomic.Pointer[string]
	incarnation uint64
	conflicted  atomic.Bool // a report conflicted; the loop re-identifies
}

// Client is what pkg/httplimit's middleware needs of a limiter.
var _ interface {
	Allow(ctx context.Context, key quota.Key, cost int64) (quota.Decision, error)
} = (*Client)(nil)

// NewClient starts a client on conn (a connection to the region's
// LeaseService). Close must be called to stop its background loop and
// release its tokens.
func NewClient(conn grpc.ClientConnInterface, opts Options) (*Client, error) {
	if conn == nil {
		return nil, fmt.Errorf("%w: lease client connection is nil", quota.ErrInvalid)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	table, err := NewTable(TableOptions{
		Refresh:       o.Refresh,
		IdleTimeout:   o.IdleTimeout,
		Classes:       o.Classes,
		FallbackLimit: o.FallbackLimit,
		// Above every seq an earlier process with the same id could have
		// sent (unless the wall clock went backwards, or it averaged more
		// than a million reports a second), and far below the region's
		// 2^53 limit.
		SeqBase: uint64(time.Now().UnixMicro()),
	})
	if err != nil {
		return nil, fmt.Errorf("lease client options: %w", err)
	}
	m, err := newMetrics(o.Registerer, table)
	if err != nil {
		return nil, err
	}
	c := &Client{
		opts:     o,
		table:    table,
		rpc:      sluicev1.NewLeaseServiceClient(conn),
		breaker:  NewBreaker(o.BreakerFailures, o.BreakerCooldown),
		log:      o.Logger,
		m:        m,
		kick:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		loopDone: make(chan struct{}),

		incarnation: newIncarnation(),
	}
	c.id.Store(&o.InstanceID)
	c.bg, c.cancelBg = context.WithCancel(context.Background())
	go c.loop()
	return c, nil
}

// InstanceID is the id this client reports as now.
func (c *Client) InstanceID() string { return *c.id.Load() }

// Incarnation is the random number this client's requests carry.
func (c *Client) Incarnation() uint64 { return c.incarnation }

// Table exposes the client's state machine (read-only use: State, Counts,
// DegradedKeys, HeldTokens).
func (c *Client) Table() *Table { return c.table }

// Allow decides whether a request of cost tokens on key may proceed. Over
// quota is a Decision with Allowed false, never an error; errors mean bad
// input (wrapping quota.ErrInvalid) or a closed client (ErrClosed).
//
// While the key holds tokens and its lease is far from its deadline, the
// decision is one compare-and-swap on the key's pool, without locks, clock
// reads or allocation. Otherwise it may wait up to BreakerTimeout for the
// region (a synchronous Acquire, a refill already in flight, or a strict
// Check) before the class's on_failure policy decides (Degraded). A ctx
// that ends sooner shortens that wait the same way; it does not count as a
// failure of the region for the circuit breaker.
func (c *Client) Allow(ctx context.Context, key quota.Key, cost int64) (quota.Decision, error) {
	var start time.Time
	sampled := randv2.Uint32()%fastSampleRate == 0
	if sampled {
		start = time.Now()
	}
	if in, remaining, refill, ok := c.table.allowFast(key, cost); ok {
		if refill {
			c.kickLoop()
		}
		if sampled {
			c.m.fast.Observe(time.Since(start).Seconds())
		}
		return quota.Decision{Allowed: true, Limit: in.limit, Remaining: remaining, ResetAt: in.resetAt}, nil
	}
	if !sampled {
		start = time.Now()
	}
	d, err := c.allowSlow(ctx, key, cost)
	c.m.slow.Observe(time.Since(start).Seconds())
	return d, err
}

func (c *Client) kickLoop() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

func (c *Client) allowSlow(ctx context.Context, key quota.Key, cost int64) (quota.Decision, error) {
	if c.closed.Load() {
		return quota.Decision{}, ErrClosed
	}
	acquires := 0
	for round := 0; ; round++ {
		now := time.Now()
		d, act, err := c.table.Allow(now, key, cost)
		if err != nil {
			return d, err
		}
		switch act {
		case ActNone:
			return d, nil
		case ActRefill:
			c.kickLoop()
			return d, nil
		case ActCheck:
			return c.check(ctx, now, key, cost)
		}
		if GiveUp(acquires, round) {
			return c.table.Exhausted(now, key, cost)
		}
		if !c.breaker.Ready(now) {
			return c.fallback(now, key, cost, errBreakerOpen)
		}
		b, wait := c.table.PrepareAcquire(now, key, cost)
		switch {
		case wait != nil:
			if err := c.waitFor(ctx, wait); err != nil {
				return c.fallback(time.Now(), key, cost, err)
			}
		case b != nil:
			acquires++
			if d, done, err := c.acquire(ctx, key, cost, b); done {
				return d, err
			}
		}
	}
}

func (c *Client) waitFor(ctx context.Context, ch <-chan struct{}) error {
	t := time.NewTimer(c.opts.BreakerTimeout)
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-t.C:
		return fmt.Errorf("refill in flight for longer than %v", c.opts.BreakerTimeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// acquire sends a synchronous acquire. done means the request is decided
// (by the policy, or refused as invalid); otherwise the grant was applied
// and the caller tries the pool again.
func (c *Client) acquire(ctx context.Context, key quota.Key, cost int64, b *Batch) (quota.Decision, bool, error) {
	now := b.SentAt()
	if !c.breaker.Allow(now) {
		c.table.Failed(now, b)
		d, err := c.fallback(now, key, cost, errBreakerOpen)
		return d, true, err
	}
	rctx, cancel := context.WithTimeout(ctx, c.opts.BreakerTimeout)
	defer cancel()
	start := time.Now()
	var grants []*sluicev1.Grant
	var err error
	method := "Acquire"
	if b.UseSync() {
		method = "Sync"
		var resp *sluicev1.SyncResponse
		resp, err = c.rpc.Sync(rctx, &sluicev1.SyncRequest{InstanceId: c.InstanceID(), Incarnation: c.incarnation, Reports: b.Reports})
		grants = resp.GetGrants()
	} else {
		var resp *sluicev1.AcquireResponse
		resp, err = c.rpc.Acquire(rctx, &sluicev1.AcquireRequest{InstanceId: c.InstanceID(), Incarnation: c.incarnation, Report: b.Reports[0]})
		grants = []*sluicev1.Grant{resp.GetGrant()}
	}
	c.m.observeRPC(method, start, err)
	now = time.Now()
	if err != nil {
		if status.Code(err) == codes.InvalidArgument {
			c.breaker.Success() // the region answered
			c.table.Reject(now, b)
			return quota.Decision{}, true, fmt.Errorf("lease: region refused key %s: %w: %s", key, quota.ErrInvalid, status.Convert(err).Message())
		}
		c.table.Failed(now, b)
		if c.noteConflict(err) {
			d, err := c.fallback(now, key, cost, err)
			return d, true, err
		}
		c.rpcFailed(ctx, now)
		d, err := c.fallback(now, key, cost, err)
		return d, true, err
	}
	c.breaker.Success()
	if err := c.table.Apply(now, b, grants); err != nil {
		c.log.Warn("lease: region sent grants that do not match the reports; they will be resent", "err", err)
	}
	c.noteDegraded(nil)
	return quota.Decision{}, false, nil
}

// rpcFailed feeds a failed synchronous RPC to the breaker, unless the
// caller's own context ended it.
func (c *Client) rpcFailed(ctx context.Context, now time.Time) {
	if ctx.Err() != nil {
		c.breaker.Abandon()
		return
	}
	c.breaker.Failure(now)
}

func (c *Client) check(ctx context.Context, now time.Time, key quota.Key, cost int64) (quota.Decision, error) {
	if !c.breaker.Allow(now) {
		return c.fallback(now, key, cost, errBreakerOpen)
	}
	rctx, cancel := context.WithTimeout(ctx, c.opts.BreakerTimeout)
	defer cancel()
	start := time.Now()
	resp, err := c.rpc.Check(rctx, &sluicev1.CheckRequest{Key: wireKey(key), Cost: cost})
	c.m.observeRPC("Check", start, err)
	now = time.Now()
	if err != nil {
		if status.Code(err) == codes.InvalidArgument {
			c.breaker.Success()
			c.table.Forget(key)
			return quota.Decision{}, fmt.Errorf("lease: region refused check on key %s: %w: %s", key, quota.ErrInvalid, status.Convert(err).Message())
		}
		c.rpcFailed(ctx, now)
		return c.fallback(now, key, cost, err)
	}
	c.breaker.Success()
	d, err := c.table.ApplyCheck(now, key, cost, resp)
	c.noteDegraded(nil)
	return d, err
}

func (c *Client) fallback(now time.Time, key quota.Key, cost int64, cause error) (quota.Decision, error) {
	d, err := c.table.Fallback(now, key, cost)
	c.noteDegraded(cause)
	return d, err
}

// noteDegraded logs the transitions of the client's degraded state (some
// key decided by its on_failure policy since the region last answered it).
func (c *Client) noteDegraded(cause error) {
	n := c.table.DegradedKeys()
	switch {
	case n > 0 && c.degraded.CompareAndSwap(false, true):
		c.log.Warn("lease: regional service unreachable, deciding with on_failure policies (degraded mode)",
			"keys", n, "cause", errString(cause))
	case n == 0 && c.degraded.CompareAndSwap(true, false):
		c.log.Info("lease: regional service answering again, leasing resumed (degraded mode over)")
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// loop is the owner side: periodic Sync, early refills, lease expiry.
func (c *Client) loop() {
	defer close(c.loopDone)
	tick := time.NewTicker(c.opts.Refresh)
	defer tick.Stop()
	expiry := time.NewTimer(c.opts.Refresh)
	defer expiry.Stop()
	// Early refills are batched: after one, further kicks wait a short
	// spacing so a burst of keys crossing their marks shares one RPC.
	spacing := RefillSpacing(c.opts.Refresh)
	kick := (<-chan struct{})(c.kick)
	var hold <-chan time.Time
	for {
		select {
		case <-c.stop:
			return
		case <-tick.C:
			c.syncAll()
		case <-kick:
			c.refill()
			kick, hold = nil, time.After(spacing)
		case <-hold:
			kick, hold = c.kick, nil
		case <-expiry.C:
		}
		if c.conflicted.CompareAndSwap(true, false) {
			c.reidentify()
		}
		now := time.Now()
		wait := c.opts.Refresh
		if next := c.table.Expire(now); !next.IsZero() {
			wait = next.Sub(now)
		}
		expiry.Reset(wait)
	}
}

func (c *Client) syncAll() {
	now := time.Now()
	syncs, release := c.table.PrepareSync(now)
	for i, b := range syncs {
		if i > 0 {
			// Batches go out one after another; keep enforcing deadlines
			// meanwhile, since the loop is busy here.
			c.table.Expire(time.Now())
		}
		if err := c.sendSync(c.bg, b); err != nil {
			// The region is unreachable: the other batches would only wait
			// out their timeouts too. Their reports stay pending.
			for _, rest := range syncs[i+1:] {
				c.table.Failed(now, rest)
			}
			break
		}
	}
	if release != nil {
		if err := c.sendRelease(c.bg, release); err != nil {
			c.log.Debug("lease: releasing idle keys failed; their leases will expire", "err", err)
		}
	}
	c.noteDegraded(nil)
}

func (c *Client) refill() {
	if b := c.table.PrepareRefill(time.Now()); b != nil {
		c.sendSync(c.bg, b)
		c.noteDegraded(nil)
	}
}

// sendSync sends a Sync batch and applies or fails it. A batch the region
// refuses as invalid is split to find the refused keys, which are
// forgotten. Returns the transport error, if any.
func (c *Client) sendSync(parent context.Context, b *Batch) error {
	c.table.ExpireFor(time.Now(), c.opts.SyncTimeout)
	ctx, cancel := context.WithTimeout(parent, c.opts.SyncTimeout)
	start := time.Now()
	resp, err := c.rpc.Sync(ctx, &sluicev1.SyncRequest{InstanceId: c.InstanceID(), Incarnation: c.incarnation, Reports: b.Reports})
	cancel()
	c.m.observeRPC("Sync", start, err)
	now := time.Now()
	switch {
	case err == nil:
		c.breaker.Success()
		if err := c.table.Apply(now, b, resp.GetGrants()); err != nil {
			c.log.Warn("lease: region sent grants that do not match the reports; they will be resent", "err", err)
		}
		return nil
	case status.Code(err) == codes.InvalidArgument:
		c.breaker.Success()
		if len(b.Reports) > 1 {
			for _, one := range b.Split(now) {
				c.sendSync(parent, one)
			}
			return nil
		}
		c.log.Warn("lease: region refused a key; forgetting it", "key", b.entries[0].key.String(), "err", err)
		c.table.Reject(now, b)
		return nil
	default:
		c.breaker.Failure(now)
		c.table.Failed(now, b)
		if c.noteConflict(err) {
			return nil
		}
		return err
	}
}

// noteConflict reports whether err is the region's answer to a report
// that conflicts with another process's under the same instance id; the
// owner loop then takes a new identity.
func (c *Client) noteConflict(err error) bool {
	if status.Code(err) != codes.Aborted {
		return false
	}
	c.breaker.Success() // the region answered
	if c.conflicted.CompareAndSwap(false, true) {
		c.log.Error("lease: another process reports under this instance id; taking a new one",
			"instance_id", c.InstanceID(), "err", err)
		c.kickLoop()
	}
	return true
}

// reidentify gives the client a new instance id after a conflict: every
// lease held under the old id ends (one Release under the old id with
// their final reports; a lease the other process also reported on was
// forfeited by the region already), and every key starts a new lease
// under the new id.
func (c *Client) reidentify() {
	old := c.InstanceID()
	fresh := joinID(c.opts.InstanceID, randomHex(4))
	c.id.Store(&fresh)
	if b := c.table.PrepareRebase(time.Now()); b != nil {
		if err := c.sendReleaseAs(c.bg, old, b); err != nil {
			c.log.Warn("lease: releasing the leases of the old instance id failed; they will expire", "err", err)
		}
	}
	c.log.Warn("lease: new instance id", "old", old, "new", fresh)
}

func (c *Client) sendRelease(parent context.Context, b *Batch) error {
	return c.sendReleaseAs(parent, c.InstanceID(), b)
}

func (c *Client) sendReleaseAs(parent context.Context, id string, b *Batch) error {
	c.table.ExpireFor(time.Now(), c.opts.SyncTimeout)
	ctx, cancel := context.WithTimeout(parent, c.opts.SyncTimeout)
	defer cancel()
	start := time.Now()
	_, err := c.rpc.Release(ctx, &sluicev1.ReleaseRequest{InstanceId: id, Incarnation: c.incarnation, Reports: b.Reports})
	c.m.observeRPC("Release", start, err)
	if c.noteConflict(err) {
		return fmt.Errorf("lease: release of %d keys: %w", len(b.Reports), err)
	}
	if err != nil {
		c.breaker.Failure(time.Now())
		return fmt.Errorf("lease: release of %d keys: %w", len(b.Reports), err)
	}
	c.breaker.Success()
	return nil
}

// Close stops the background loop and releases every key: pools are
// emptied first (nothing is spent after), unacknowledged reports are
// resent, then one Release returns every unspent token. ctx bounds the
// whole shutdown. Allow fails with ErrClosed afterwards. Idempotent.
func (c *Client) Close(ctx context.Context) error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	defer c.m.unregister()
	defer c.cancelBg()
	c.table.Drain()
	close(c.stop)
	select {
	case <-c.loopDone:
	case <-ctx.Done():
		c.cancelBg()
		<-c.loopDone
	}
	for _, ch := range c.table.InFlight() {
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}
	var errs []error
	if b := c.table.PreparePending(time.Now()); b != nil {
		if err := c.sendSync(ctx, b); err != nil {
			errs = append(errs, fmt.Errorf("lease: resending unacknowledged reports: %w", err))
		}
	}
	if b := c.table.PrepareRelease(time.Now()); b != nil {
		if err := c.sendRelease(ctx, b); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
