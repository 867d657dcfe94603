package luascripts

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// Queued is a script call added to a pipeline: run the pipeline, then read
// the typed reply with the matching Parse function. Callers that batch
// concurrent requests into one pipeline (one round trip, one write and one
// read syscall for many requests) use these instead of the direct methods.
type Queued struct {
	Cmd    *redis.Cmd
	script *redis.Script
	keys   []string
	args   []any
	// gens and born: where the reply's generation of the call's data set
	// is recorded (nil for a call of no data set's script).
	gens *Generations
	born string
}

// note records the reply's generation (see Generations).
func (q *Queued) note(gen int64, reborn bool, nowUS int64) {
	if q.gens != nil {
		q.gens.note(q.born, gen, reborn, nowUS)
	}
}

// Rerun runs the call again on its own through EVALSHA with EVAL fallback:
// for a call whose pipelined EVALSHA met NOSCRIPT (the script cache was
// flushed, e.g. by a Redis restart).
func (q *Queued) Rerun(ctx context.Context, c redis.Scripter) {
	q.Cmd = q.script.Run(ctx, c, q.keys, q.args...)
}

// NoScript reports whether the call failed because Redis did not know the
// script.
func (q *Queued) NoScript() bool {
	return q.Cmd.Err() != nil && redis.HasErrorPrefix(q.Cmd.Err(), "NOSCRIPT")
}

func queue(ctx context.Context, p redis.Pipeliner, sc *redis.Script, keys []string, args []any) *Queued {
	return &Queued{Cmd: sc.EvalSha(ctx, p, keys, args...), script: sc, keys: keys, args: args}
}

// queue adds a call of sc on k's keys whose reply's generation is recorded.
func (s *Scripts) queue(ctx context.Context, p redis.Pipeliner, sc *redis.Script, k Keys, args []any) *Queued {
	q := queue(ctx, p, sc, k.list(), args)
	q.gens, q.born = s.gens, k.Born
	return q
}

// QueueCheck adds check.lua to p.
func (s *Scripts) QueueCheck(ctx context.Context, p redis.Pipeliner, k Keys, cm Common, cost int64) *Queued {
	return s.queue(ctx, p, s.check, k, s.args(k, cm, cost))
}

// QueueAcquire adds acquire.lua to p.
func (s *Scripts) QueueAcquire(ctx context.Context, p redis.Pipeliner, k Keys, cm Common, r Report) *Queued {
	return s.queue(ctx, p, s.acquire, k, s.args(k, cm, r.opArgs()...))
}

// ParseCheck reads a queued check's reply.
func ParseCheck(q *Queued) (CheckReply, error) {
	res, err := q.Cmd.Slice()
	if err != nil {
		tl, err := scriptErr("check", q.keys[0], err)
		var cr CheckReply
		cr.TooLate, cr.NowUS = late(tl)
		return cr, err
	}
	cr, err := parseCheck(res)
	if err == nil {
		q.note(cr.Gen, cr.Reborn, cr.NowUS)
	}
	return cr, err
}

// ParseLease reads a queued acquire or sync reply.
func ParseLease(q *Queued) (LeaseReply, error) {
	res, err := q.Cmd.Slice()
	if err != nil {
		tl, err := scriptErr("lease script", q.keys[0], err)
		var lr LeaseReply
		lr.TooLate, lr.NowUS = late(tl)
		return lr, err
	}
	lr, err := parseLease(res)
	if err == nil {
		q.note(lr.Gen, lr.Reborn, lr.NowUS)
	}
	return lr, err
}

// ParseSetRate reads a queued set_rate's reply.
func ParseSetRate(q *Queued) (SetRateReply, error) {
	res, err := q.Cmd.Slice()
	if err != nil {
		tl, err := scriptErr("set_rate", q.keys[0], err)
		var sr SetRateReply
		sr.TooLate, sr.NowUS = late(tl)
		return sr, err
	}
	sr, err := parseSetRate(res)
	if err == nil {
		q.note(sr.Gen, sr.Reborn, sr.NowUS)
	}
	return sr, err
}

func parseSetRate(res []any) (SetRateReply, error) {
	p := parser{res: res}
	sr := SetRateReply{Applied: p.int(0) == 1, Tokens: p.float(1), Outstanding: p.int(2), NowUS: p.int(3), Reclaimed: p.int(4),
		Gen: p.int(5), Reborn: p.int(6) == 1}
	return sr, p.err(7)
}

// RunQueued runs calls in one pipeline and reruns those that met NOSCRIPT.
// A transport error shows up in every call's Cmd.
func RunQueued(ctx context.Context, c interface {
	redis.Cmdable
	redis.Scripter
}, add func(p redis.Pipeliner) []*Queued) []*Queued {
	var qs []*Queued
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		qs = add(p)
		return nil
	})
	if err != nil {
		// A pipeline that failed before any reply (the connection's
		// AUTH refused) leaves its calls with neither a reply nor an
		// error: give them the pipeline's, not "unexpected type=<nil>".
		for _, q := range qs {
			if q.Cmd.Err() == nil && q.Cmd.Val() == nil {
				q.Cmd.SetErr(err)
			}
		}
	}
	for _, q := range qs {
		if q.NoScript() {
			q.Rerun(ctx, c)
		}
	}
	return qs
}
