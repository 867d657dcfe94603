package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
)

// Limiter decides one request on one quota key. *lease.Client and
// *Loopback satisfy it. Over quota is a Decision with Allowed false; an
// error means no decision exists (bad input wrapping quota.ErrInvalid, or
// the limiter is closed). Implementations must be safe for concurrent use.
type Limiter interface {
	Allow(ctx context.Context, key quota.Key, cost int64) (quota.Decision, error)
}

// capReader is the optional part of a Limiter that knows a key's cap in
// this region without deciding (*lease.Client, *Loopback): a descriptor
// answered "never" without asking the limiter reports it as the first
// value of x-ratelimit-limit, as every other answer on the key does.
type capReader interface {
	Cap(key quota.Key) (int64, bool)
}

// ConfigSource hands out the live config (configstore.Watcher,
// regional.StaticConfig).
type ConfigSource interface {
	Current() *config.Config
}

// Options configure a Service.
type Options struct {
	// Limiter decides every matched descriptor. Optional at New: a regional
	// daemon's own address is known only after it started, so the Limiter
	// is usually attached later with SetLimiter. Until then every valid
	// request is answered codes.Unavailable.
	Limiter Limiter
	// Config supplies the envoy.descriptors mappings and the limits.
	// Required; read on every request, so a hot-reloaded config applies
	// to the next request.
	Config ConfigSource
	// Registerer receives the sluice_envoy_* metrics. Optional, default
	// none; the Service is also a prometheus.Collector that can be
	// registered later instead (once, either way).
	Registerer prometheus.Registerer
	// Logger receives refused requests (debug) and limiter failures
	// (warn). Optional, default discards.
	Logger *slog.Logger
	// Headers adds x-ratelimit-limit, x-ratelimit-remaining,
	// x-ratelimit-reset, ratelimit, ratelimit-policy and, on OVER_LIMIT,
	// retry-after to Envoy's response (see the package doc). Optional,
	// default true (nil).
	Headers *bool
}

// Service answers Envoy's ShouldRateLimit from leased tokens. Safe for
// concurrent use.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer

	config  ConfigSource
	limiter atomic.Pointer[limiterBox]
	headers bool
	log     *slog.Logger
	m       *metrics
	encoded encodedCall
	// now is the clock of decisions (nil: time.Now); tests fix it to
	// compare answers of the same decisions.
	now func() time.Time
}

// limiterBox lets an interface value live in an atomic.Pointer.
type limiterBox struct{ Limiter }

// New builds a Service. It does not start anything.
func New(o Options) (*Service, error) {
	if o.Config == nil {
		return nil, fmt.Errorf("%w: envoyrls: Options.Config is required", quota.ErrInvalid)
	}
	s := &Service{config: o.Config, headers: true, log: o.Logger, m: newMetrics()}
	s.initEncoded()
	if o.Headers != nil {
		s.headers = *o.Headers
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if o.Registerer != nil {
		if err := s.m.register(o.Registerer); err != nil {
			return nil, err
		}
	}
	if o.Limiter != nil {
		s.SetLimiter(o.Limiter)
	}
	return s, nil
}

// SetLimiter attaches (or replaces) the Limiter; requests already being
// decided finish with the one they started with. Nil detaches it.
func (s *Service) SetLimiter(l Limiter) {
	if l == nil {
		s.limiter.Store(nil)
		return
	}
	s.limiter.Store(&limiterBox{l})
}

// Register serves svc on g as envoy.service.ratelimit.v3.RateLimitService.
// Call it before g serves. RegisterEncoded answers for less on a server
// built with ServerOptions (a regional daemon serves the Service given as
// its DaemonOptions.Envoy so).
func Register(g *grpc.Server, svc *Service) {
	rlsv3.RegisterRateLimitServiceServer(g, svc)
}

// Describe implements prometheus.Collector.
func (s *Service) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range s.m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (s *Service) Collect(ch chan<- prometheus.Metric) {
	for _, c := range s.m.collectors() {
		c.Collect(ch)
	}
}

// ShouldRateLimit implements RateLimitServiceServer (see the package doc
// for the mapping, the answer and the error codes).
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	start := time.Now()
	var sc scratch
	targets, decisions, out, err := s.decide(ctx, req, &sc)
	var resp *rlsv3.RateLimitResponse
	if err == nil {
		resp, out = s.respond(targets, decisions)
	}
	s.m.byOutcome[out].Observe(time.Since(start).Seconds())
	return resp, err
}

// shouldRateLimitEncoded is ShouldRateLimit answering in wire form (see
// RegisterEncoded).
func (s *Service) shouldRateLimitEncoded(ctx context.Context, req *rlsv3.RateLimitRequest) (wireAnswer, error) {
	start := time.Now()
	var sc scratch
	targets, decisions, out, err := s.decide(ctx, req, &sc)
	var resp wireAnswer
	if err == nil {
		resp, out = s.respondWire(targets, decisions)
	}
	s.m.byOutcome[out].Observe(time.Since(start).Seconds())
	return resp, err
}

// scratch holds the targets and decisions of a request of up to two
// descriptors (the common request has one) on the caller's stack.
type scratch struct {
	targets [2]Target
	decided [2]decided
}

// decide resolves req and decides each of its matched descriptors. The
// slices it returns live in sc when they fit.
func (s *Service) decide(ctx context.Context, req *rlsv3.RateLimitRequest, sc *scratch) ([]Target, []decided, outcome, error) {
	cfg := s.config.Current()
	if cfg == nil {
		return nil, nil, outcomeError, status.Error(codes.Unavailable, "envoyrls: no config loaded yet")
	}
	targets, err := resolveInto(sc.targets[:0], cfg, req)
	if err != nil {
		s.log.Debug("envoy rate-limit request refused", "domain", req.GetDomain(), "err", err)
		return nil, nil, outcomeInvalid, status.Error(codes.InvalidArgument, err.Error())
	}
	box := s.limiter.Load()
	if box == nil {
		return nil, nil, outcomeError, status.Error(codes.Unavailable, "envoyrls: not ready: no limiter attached yet")
	}

	var decisions []decided
	if len(targets) <= len(sc.decided) {
		decisions = sc.decided[:len(targets)]
	} else {
		decisions = make([]decided, len(targets))
	}
	// over: a descriptor already limits this request. One whose cost is
	// above its burst (Never) limits it before anything is charged.
	over := false
	for _, t := range targets {
		over = over || (t.Matched && !t.Unlimited && t.Never && !t.Shadow)
	}
	for i, t := range targets {
		switch {
		case t.Unlimited:
			s.m.unlimited.Inc()
			continue
		case !t.Matched:
			s.m.unmatched.Inc()
			continue
		case over && !t.Shadow && !t.Never:
			// The request is over limit already: charging the rest would
			// only spend their tokens on a request Envoy refuses. Charged
			// for every request, a descriptor shared by a route's requests
			// starved the others: a per-address limit of 10/s and a shared
			// one of 4/s, each spent by every request, both passed for about
			// one request a second at 50 requests a second, and for none at
			// 600. Answered as unmatched (OK, no current_limit): not decided.
			targets[i].Matched = false
			continue
		}
		var d quota.Decision
		if t.Never {
			// Nothing asked, nothing charged: no wait admits the cost.
			d = quota.Decision{WouldDeny: true, Limit: t.Resolved.Limit.Burst, RetryNever: true}
			if cr, ok := box.Limiter.(capReader); ok {
				// The region's cap as of its last answer on the key, else
				// (never answered, or forgotten as idle) the live config's
				// static share of it in the region; the configured burst
				// (Limit) only when neither is known.
				d.Cap, d.CapKnown = cr.Cap(t.Key)
			}
		} else if d, err = box.Allow(ctx, t.Key, t.Cost); err != nil {
			out, err := s.failed(ctx, i, t, err)
			return nil, nil, out, err
		}
		r := classify(d, t.Shadow)
		over = over || r == resultOverLimit
		c := s.m.of(t.Resolved.ClassName, t.Resolved.Tier)
		s.m.inc(c, int(r))
		if d.Degraded {
			s.m.inc(c, slotDegraded)
		}
		decisions[i] = newDecided(s.clock(), t.Resolved.Limit, r, d)
		decisions[i].cache = c
	}
	return targets, decisions, outcomeOK, nil
}

func (s *Service) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}

// failed maps a Limiter error to a gRPC status. Tokens taken for earlier
// descriptors of the request stay spent, which only under-admits.
func (s *Service) failed(ctx context.Context, i int, t Target, err error) (outcome, error) {
	switch {
	case errors.Is(err, quota.ErrInvalid):
		return outcomeInvalid, status.Errorf(codes.InvalidArgument, "descriptors[%d] (tenant %q, class %q): %v", i, t.Key.Tenant, t.Key.Class, err)
	case ctx.Err() != nil:
		return outcomeError, status.FromContextError(ctx.Err()).Err()
	}
	s.log.Warn("envoy rate-limit decision failed", "class", t.Key.Class, "err", err)
	return outcomeError, status.Errorf(codes.Unavailable, "envoyrls: deciding descriptors[%d]: %v", i, err)
}

// bareAnswer is a response with one descriptor's status, allocated
// together: the common request has one descriptor.
type bareAnswer struct {
	resp rlsv3.RateLimitResponse
	ptr  [1]*rlsv3.RateLimitResponse_DescriptorStatus
	one  [1]statusBlock
}

// answer is a bareAnswer with room for its headers.
type answer struct {
	bareAnswer
	headers headerBlock
}

// verdict is what an answer says beyond its statuses: its overall code
// and which descriptor its headers describe.
type verdict struct {
	out outcome
	// retry is the longest retry delay of the over-limit descriptors;
	// never says some over-limit descriptor can never pass (no
	// retry-after then).
	retry time.Duration
	never bool
	// shown is the descriptor the headers describe, when haveShown.
	shown      decided
	shownClass string
	haveShown  bool
}

func judge(targets []Target, decisions []decided) verdict {
	v := verdict{out: outcomeOK}
	shownShadow := false
	for i, t := range targets {
		if t.Unlimited || !t.Matched {
			continue
		}
		dd := decisions[i]
		if dd.result == resultOverLimit {
			v.out = outcomeOverLimit
			v.retry = max(v.retry, dd.retry)
			v.never = v.never || dd.never
		}
		// A descriptor in shadow mode never limits the caller, so the
		// headers describe it only when every matched descriptor is.
		if !v.haveShown || (shownShadow && !t.Shadow) || (shownShadow == t.Shadow && closerToExhaustion(dd, v.shown)) {
			v.shown, v.haveShown, v.shownClass, shownShadow = dd, true, t.Resolved.ClassName, t.Shadow
		}
	}
	return v
}

func (v verdict) code() rlsv3.RateLimitResponse_Code {
	if v.out == outcomeOverLimit {
		return rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return rlsv3.RateLimitResponse_OK
}

func (s *Service) respond(targets []Target, decisions []decided) (*rlsv3.RateLimitResponse, outcome) {
	var ba *bareAnswer
	var hb *headerBlock
	if s.headers {
		a := new(answer)
		ba, hb = &a.bareAnswer, &a.headers
	} else {
		ba = new(bareAnswer)
	}
	v := judge(targets, decisions)
	resp := &ba.resp
	resp.OverallCode = v.code()
	var blocks []statusBlock
	if len(targets) == 1 {
		resp.Statuses, blocks = ba.ptr[:], ba.one[:]
	} else {
		resp.Statuses = make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(targets))
		blocks = make([]statusBlock, len(targets))
	}
	for i, t := range targets {
		b := &blocks[i]
		switch {
		case t.Unlimited:
			// As envoyproxy/ratelimit answers it: OK, nothing counts down.
			b.st.Code, b.st.LimitRemaining = rlsv3.RateLimitResponse_OK, math.MaxUint32
			resp.Statuses[i] = &b.st
		case !t.Matched:
			b.st.Code = rlsv3.RateLimitResponse_OK
			resp.Statuses[i] = &b.st
		default:
			resp.Statuses[i] = b.fill(decisions[i], sharedFor(decisions[i], t.Resolved.ClassName))
		}
	}
	if hb != nil && v.haveShown {
		resp.ResponseHeadersToAdd = hb.build(v.shown, sharedFor(v.shown, v.shownClass), v.out == outcomeOverLimit, v.never, v.retry)
	}
	return resp, v.out
}
