package luascripts

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// pipelineLog records the pipelines a client sends, and fails those it is
// told to as a connection that timed out would.
type pipelineLog struct {
	mu    sync.Mutex
	sizes []int
	fail  bool
}

func (h *pipelineLog) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *pipelineLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (h *pipelineLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) == 0 || cmds[0].Name() != "evalsha" {
			return next(ctx, cmds) // a connection's handshake
		}
		h.mu.Lock()
		h.sizes = append(h.sizes, len(cmds))
		fail := h.fail
		h.mu.Unlock()
		if fail {
			err := &net.OpError{Op: "write", Net: "tcp", Err: errTimeout}
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		return next(ctx, cmds)
	}
}

var errTimeout = errors.New("i/o timeout")

// TestLongRequestsAreSentInPipelinesOfTheTimeoutsSize: the 16,384 born
// sentinels of a cluster (or a Sync of 1000 reports) are sent in
// pipelines of at most PipelineCalls calls, each bounded by the client's
// timeout: one pipeline as long as the request timed out on a slow but
// healthy machine. Every call gets its reply. A pipeline that fails for
// its connection fails the calls not yet sent with its error, without
// sending them: a Redis that does not answer costs one timeout.
func TestLongRequestsAreSentInPipelinesOfTheTimeoutsSize(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	log := &pipelineLog{}
	rdb.AddHook(log)
	sc := New()
	ctx := context.Background()
	keys := BornKeys("sl:", true)
	bs, err := sc.StampBorn(ctx, rdb, keys, true)
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range bs {
		if !b.Written || b.BornUS != 0 {
			t.Fatalf("sentinel %d (%s): %+v, want written as 0", i, keys[i], b)
		}
	}
	// The regional batcher's pipelines, the size its Redis timeout is
	// chosen for.
	const most = 64
	want := (len(keys) + most - 1) / most
	if len(log.sizes) != want {
		t.Fatalf("%d calls sent in %d pipelines, want %d", len(keys), len(log.sizes), want)
	}
	sent := 0
	for _, n := range log.sizes {
		if n > most {
			t.Fatalf("a pipeline of %d calls, want at most %d", n, most)
		}
		sent += n
	}
	if sent != len(keys) {
		t.Fatalf("%d calls sent, want %d", sent, len(keys))
	}

	log.mu.Lock()
	log.sizes, log.fail = nil, true
	log.mu.Unlock()
	if _, err := sc.StampBorn(ctx, rdb, keys, false); !errors.Is(err, errTimeout) {
		t.Fatalf("stamp through a connection that times out: %v, want its error", err)
	}
	if len(log.sizes) > pipelinesInFlight {
		t.Fatalf("%d pipelines sent after the connection timed out, want at most the %d in flight", len(log.sizes), pipelinesInFlight)
	}
}
