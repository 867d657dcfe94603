package luascripts

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

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
	if len(res) == 7 {
		// The older layout's scripts reply without released (parseState).
		res = append(append(res[:5:5], "0"), res[5:]...)
	}
	if len(res) == 8 {
		// Older scripts reply without deposited.
		res = append(append(res[:6:6], "0"), res[6:]...)
	}
	p := parser{res: res}
	sr := SetRateReply{Applied: p.int(0) == 1, Tokens: p.float(1), Outstanding: p.int(2), NowUS: p.int(3), Reclaimed: p.int(4),
		Released: p.float(5), Deposited: p.float(6), Gen: p.int(7), Reborn: p.int(8) == 1}
	return sr, p.err(9)
}

// PipelineCalls is the most script calls one pipeline carries. The Redis
// client's read and write timeouts bound one pipeline's round trip, not
// one call's, so a pipeline as long as a request allows (a Sync of 1000
// reports, the 16384 born sentinels of a cluster) missed a timeout sized
// for a hung Redis on a slow but healthy machine: its write or read alone
// took longer. A pipeline of this many calls is what the regional
// service's batcher sends for concurrent requests, the size the timeout is
// chosen for.
const PipelineCalls = 64

// pipelinesInFlight bounds how many of one request's pipelines run at
// once: a long request costs about one round trip of its pipelines
// side by side, as its single pipeline did, without taking every
// connection of the client's pool.
const pipelinesInFlight = 4

// RunQueued runs calls in pipelines of at most PipelineCalls calls, up to
// pipelinesInFlight at once, and reruns those that met NOSCRIPT. A
// transport error shows up in every call of its pipeline, and in every
// call of the pipelines not yet sent then: a Redis that does not answer
// costs one timeout, not one per pipeline.
func RunQueued(ctx context.Context, c interface {
	redis.Cmdable
	redis.Scripter
}, add func(p redis.Pipeliner) []*Queued) []*Queued {
	// The calls are built on a pipeline that is never run, then sent in
	// pipelines of their own.
	build := c.Pipeline()
	qs := add(build)
	build.Discard()
	chunks := (len(qs) + PipelineCalls - 1) / PipelineCalls
	var (
		next   atomic.Int64
		failed atomic.Pointer[error]
		wg     sync.WaitGroup
	)
	for range min(chunks, pipelinesInFlight) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= chunks {
					return
				}
				chunk := qs[i*PipelineCalls : min(len(qs), (i+1)*PipelineCalls)]
				if errp := failed.Load(); errp != nil {
					for _, q := range chunk {
						q.Cmd.SetErr(*errp)
					}
					continue
				}
				if err := runPipeline(ctx, c, chunk); err != nil {
					failed.CompareAndSwap(nil, &err)
				}
			}
		})
	}
	wg.Wait()
	for _, q := range qs {
		if q.NoScript() {
			q.Rerun(ctx, c)
		}
	}
	return qs
}

// runPipeline sends chunk's calls in one pipeline; it returns the
// pipeline's error when no call got a reply of Redis's own (the
// connection failed or timed out), nil otherwise.
func runPipeline(ctx context.Context, c redis.Cmdable, chunk []*Queued) error {
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, q := range chunk {
			_ = p.Process(ctx, q.Cmd) // queues it: a pipeline's Process never fails
		}
		return nil
	})
	if err == nil {
		return nil
	}
	transport := true
	for _, q := range chunk {
		// A pipeline that failed before any reply (the connection's
		// AUTH refused) leaves its calls with neither a reply nor an
		// error: give them the pipeline's, not "unexpected type=<nil>".
		if q.Cmd.Err() == nil && q.Cmd.Val() == nil {
			q.Cmd.SetErr(err)
		}
		var re redis.Error
		if q.Cmd.Err() == nil || errors.As(q.Cmd.Err(), &re) {
			transport = false // Redis answered this call
		}
	}
	if transport {
		return err
	}
	return nil
}
