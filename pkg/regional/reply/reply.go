// Package reply maps between the LeaseService's wire messages and the
// scripts' inputs and replies: how a region turns a script's reply into
// the Grant or CheckResponse an instance receives, and the status of a
// call its Redis failed (RedisFailedStatus). It does no I/O, so the
// regional service (pkg/regional) and the simulator (sim/world) answer
// with exactly the same fields.
package reply

import (
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/luascripts"
)

// Report is a key report of instance (incarnation) as the scripts take it.
// A key whose class is strict now only books the lease the instance
// already has: it opens none and grants nothing, but the usage and returns
// of a lease issued before a mode change are still applied exactly.
func Report(instance string, incarnation uint64, r *sluicev1.KeyReport, strict bool) luascripts.Report {
	rep := luascripts.Report{
		Instance: instance, Incarnation: incarnation, Lease: r.GetLease(), Seq: r.GetSeq(), Used: r.GetUsed(),
		Denied: r.GetDenied(), Returned: r.GetReturned(), Want: r.GetWant(), Min: r.GetMin(), BuiltUS: r.GetBuiltUs(),
	}
	if strict {
		rep.BookOnly, rep.Want, rep.Min = true, 0, 0
	}
	return rep
}

// Grant fills g, the answer to the report with seq on key (resolved as
// res), from the script's reply; unleased says the region runs with no
// global tier (regional.Options.Unleased), so its rate and cap are its
// static share for good. key is stored as is (not copied).
func Grant(g *sluicev1.Grant, key *sluicev1.QuotaKey, res config.Resolved, seq uint64, lr luascripts.LeaseReply, unleased bool) *sluicev1.Grant {
	g.Key = key
	g.Seq = seq
	g.Granted = lr.Granted
	g.TtlMs = lr.TTL.Milliseconds()
	g.Remaining = max(lr.Remaining, 0)
	g.RetryAfterMs = luascripts.WireMS(lr.RetryAfter)
	g.RegionRate = lr.Rate
	g.RegionBurst = lr.Cap
	g.LiveInstances = lr.Live
	g.Limit = res.Limit.Burst
	g.ResetMs = lr.Reset.Milliseconds()
	g.Shadow = res.Shadow
	g.Mode = string(res.Class.Mode)
	g.OnFailure = string(res.Class.OnFailure)
	g.Tier = res.Tier
	g.Unleased = unleased
	return g
}

// Strict is the reply to a lease request on a strict class, which runs no
// script: no tokens, the region's static share, and the mode tells the
// caller to use Check.
func Strict(c luascripts.Common) luascripts.LeaseReply {
	return luascripts.LeaseReply{Rate: c.StaticRate, Cap: c.StaticBurst}
}

// Check is the answer to a Check on a key resolved as res; unleased as for
// Grant.
func Check(res config.Resolved, cr luascripts.CheckReply, unleased bool) *sluicev1.CheckResponse {
	return &sluicev1.CheckResponse{
		Allowed:      cr.Allowed,
		Limit:        res.Limit.Burst,
		Remaining:    max(cr.Remaining, 0),
		RetryAfterMs: luascripts.WireMS(cr.RetryAfter),
		ResetMs:      cr.Reset.Milliseconds(),
		Shadow:       res.Shadow,
		RegionRate:   &cr.Rate,
		RegionBurst:  &cr.Cap,
		Unleased:     unleased,
	}
}

// DefaultRedisTimeout is the regional daemon's default bound on one Redis
// call (regional.DaemonOptions.RedisTimeout).
const DefaultRedisTimeout = 500 * time.Millisecond

// Reason and domain of the errdetails.ErrorInfo a regional service
// attaches to an Unavailable answer when its Redis failed the call (an
// error, or no answer within the service's own bound): the service itself
// answered. A caller tells it from a service it could not reach at all
// with RedisFailed; both are Unavailable, and an instance decides either
// by on_failure.
const (
	ErrorDomain       = "sluice.regional"
	ReasonRedisFailed = "REDIS_FAILED"
)

// RedisFailedStatus is the answer to a call whose Redis failed with err:
// Unavailable, err's message, and the ErrorInfo above.
func RedisFailedStatus(err error) error {
	st := status.New(codes.Unavailable, err.Error())
	if d, derr := st.WithDetails(&errdetails.ErrorInfo{Domain: ErrorDomain, Reason: ReasonRedisFailed}); derr == nil {
		st = d
	}
	return st.Err()
}

// RedisFailed reports whether err is a regional service's answer that its
// Redis failed the call (RedisFailedStatus): the service was reached and
// answered.
func RedisFailed(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain && info.GetReason() == ReasonRedisFailed {
			return true
		}
	}
	return false
}
