package luascripts

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// BatchKeys is how many keys one batched call (StateMany, SetRateMany)
// carries at most: enough that the script's fixed cost (about 10 µs) is
// a small part of the call, few enough that one call holds Redis for
// about a millisecond (a key's state read is about 15 µs, an install
// about 26 µs).
const BatchKeys = 50

// KeyCommon is one key of a StateMany.
type KeyCommon struct {
	Keys   Keys
	Common Common
}

// StateResult is one key's outcome of StateMany.
type StateResult struct {
	State State
	Err   error
}

// StateMany runs state.lua for many keys, in calls of up to BatchKeys
// keys of one hash slot (batch.lua), in pipelines (RunQueued). Each key's
// reply and writes are exactly those of State for it alone, in order, at
// its call's one reading of the Redis clock (every key of a call replies
// the same NowUS).
func (s *Scripts) StateMany(ctx context.Context, c interface {
	redis.Cmdable
	redis.Scripter
}, items []KeyCommon) []StateResult {
	out := make([]StateResult, len(items))
	s.runMany(ctx, c, s.stateBatch, len(items), func(i int) Keys { return items[i].Keys },
		func(i int) []any { return s.args(items[i].Keys, items[i].Common) },
		func(i int, res []any, err error) {
			if err != nil {
				var tl *TooLateError
				tl, out[i].Err = scriptErr("state", items[i].Keys.Bucket, err)
				out[i].State.TooLate, out[i].State.NowUS = late(tl)
				return
			}
			out[i].State, out[i].Err = parseState(res)
			if out[i].Err == nil {
				s.gens.note(items[i].Keys.Born, out[i].State.Gen, out[i].State.Reborn, out[i].State.NowUS)
			}
		})
	return out
}

// SetRateItem is one grant of a SetRateMany: the key, its settings, and
// the grant as SetRate takes it (the caller validated rate, burst and
// deposit: finite, >= 0).
type SetRateItem struct {
	Keys               Keys
	Common             Common
	Rate, Burst        float64
	ExpiryUS, IssuedUS int64
	Deposit            float64
}

// SetRateResult is one key's outcome of SetRateMany.
type SetRateResult struct {
	Reply SetRateReply
	Err   error
}

// SetRateMany runs set_rate.lua for many keys as StateMany does state.lua.
func (s *Scripts) SetRateMany(ctx context.Context, c interface {
	redis.Cmdable
	redis.Scripter
}, items []SetRateItem) []SetRateResult {
	out := make([]SetRateResult, len(items))
	s.runMany(ctx, c, s.setRateBatch, len(items), func(i int) Keys { return items[i].Keys }, func(i int) []any {
		it := items[i]
		return s.args(it.Keys, it.Common, fmtFloat(it.Rate), fmtFloat(it.Burst), it.ExpiryUS, it.IssuedUS, fmtFloat(it.Deposit))
	}, func(i int, res []any, err error) {
		if err != nil {
			var tl *TooLateError
			tl, out[i].Err = scriptErr("set_rate", items[i].Keys.Bucket, err)
			out[i].Reply.TooLate, out[i].Reply.NowUS = late(tl)
			return
		}
		out[i].Reply, out[i].Err = parseSetRate(res)
		if out[i].Err == nil {
			s.gens.note(items[i].Keys.Born, out[i].Reply.Gen, out[i].Reply.Reborn, out[i].Reply.NowUS)
		}
	})
	return out
}

// runMany groups the n keys (key i is keyOf(i)) by born sentinel (one per
// hash slot on a cluster, one per Redis otherwise) into calls of sc of up
// to BatchKeys keys, runs them in pipelines (RunQueued) and hands each key's reply
// (or error) to done.
func (s *Scripts) runMany(ctx context.Context, c interface {
	redis.Cmdable
	redis.Scripter
}, sc *redis.Script, n int, keyOf func(i int) Keys, args func(i int) []any, done func(i int, res []any, err error)) {
	var calls [][]int
	open := map[string]int{} // born sentinel -> its call still taking keys
	for i := range n {
		born := keyOf(i).Born
		ci, ok := open[born]
		if !ok || len(calls[ci]) == BatchKeys {
			ci = len(calls)
			calls = append(calls, make([]int, 0, min(BatchKeys, n-i)))
			open[born] = ci
		}
		calls[ci] = append(calls[ci], i)
	}
	qs := RunQueued(ctx, c, func(p redis.Pipeliner) []*Queued {
		out := make([]*Queued, len(calls))
		for ci, call := range calls {
			ks := make([]string, 0, 6*len(call))
			var as []any
			for j, i := range call {
				a := args(i)
				if j == 0 {
					as = make([]any, 0, 1+len(a)*len(call))
					as = append(as, len(a))
				}
				ks = append(ks, keyOf(i).list()...)
				as = append(as, a...)
			}
			out[ci] = queue(ctx, p, sc, ks, as)
		}
		return out
	})
	for ci, q := range qs {
		res, err := q.Cmd.Slice()
		for j, i := range calls[ci] {
			switch {
			case err != nil:
				done(i, nil, err)
			case j >= len(res):
				done(i, nil, fmt.Errorf("%w: batch reply of %d entries for %d keys", ErrReply, len(res), len(calls[ci])))
			default:
				switch v := res[j].(type) {
				case []any:
					done(i, v, nil)
				case error:
					done(i, nil, v)
				default:
					done(i, nil, fmt.Errorf("%w: batch entry %T, want array", ErrReply, res[j]))
				}
			}
		}
	}
}
