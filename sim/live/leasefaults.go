package live

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// leasePrefix names the lease service's methods, the only calls the
// faults between instances and their region touch.
var leasePrefix = "/" + sluicev1.LeaseService_ServiceDesc.ServiceName + "/"

// leaseFaults are the faults injected between one region's instances and
// its regional service, as the virtual simulator's network injects them
// (sim/world): answers lost after the request was applied (reply-loss)
// and lease requests delivered a second time up to two refreshes later
// (report-replay). Reports carry (instance, incarnation, totals), so
// neither may change what is counted. Safe for concurrent use.
type leaseFaults struct {
	mu        sync.Mutex // guards the fields below
	replyLoss float64    // probability an applied request's answer is lost
	replay    float64    // probability a lease request is delivered again
	rng       *rand.Rand

	lost, replays atomic.Int64 // answers lost, requests delivered again
}

func (lf *leaseFaults) set(fn func(lf *leaseFaults)) {
	lf.mu.Lock()
	defer lf.mu.Unlock()
	fn(lf)
}

// draws returns whether this call's answer is lost and after how long it
// is delivered again (0: it is not), the delay drawn in [0, maxDelay).
func (lf *leaseFaults) draws(maxDelay time.Duration) (lost bool, again time.Duration) {
	lf.mu.Lock()
	defer lf.mu.Unlock()
	lost = lf.replyLoss > 0 && lf.rng.Float64() < lf.replyLoss
	if lf.replay > 0 && lf.rng.Float64() < lf.replay && maxDelay > 0 {
		again = 1 + time.Duration(lf.rng.Int64N(int64(maxDelay)))
	}
	return lost, again
}

// intercept is an instance's side of its region's faults; d schedules
// the replays (they end with the run), isolated cuts this instance off
// (instance-isolate, isolate.go).
func (lf *leaseFaults) intercept(d *deployment, isolated *atomic.Bool) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if !strings.HasPrefix(method, leasePrefix) {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		if isolated.Load() {
			// As a dropped packet: the caller's deadline ends the call.
			if _, ok := ctx.Deadline(); ok {
				<-ctx.Done()
			}
			return status.Error(codes.Unavailable, "injected fault: this instance is cut off from its region")
		}
		lost, again := lf.draws(2 * time.Duration(d.cfg.Refresh))
		if again > 0 {
			// The network or a proxy delivers it twice; the copy's answer
			// goes nowhere. Cloned now: the caller may reuse its request.
			dup := proto.Clone(req.(proto.Message))
			out := proto.Clone(reply.(proto.Message))
			d.afterReal(again, func(ctx context.Context) {
				lf.replays.Add(1)
				cctx, cancel := context.WithTimeout(ctx, time.Duration(d.cfg.Refresh))
				defer cancel()
				_ = invoker(cctx, method, dup, out, cc, opts...)
			})
		}
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err == nil && lost {
			lf.lost.Add(1)
			proto.Reset(reply.(proto.Message))
			return status.Error(codes.Unavailable, "injected fault: the region applied the request and its answer was lost")
		}
		return err
	}
}

// afterReal runs f after v of real time with the run's replay context,
// unless the traffic stopped first.
func (d *deployment) afterReal(v time.Duration, f func(ctx context.Context)) {
	if d.replayCtx.Err() != nil {
		return
	}
	d.replayJobs.Add(1)
	go func() {
		defer d.replayJobs.Done()
		t := time.NewTimer(v)
		defer t.Stop()
		select {
		case <-d.replayCtx.Done():
		case <-t.C:
			f(d.replayCtx)
		}
	}()
}
