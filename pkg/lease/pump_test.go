package lease_test

import (
	"context"
	"errors"
	"path"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// regionConn is a grpc.ClientConnInterface for synctest bubbles: calls are
// served by a real regional server running outside the bubble (its Redis
// I/O cannot run on the bubble's fake clock), handed over on channels made
// outside the bubble, so the bubble's time stands still while the region
// works. Faults that a healthy region cannot produce on demand (unreachable,
// hanging) are injected here, per method.
type regionConn struct {
	srv   sluicev1.LeaseServiceServer
	calls chan *pumpCall
	free  chan *pumpCall

	mu       sync.Mutex
	faults   map[string]fault // guarded by mu; key "*" for every method
	attempts map[string]int   // guarded by mu: calls made, faulted or not
	served   []servedCall     // guarded by mu: calls that reached the region
}

type fault int

const (
	healthy     fault = iota
	unreachable       // fails at once with Unavailable
	hanging           // never answers; the caller's deadline ends the call
	slow              // answers after slowBy (bubble time): healthy but slow
)

// slowBy is how late a slow region answers.
const slowBy = 120 * time.Millisecond

type servedCall struct {
	method string
	at     time.Time // bubble time
	req    proto.Message
	resp   proto.Message
	err    error
}

type pumpCall struct {
	method string
	req    proto.Message
	resp   proto.Message
	err    error
	done   chan struct{}
}

func newRegionConn(t *testing.T, srv sluicev1.LeaseServiceServer) *regionConn {
	c := &regionConn{
		srv: srv, calls: make(chan *pumpCall), free: make(chan *pumpCall, 16),
		faults: map[string]fault{}, attempts: map[string]int{},
	}
	for range cap(c.free) {
		c.free <- &pumpCall{done: make(chan struct{})}
	}
	go func() {
		for pc := range c.calls {
			go c.serve(pc)
		}
	}()
	t.Cleanup(func() { close(c.calls) })
	return c
}

func (c *regionConn) serve(pc *pumpCall) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	switch pc.method {
	case "Acquire":
		pc.resp, pc.err = c.srv.Acquire(ctx, pc.req.(*sluicev1.AcquireRequest))
	case "Sync":
		pc.resp, pc.err = c.srv.Sync(ctx, pc.req.(*sluicev1.SyncRequest))
	case "Release":
		pc.resp, pc.err = c.srv.Release(ctx, pc.req.(*sluicev1.ReleaseRequest))
	case "Check":
		pc.resp, pc.err = c.srv.Check(ctx, pc.req.(*sluicev1.CheckRequest))
	default:
		pc.err = status.Errorf(codes.Unimplemented, "method %s", pc.method)
	}
	pc.done <- struct{}{}
}

func (c *regionConn) setFault(method string, f fault) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.faults[method] = f
}

func (c *regionConn) Invoke(ctx context.Context, method string, args, reply any, _ ...grpc.CallOption) error {
	name := path.Base(method)
	c.mu.Lock()
	c.attempts[name]++
	f, ok := c.faults[name]
	if !ok {
		f = c.faults["*"]
	}
	c.mu.Unlock()
	switch f {
	case unreachable:
		return status.Error(codes.Unavailable, "injected: region unreachable")
	case hanging:
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	case slow:
		select {
		case <-time.After(slowBy):
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	pc := <-c.free
	pc.method, pc.req = name, proto.Clone(args.(proto.Message))
	c.calls <- pc
	<-pc.done
	resp, err := pc.resp, pc.err
	c.free <- pc
	c.mu.Lock()
	c.served = append(c.served, servedCall{method: name, at: time.Now(), req: pc.req, resp: resp, err: err})
	c.mu.Unlock()
	if err != nil {
		return err
	}
	proto.Merge(reply.(proto.Message), resp)
	return nil
}

func (c *regionConn) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, errors.New("regionConn: streams are not used by the lease protocol")
}

func (c *regionConn) attemptCount(method string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.attempts[method]
}

// servedCalls returns the calls of method that reached the region.
func (c *regionConn) servedCalls(method string) []servedCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []servedCall
	for _, s := range c.served {
		if s.method == method {
			out = append(out, s)
		}
	}
	return out
}
