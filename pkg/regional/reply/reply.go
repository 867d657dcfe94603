// Package reply maps between the LeaseService's wire messages and the
// scripts' inputs and replies: how a region turns a script's reply into
// the Grant or CheckResponse an instance receives. It does no I/O, so the
// regional service (pkg/regional) and the simulator (sim/world) answer
// with exactly the same fields.
package reply

import (
	"time"

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
