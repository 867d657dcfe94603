package regional

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/pkg/luascripts"
)

// batcher coalesces the script calls of concurrent RPCs into pipelines.
//
// Why: on a busy regional service most of the cost of a strict Check is not
// the Lua but the syscalls — one write and one read per request on the
// Redis connection, on both ends. A pipeline of n calls pays them once.
// Under light load a call goes alone (a batch of one), so latency is that
// of a direct call; under heavy load batches grow by themselves, up to
// maxBatch, because calls queue while the previous pipeline is in flight.
//
// Safe for concurrent use.
type batcher struct {
	rdb      Redis
	scripts  *luascripts.Scripts
	timeout  time.Duration
	maxBatch int
	reqs     chan *batchCall
}

// batchCall is one queued script call and where its result goes.
type batchCall struct {
	queue func(ctx context.Context, p redis.Pipeliner) *luascripts.Queued
	q     *luascripts.Queued
	done  chan struct{}
}

func newBatcher(rdb Redis, scripts *luascripts.Scripts, workers, maxBatch int, timeout time.Duration) *batcher {
	b := &batcher{rdb: rdb, scripts: scripts, timeout: timeout, maxBatch: maxBatch,
		reqs: make(chan *batchCall, workers*maxBatch)}
	for range workers {
		go b.work()
	}
	return b
}

// do queues one call and waits for its result (or ctx). The call may still
// run after ctx ends; its result is then dropped, which at worst
// under-admits. A caller already gone queues nothing: a select with both
// cases ready picks one at random, and would run its call one time in two.
func (b *batcher) do(ctx context.Context, queue func(context.Context, redis.Pipeliner) *luascripts.Queued) (*luascripts.Queued, error) {
	q, _, err := b.doThen(ctx, queue, nil)
	return q, err
}

// doThen is do, and when ctx ends after the call was queued, late (if not
// nil) gets the call once it has run, in a goroutine of its own: what the
// node answered (or did not within the pipeline's timeout) is known even
// though no caller waits for it any more. pending reports that late will
// be called.
func (b *batcher) doThen(ctx context.Context, queue func(context.Context, redis.Pipeliner) *luascripts.Queued, late func(*luascripts.Queued)) (q *luascripts.Queued, pending bool, err error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	c := &batchCall{queue: queue, done: make(chan struct{})}
	select {
	case b.reqs <- c:
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
	select {
	case <-c.done:
		return c.q, false, nil
	case <-ctx.Done():
		if late == nil {
			return nil, false, ctx.Err()
		}
		go func() {
			<-c.done
			late(c.q)
		}()
		return nil, true, ctx.Err()
	}
}

func (b *batcher) work() {
	batch := make([]*batchCall, 0, b.maxBatch)
	for first := range b.reqs {
		batch = append(batch[:0], first)
	fill:
		for len(batch) < b.maxBatch {
			select {
			case c, ok := <-b.reqs:
				if !ok {
					break fill
				}
				batch = append(batch, c)
			default:
				break fill
			}
		}
		b.run(batch)
	}
}

func (b *batcher) run(batch []*batchCall) {
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	// Errors are per call, in each call's Cmd.
	luascripts.RunQueued(ctx, b.rdb, func(p redis.Pipeliner) []*luascripts.Queued {
		qs := make([]*luascripts.Queued, len(batch))
		for i, c := range batch {
			c.q = c.queue(ctx, p)
			qs[i] = c.q
		}
		return qs
	})
	for _, c := range batch {
		close(c.done)
	}
}

// close stops the workers once queued calls are done.
func (b *batcher) close() { close(b.reqs) }
