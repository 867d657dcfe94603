package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	randv2 "math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional/rpcerr"
	"github.com/sluicehq/sluice/pkg/tlsconfig"
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
	// Refresh is the period of the background Sync (optional, default 1s,
	// at least quota.MinRefresh). The region's lease TTL must exceed
	// 2 × Refresh.
	Refresh time.Duration
	// SyncTimeout bounds one background Sync or Release RPC (optional,
	// default Refresh/2).
	SyncTimeout time.Duration
	// BreakerTimeout bounds a synchronous Acquire or Check, and a request's
	// wait for a refill already in flight (optional, default 50ms), while
	// the region answers fast; while its recent answers were slow (a
	// loaded machine), the bound follows them (4 × their median), up to
	// SyncTimeout (see Breaker.Timeout), so a slow but healthy region is
	// not taken for an outage. One request waits one such bound in all.
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
	// Policies is the live config's policy of a class, false for a class
	// it does not name (optional): its on_failure policy and shadow mode
	// decide the class's degraded decisions over the region's last answer,
	// at once when the config changes (see TableOptions.Policies).
	Policies func(class string) (ClassPolicy, bool)
	// StaticShare is the live config's static share of a key in this
	// instance's region, false for a key it does not resolve (optional):
	// a key the region never described runs its local policy at the lower
	// of it and FallbackLimit (see TableOptions.StaticShare).
	StaticShare func(key quota.Key) (quota.Limit, bool)
	// Tier names a key's tier before the region has, for the decision
	// counts (optional; see TableOptions.Tier).
	Tier func(key quota.Key) string
	// FallbackLimit is the local policy's limit (tokens/s, tokens) for a
	// key the region never described (optional, default 10/s, burst 10),
	// or its bound where StaticShare names the key.
	FallbackLimit quota.Limit
	// Logger receives degraded-mode transitions, keys the region refused,
	// refused credentials and protocol anomalies (optional, default
	// slog.Default() as NewClient finds it). The default is the process's
	// logger, as the standard library's own packages log, because these
	// are the lines docs/operations.md tells operators to search for: a
	// client that discarded them by default left an application that
	// embeds it silent through an outage. Pass
	// slog.New(slog.DiscardHandler) to silence it.
	Logger *slog.Logger
	// Registerer receives the sluice_client_* metrics (optional, default
	// none); they are unregistered by Close.
	Registerer prometheus.Registerer
	// RefusedLogInterval is how often, at most, the error line saying the
	// region refused this client's credentials is repeated while it keeps
	// refusing them (optional, default DefaultRefusedLogInterval): the
	// first refusal is logged at once, and a log read hours later still
	// shows why the client is degraded.
	RefusedLogInterval time.Duration
}

// DefaultRefusedLogInterval is Options.RefusedLogInterval's default, the
// regional service's own interval for logging a refused caller.
const DefaultRefusedLogInterval = time.Minute

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
		{"RefusedLogInterval", &o.RefusedLogInterval, DefaultRefusedLogInterval},
	}
	for _, d := range durations {
		if *d.v < 0 {
			return o, fmt.Errorf("%w: lease client option %s %v is negative", quota.ErrInvalid, d.name, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if o.Refresh < quota.MinRefresh {
		return o, fmt.Errorf("%w: lease client option Refresh %v is below the minimum %v", quota.ErrInvalid, o.Refresh, quota.MinRefresh)
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
		o.Logger = slog.Default()
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
	zero    time.Time // the table's zero (Table.at), with its monotonic reading
	core    *Core     // every decision around the table; the Client is its pump
	rpc     sluicev1.LeaseServiceClient
	breaker *Breaker
	log     *slog.Logger
	m       *metrics

	kick     chan struct{} // buffered 1: a key crossed its low-water mark
	stop     chan struct{} // closed by Close
	loopDone chan struct{}
	bg       context.Context // parent of background RPCs; cancelled by Close
	cancelBg context.CancelFunc
	// late counts the acquires whose requests may give up waiting for them
	// (Slow.AcquireGaveUp), still to end; Close waits for them.
	late sync.WaitGroup

	closed    atomic.Bool
	closeDone chan struct{} // closed when the first Close returns
	closeErr  error         // the first Close's result; read after closeDone
	logged    atomic.Int32  // what the degraded-mode log said of this episode (loggedNone...)
	slowLog   slowEpisodes  // how often slow episodes were logged at info
	// refusedLogged is when the refusal of this client's credentials was
	// last logged (unix nanoseconds; see observeRPC). Whether the region's
	// last answer refused them is metrics.refused, which the
	// sluice_client_credentials_refused gauge exports.
	refusedLogged atomic.Int64

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
		Policies:      o.Policies,
		StaticShare:   o.StaticShare,
		Tier:          o.Tier,
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
	// The table's instants count from here, so the hot path can read them
	// as time.Since(zero).
	zero := time.Now()
	table.at(zero)
	m, err := newMetrics(o.Registerer, table)
	if err != nil {
		return nil, err
	}
	c := &Client{
		opts:      o,
		table:     table,
		zero:      zero,
		rpc:       sluicev1.NewLeaseServiceClient(conn),
		breaker:   NewBreaker(o.BreakerFailures, o.BreakerCooldown),
		log:       o.Logger,
		m:         m,
		kick:      make(chan struct{}, 1),
		stop:      make(chan struct{}),
		loopDone:  make(chan struct{}),
		closeDone: make(chan struct{}),

		incarnation: newIncarnation(),
	}
	c.core = NewCore(table, c.breaker, o.SyncTimeout).WithBreakerTimeout(o.BreakerTimeout)
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

// Cap is Table.Cap: the region's cap for key as of its last answer, else
// the live config's static share of it (Options.StaticShare), if known.
func (c *Client) Cap(key quota.Key) (int64, bool) { return c.table.Cap(key) }

// Allow decides whether a request of cost tokens on key may proceed. Over
// quota is a Decision with Allowed false, never an error; errors mean bad
// input (wrapping quota.ErrInvalid), a closed client (ErrClosed), or a
// ctx that ended before the region answered (wrapping ErrAbandoned and
// ctx.Err()).
//
// While the key holds tokens and its lease is far from its deadline, the
// decision is one compare-and-swap on the key's pool, without locks, clock
// reads or allocation. Otherwise it may wait up to BreakerTimeout for the
// region (a synchronous Acquire, a refill already in flight, or a strict
// Check) before the class's on_failure policy decides (Degraded). A ctx
// that ends sooner ends the request with an error instead, undecided: it
// says nothing of the region, so neither the policy nor the circuit
// breaker acts on it, and the key is not degraded.
func (c *Client) Allow(ctx context.Context, key quota.Key, cost int64) (quota.Decision, error) {
	var start time.Time
	sampled := randv2.Uint32()%fastSampleRate == 0
	if sampled {
		start = time.Now()
	}
	// One monotonic clock reading (time.Since of a reading that carries
	// one): the deadline test that holds while the owner loop is late.
	if in, remaining, refill, ok := c.table.allowFast(key, cost, instant(time.Since(c.zero))); ok {
		if refill {
			c.kickLoop()
		}
		if sampled {
			c.m.fast.Observe(time.Since(start).Seconds())
		}
		return admitted(in, remaining), nil
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

// allowSlow pumps the request through Core's steps.
func (c *Client) allowSlow(ctx context.Context, key quota.Key, cost int64) (quota.Decision, error) {
	if c.closed.Load() {
		return quota.Decision{}, ErrClosed
	}
	if ctx.Err() != nil {
		// Gone before asking: no RPC is worth sending for it.
		return quota.Decision{}, abandoned(ctx, key)
	}
	s := c.core.Slow(key, cost)
	st := s.Next(time.Now())
	cause := errBreakerOpen // why the policy decides, unless an RPC or a wait says more
	for {
		if st.ApplyErr != nil {
			c.log.Warn("lease: region sent grants that do not match the reports; they will be resent", "err", st.ApplyErr)
		}
		var err error
		switch st.Do {
		case DoWait:
			if err = c.waitFor(ctx, st.Wait, s.Budget(time.Now(), c.opts.BreakerTimeout)); ctx.Err() != nil {
				st = s.Abandon()
			} else if err != nil {
				st = s.WaitFailed(time.Now())
			} else {
				st = s.Next(time.Now())
			}
		case DoAcquire:
			st, err = c.acquire(ctx, &s, st.Batch)
		case DoCheck:
			st, err = c.check(ctx, &s, key, cost)
		default:
			if st.Kick {
				c.kickLoop()
			}
			if st.Degraded {
				if errors.Is(cause, errBreakerOpen) && !c.breaker.Open() {
					// Decided by the policy with the breaker closed: the
					// request's rounds used up its wait.
					cause = fmt.Errorf("%w: its rounds used up the request's wait", errWaitEnded)
				}
				c.noteDegradedDecision(cause)
			}
			if errors.Is(st.Err, ErrAbandoned) {
				return st.Decision, abandoned(ctx, key)
			}
			return st.Decision, st.Err
		}
		if err != nil {
			cause = err
		}
	}
}

// abandoned is the error of a request on key whose ctx ended first.
func abandoned(ctx context.Context, key quota.Key) error {
	return fmt.Errorf("%w (key %s): %w", ErrAbandoned, key, context.Cause(ctx))
}

func (c *Client) waitFor(ctx context.Context, ch <-chan struct{}, wait time.Duration) error {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-t.C:
		// wait is what was left of the request's wait, not all of it.
		return fmt.Errorf("%w: the refill in flight was not answered in the %v left of it", errWaitEnded, wait)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// outcome is how an RPC that ended with err went, for Core.
func outcome(ctx context.Context, err error) Outcome {
	switch {
	case err == nil:
		return Answered
	case status.Code(err) == codes.InvalidArgument:
		return Refused
	case status.Code(err) == codes.Aborted:
		return Conflict
	case rpcerr.RedisNodeFailed(err):
		return KeyFailed
	case ctx.Err() != nil:
		return Abandoned
	}
	return Unreachable
}

// refusal adds the region's reason to a refused step's error.
func refusal(st Step, err error) Step {
	if st.Refused {
		// The region's message says "invalid argument" as st.Err does.
		msg := strings.TrimPrefix(status.Convert(err).Message(), quota.ErrInvalid.Error()+": ")
		st.Err = fmt.Errorf("%w: %s", st.Err, msg)
	}
	return st
}

// acquire sends the synchronous acquire s stepped to and returns its next
// step, with the RPC's error. The request waits for the call at most its
// budget (Slow.Budget) and until ctx ends; the call itself runs up to
// Core.AcquireCallTimeout and, when the request gave up on it first, ends
// as a background Sync does (Slow.AcquireGaveUp, landLate).
func (c *Client) acquire(ctx context.Context, s *Slow, b *Batch) (Step, error) {
	budget := s.Budget(time.Now(), c.opts.BreakerTimeout)
	// The caller's values go with the call, not its end: a request that
	// gives up leaves the call running. Close ends it.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(budget, c.core.AcquireCallTimeout(c.opts.BreakerTimeout)))
	stopOnClose := context.AfterFunc(c.bg, cancel)
	method := "Acquire"
	if b.UseSync() {
		method = "Sync"
	}
	done := make(chan acquireResult, 1)
	start := time.Now()
	c.late.Add(1)
	go func() {
		defer c.late.Done()
		grants, err := c.callAcquire(rctx, method, b)
		stopOnClose()
		cancel()
		done <- acquireResult{grants, err}
	}()
	wait := time.NewTimer(budget)
	defer wait.Stop()
	select {
	case r := <-done:
		c.observeRPC(method, start, r.err)
		out := outcome(ctx, r.err)
		st := refusal(s.AcquireDone(time.Now(), r.grants, out), r.err)
		switch out {
		case Answered:
			c.noteDegradedOver()
		case Conflict:
			c.noteConflict(r.err)
		}
		return st, r.err
	case <-wait.C:
		st, late := s.AcquireGaveUp(time.Now(), false)
		c.landLate(late, method, start, done)
		// budget is what was left of the request's wait when the acquire
		// went out (earlier rounds may have used the rest), not all of it.
		return st, fmt.Errorf("%w: the acquire was not answered in the %v left of it", errWaitEnded, budget)
	case <-ctx.Done():
		st, late := s.AcquireGaveUp(time.Now(), true)
		c.landLate(late, method, start, done)
		return st, ctx.Err()
	}
}

// acquireResult is how an acquire's call ended.
type acquireResult struct {
	grants []*sluicev1.Grant
	err    error
}

// callAcquire sends b as the RPC method names (Acquire, or a Sync of its
// one report) and returns the region's grants.
func (c *Client) callAcquire(ctx context.Context, method string, b *Batch) ([]*sluicev1.Grant, error) {
	if method == "Sync" {
		resp, err := c.rpc.Sync(ctx, &sluicev1.SyncRequest{InstanceId: c.InstanceID(), Incarnation: c.incarnation, Reports: b.Reports, KeyFailures: true})
		return resp.GetGrants(), err
	}
	resp, err := c.rpc.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: c.InstanceID(), Incarnation: c.incarnation, Report: b.Reports[0]})
	return []*sluicev1.Grant{resp.GetGrant()}, err
}

// landLate ends, once its call ends, an acquire whose request gave up on
// it (Slow.AcquireGaveUp): as a background Sync ends (Core.SyncDone),
// its grants into the pool, its verdict on the region to the breaker.
func (c *Client) landLate(b *Batch, method string, start time.Time, done <-chan acquireResult) {
	c.late.Add(1)
	go func() {
		defer c.late.Done()
		r := <-done
		c.observeRPC(method, start, r.err)
		out := outcome(c.bg, r.err)
		split, applyErr := c.core.SyncDone(time.Now(), b, r.grants, out)
		if applyErr != nil {
			c.log.Warn("lease: region sent grants that do not match the reports; they will be resent", "err", applyErr)
		}
		switch out {
		case Answered:
			c.noteDegradedOver()
		case Refused:
			for _, part := range split {
				c.sendSync(c.bg, part)
			}
		case Conflict:
			c.noteConflict(r.err)
		}
	}()
}

// check sends the strict Check s stepped to and returns the decided step,
// with the RPC's error.
func (c *Client) check(ctx context.Context, s *Slow, key quota.Key, cost int64) (Step, error) {
	rctx, cancel := context.WithTimeout(ctx, s.Budget(time.Now(), c.opts.BreakerTimeout))
	defer cancel()
	start := time.Now()
	resp, err := c.rpc.Check(rctx, &sluicev1.CheckRequest{Key: wireKey(key), Cost: cost})
	c.observeRPC("Check", start, err)
	out := outcome(ctx, err)
	st := refusal(s.CheckDone(time.Now(), resp, out), err)
	if out == Answered {
		c.noteDegradedOver()
	}
	return st, err
}

// observeRPC records a regional RPC's outcome in the metrics, and logs at
// error level, at the first refusal and then at most once per
// RefusedLogInterval while refusals go on, that the region refused this
// client's credentials (PermissionDenied: the certificate lacks the
// instance role; Unauthenticated: there is none). Such a refusal is not
// an outage: the region is up and will refuse every call until the
// certificate or the config's auth section changes. The client decides
// every key by its on_failure policy meanwhile, as with no region to ask
// (it has no lease to decide from), and the breaker opens on the refusals
// as on failures; sluice_client_credentials_refused tells this spell from
// an outage, which sluice_client_degraded alone does not.
func (c *Client) observeRPC(method string, start time.Time, err error) {
	c.m.observeRPC(method, start, err)
	code := status.Code(err)
	switch alert := certificateRefused(err); {
	case code == codes.PermissionDenied || code == codes.Unauthenticated:
		if c.noteRefused() {
			c.log.Error("lease: the regional service refused this client's credentials; every key is decided by its on_failure policy until the client certificate holds the instance role (auth.identities in the config)",
				"method", method, "code", code.String(), "needs", "instance", "err", status.Convert(err).Message(),
				"repeated_every", c.opts.RefusedLogInterval)
		}
	case alert == ownCertificateNotValid:
		if c.noteRefused() {
			c.log.Error("lease: this client's TLS certificate is outside its validity period, so the regional service would refuse it; every key is decided by its on_failure policy until it is renewed",
				"method", method, "err", status.Convert(err).Message(), "repeated_every", c.opts.RefusedLogInterval)
		}
	case alert != "":
		if c.noteRefused() {
			c.log.Error("lease: the regional service refused this client's TLS certificate; every key is decided by its on_failure policy until the client presents one it accepts (renewed, from the region's CA)",
				"method", method, "tls_alert", alert, "err", status.Convert(err).Message(),
				"repeated_every", c.opts.RefusedLogInterval)
		}
	case err == nil:
		if c.m.refused.CompareAndSwap(true, false) {
			c.log.Info("lease: the regional service accepts this client's credentials again")
		}
	}
}

// noteRefused records an answer refusing this client's credentials and
// reports whether to log it: at the first refusal, then at most once per
// RefusedLogInterval while refusals go on.
func (c *Client) noteRefused() bool {
	first := c.m.refused.CompareAndSwap(false, true)
	now := time.Now().UnixNano()
	last := c.refusedLogged.Load()
	if !first && now-last < int64(c.opts.RefusedLogInterval) {
		return false
	}
	// A concurrent refusal logs this interval.
	return c.refusedLogged.CompareAndSwap(last, now) || first
}

// certificateAlerts are the TLS alerts a server sends when it refuses the
// certificate a client presented, or the lack of one (crypto/tls's alert
// texts): a refusal of the client's credentials, not an outage.
var certificateAlerts = []string{
	"expired certificate", "bad certificate", "unknown certificate authority",
	"certificate required", "revoked certificate", "unsupported certificate", "unknown certificate",
}

// ownCertificateNotValid is certificateRefused's answer for a handshake
// that failed because this client's certificate is outside its validity
// period (tlsconfig.ErrCertificateNotValid): not presented, as the
// service would refuse it.
const ownCertificateNotValid = "own certificate not valid"

// certificateRefused is the TLS alert with which the regional service
// refused this client's certificate when err is a connection that failed
// so ("remote error: tls: expired certificate": the handshake's error as
// gRPC reports it, Unavailable), ownCertificateNotValid when the client's
// own TLS configuration did not present it, else "". An error verifying
// the server's certificate is the client's own, never a remote one.
func certificateRefused(err error) string {
	if status.Code(err) != codes.Unavailable {
		return ""
	}
	msg := status.Convert(err).Message()
	if strings.Contains(msg, tlsconfig.ErrCertificateNotValid.Error()) {
		return ownCertificateNotValid
	}
	i := strings.Index(msg, "remote error: tls: ")
	if i < 0 {
		return ""
	}
	rest := msg[i+len("remote error: tls: "):]
	for _, a := range certificateAlerts {
		if strings.HasPrefix(rest, a) && (len(rest) == len(a) || !isAlertLetter(rest[len(a)])) {
			return a
		}
	}
	return ""
}

// isAlertLetter: a byte that may continue an alert's text.
func isAlertLetter(b byte) bool { return b == ' ' || (b >= 'a' && b <= 'z') }

// Degraded-mode log states (Client.logged): what the current episode has
// logged so far.
const (
	loggedNone        int32 = iota // not in degraded mode
	loggedSlow                     // entered on an answer that came too late
	loggedUnreachable              // the region was found unreachable
)

// errWaitEnded: a request's wait for the refill in flight ended first.
var errWaitEnded = errors.New("no answer within the request's wait")

// slowAnswer reports whether cause, why a request was decided by its
// on_failure policy, is only an answer later than the request's wait (a
// slow region, or a loaded machine) rather than evidence that the region
// cannot be reached (a transport error, Unavailable, the breaker open).
func slowAnswer(cause error) bool {
	return errors.Is(cause, errWaitEnded) || errors.Is(cause, context.DeadlineExceeded) ||
		status.Code(cause) == codes.DeadlineExceeded
}

// noteDegradedDecision logs, once per episode, that a request was decided
// by its on_failure policy for cause. A request whose answer was only late
// is logged at info as such; the region found unreachable (an error, or
// the breaker open after consecutive failures: a hung region is slow
// first) is logged at warn, also when the episode began as slow, saying
// so when the region answered that its Redis failed (rpcerr).
func (c *Client) noteDegradedDecision(cause error) {
	level := loggedUnreachable
	if slowAnswer(cause) && !c.breaker.Open() {
		level = loggedSlow
	}
	for {
		cur := c.logged.Load()
		if cur >= level {
			return
		}
		if c.logged.CompareAndSwap(cur, level) {
			break
		}
	}
	n := c.table.DegradedKeys()
	if c.m.refused.Load() {
		// The region answered, refusing this client: not unreachable.
		c.log.Warn("lease: regional service refuses this client's credentials, deciding with on_failure policies (degraded mode)",
			"keys", n, "cause", errString(cause))
		return
	}
	if level == loggedSlow {
		if quiet, ok := c.slowLog.start(time.Now()); ok {
			c.log.Info("lease: regional service slow to answer, deciding with on_failure policies (degraded mode)",
				"keys", n, "cause", errString(cause), "slow_episodes_since_last_logged", quiet)
		} else {
			c.log.Debug("lease: regional service slow to answer again, deciding with on_failure policies (degraded mode)",
				"keys", n, "cause", errString(cause))
		}
		return
	}
	if rpcerr.RedisFailed(cause) {
		// The region answered: it is its Redis that fails the calls.
		c.log.Warn("lease: regional service answers that its Redis fails, deciding with on_failure policies (degraded mode)",
			"keys", n, "cause", errString(cause))
		return
	}
	c.log.Warn("lease: regional service unreachable, deciding with on_failure policies (degraded mode)",
		"keys", n, "cause", errString(cause))
}

// noteDegradedOver logs the end of degraded mode once the table left it:
// the region answered a call since the last decision by an on_failure
// policy, and every key that was degraded has been answered or forgotten
// (Table.Degraded). Keys forgotten as idle do not end it.
func (c *Client) noteDegradedOver() {
	if c.table.Degraded() {
		return
	}
	if was := c.logged.Swap(loggedNone); was != loggedNone {
		if was == loggedSlow && c.slowLog.ended() {
			c.log.Debug("lease: regional service answering again, leasing resumed (degraded mode over)")
			return
		}
		c.log.Info("lease: regional service answering again, leasing resumed (degraded mode over)")
	}
}

// slowEpisodeLogEvery is the least time between two slow episodes logged
// at info: a region that answers late now and then (one replica of two
// hung, a machine loaded in bursts) starts an episode at every late
// answer, dozens a second, and each would be two lines. The others go to
// debug and are counted in the next one logged at info. An unreachable
// region is logged at every episode.
const slowEpisodeLogEvery = time.Minute

// slowEpisodes throttles the log of slow episodes (slowEpisodeLogEvery).
// Safe for concurrent use.
type slowEpisodes struct {
	mu     sync.Mutex
	last   time.Time // guarded by mu: when an episode was last logged at info
	quiet  int       // guarded by mu: episodes logged at debug since
	silent bool      // guarded by mu: the episode under way was logged at debug
}

// start notes a slow episode starting at now: ok when it is logged at info,
// with the episodes logged at debug since the last one that was.
func (s *slowEpisodes) start(now time.Time) (quiet int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.last.IsZero() && now.Sub(s.last) < slowEpisodeLogEvery {
		s.quiet++
		s.silent = true
		return 0, false
	}
	quiet, s.quiet, s.last, s.silent = s.quiet, 0, now, false
	return quiet, true
}

// ended reports whether the slow episode that ends was logged at debug.
func (s *slowEpisodes) ended() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	silent := s.silent
	s.silent = false
	return silent
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// loop is the owner side: periodic Sync, early refills, reports of
// fallen demand, lease expiry.
func (c *Client) loop() {
	defer close(c.loopDone)
	tick := time.NewTicker(c.opts.Refresh)
	defer tick.Stop()
	falls := time.NewTicker(FallCheckEvery(c.opts.Refresh))
	defer falls.Stop()
	expiry := time.NewTimer(c.opts.Refresh)
	defer expiry.Stop()
	// Early refills are batched: after one, a kick waits a short spacing
	// (Core.RefillWait) so a burst of keys crossing their marks shares one
	// RPC. waiting: a kick waits; hold fires when its wait ends. A kick
	// that comes meanwhile works the wait out again: a cap-held crossing
	// shortens it.
	var waiting bool
	var hold <-chan time.Time
	var holdAt time.Time
	for {
		select {
		case <-c.stop:
			return
		case <-tick.C:
			c.syncAll()
		case <-falls.C:
			c.sendEarly(c.core.PrepareFalls(time.Now()))
		case <-c.kick:
			waiting = true
		case <-hold:
			hold = nil
		case <-expiry.C:
		}
		if waiting {
			now := time.Now()
			if w := c.core.RefillWait(now); w <= 0 {
				waiting, hold = false, nil
				c.sendEarly(c.core.PrepareRefill(now))
			} else if at := now.Add(w); hold == nil || at.Before(holdAt) {
				hold, holdAt = time.After(w), at
			}
		}
		if c.conflicted.CompareAndSwap(true, false) {
			c.reidentify()
		}
		if c.core.GiveBackDue() {
			c.kickLoop()
		}
		expiry.Reset(c.core.Expire(time.Now()))
	}
}

func (c *Client) syncAll() {
	round := c.core.PrepareSync(time.Now())
	sent := func(now time.Time, b *Batch, grants []*sluicev1.Grant, out Outcome) ([]*Batch, error) {
		split, _, err := round.Sent(now, b, grants, out)
		return split, err
	}
	for {
		b, release := round.Next()
		if b == nil {
			break
		}
		if !release {
			c.syncWith(c.bg, b, sent)
		} else if err := c.sendRelease(c.bg, b); err != nil {
			c.log.Debug("lease: releasing idle keys failed; their leases will expire", "err", err)
		}
	}
	c.noteDegradedOver()
}

// sendEarly sends an early Sync batch outside the periodic round, if
// there is one.
func (c *Client) sendEarly(b *Batch) {
	if b != nil {
		c.sendSync(c.bg, b)
		c.noteDegradedOver()
	}
}

// sendSync sends a Sync batch and ends it (Core.SyncDone). Returns the
// transport error, if any.
func (c *Client) sendSync(parent context.Context, b *Batch) error {
	return c.syncWith(parent, b, c.core.SyncDone)
}

// syncWith sends a Sync batch and ends it with end; the parts of a batch
// the region refused as invalid are sent one by one to find the refused
// keys, which are forgotten. Returns the transport error, if any.
func (c *Client) syncWith(parent context.Context, b *Batch, end func(time.Time, *Batch, []*sluicev1.Grant, Outcome) ([]*Batch, error)) error {
	c.core.BeforeSend(time.Now())
	ctx, cancel := context.WithTimeout(parent, c.opts.SyncTimeout)
	start := time.Now()
	resp, err := c.rpc.Sync(ctx, &sluicev1.SyncRequest{InstanceId: c.InstanceID(), Incarnation: c.incarnation, Reports: b.Reports, KeyFailures: true})
	cancel()
	c.observeRPC("Sync", start, err)
	out := outcome(parent, err)
	split, applyErr := end(time.Now(), b, resp.GetGrants(), out)
	if applyErr != nil {
		c.log.Warn("lease: region sent grants that do not match the reports; they will be resent", "err", applyErr)
	}
	switch out {
	case Refused:
		if len(split) == 0 {
			c.log.Warn("lease: region refused a key; forgetting it", "key", b.Keys()[0].String(), "err", err)
		}
		for _, part := range split {
			c.sendSync(parent, part)
		}
	case Conflict:
		c.noteConflict(err)
	case Unreachable, Abandoned:
		return err
	}
	return nil
}

// noteConflict reports whether err is the region's answer to a report
// that conflicts with another process's under the same instance id; the
// owner loop then takes a new identity.
func (c *Client) noteConflict(err error) bool {
	if status.Code(err) != codes.Aborted {
		return false
	}
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

// sendReleaseAs releases b's keys under instance id, in calls of at most
// MaxReportsPerSync reports (the region bounds the reports of one call:
// docs/operations.md, "Request bounds"). A call that fails does not stop
// the others; their errors are joined.
func (c *Client) sendReleaseAs(parent context.Context, id string, b *Batch) error {
	var errs []error
	for _, part := range b.chunks(c.table.opts.MaxReportsPerSync) {
		if err := c.sendReleaseCall(parent, id, part); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (c *Client) sendReleaseCall(parent context.Context, id string, b *Batch) error {
	c.core.BeforeSend(time.Now())
	ctx, cancel := context.WithTimeout(parent, c.opts.SyncTimeout)
	defer cancel()
	start := time.Now()
	_, err := c.rpc.Release(ctx, &sluicev1.ReleaseRequest{InstanceId: id, Incarnation: c.incarnation, Reports: b.Reports})
	c.observeRPC("Release", start, err)
	out := outcome(parent, err)
	c.core.ReleaseDone(start, time.Now(), out)
	if out == Conflict {
		c.noteConflict(err)
	}
	if err != nil {
		return fmt.Errorf("lease: release of %d keys: %w", len(b.Reports), err)
	}
	return nil
}

// Close stops the background loop and releases every key: pools are
// emptied first (nothing is spent after), unacknowledged reports are
// resent, then Release calls return every unspent token. ctx bounds the
// whole shutdown; when it ends first, the error wraps its cause
// (errors.Is(err, context.DeadlineExceeded)), and the tokens not released
// return to the region when their leases expire. Allow fails with
// ErrClosed afterwards.
//
// Close runs once: a later or concurrent call waits for the first (or
// for its own ctx) and returns the first's result.
func (c *Client) Close(ctx context.Context) (err error) {
	if !c.closed.CompareAndSwap(false, true) {
		select {
		case <-c.closeDone:
			return c.closeErr
		case <-ctx.Done():
			return fmt.Errorf("lease: waiting for a Close in progress: %w", context.Cause(ctx))
		}
	}
	defer func() {
		c.closeErr = err
		close(c.closeDone)
	}()
	defer c.m.unregister()
	// After cancelBg (deferred calls run last first): the acquires still
	// running end with it.
	defer c.late.Wait()
	defer c.cancelBg()
	c.table.Drain()
	close(c.stop)
	select {
	case <-c.loopDone:
	case <-ctx.Done():
		c.cancelBg()
		<-c.loopDone
	}
	var errs []error
	for _, ch := range c.table.InFlight() {
		select {
		case <-ch:
		case <-ctx.Done():
			if len(errs) == 0 {
				// A report still in flight (an acquire a request gave up
				// on, a refill) is neither resent nor released below: its
				// key's tokens do not go back.
				errs = append(errs, errors.New("lease: reports still in flight were not given back"))
			}
		}
	}
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
	if len(errs) > 0 && ctx.Err() != nil {
		errs = append(errs, fmt.Errorf("lease: close: %w", context.Cause(ctx)))
	}
	return errors.Join(errs...)
}
