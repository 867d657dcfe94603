package envoyrls_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/envoyrls"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestEncodedAnswersConcurrentlyAsRegister: a Service served with
// RegisterEncoded, called by many callers at once on one connection,
// sends every caller byte for byte the answer a Service served with
// Register sends for the same decisions, so no answer is built into, or
// read from, memory another call is using. Each caller asks about keys
// of its own (so the decisions on each key are in its order) with
// requests of every shape the codec reads: one descriptor of two
// entries, several descriptors, an unmatched one, a descriptor's
// hits_addend (read by proto.Unmarshal) and invalid requests; its keys
// run out, so answers are OK and OVER_LIMIT. The decisions are recorded
// by key and replayed, in each key's order, to the Register'd Service;
// both decide at one fixed clock.
func TestEncodedAnswersConcurrentlyAsRegister(t *testing.T) {
	const callers, calls = 16, 120
	var tenants strings.Builder
	for c := range callers {
		fmt.Fprintf(&tenants, "  caller%d: {tier: tiny}\n", c)
	}
	cfg := regiontest.MustConfig(t, strings.Replace(testConfig, "tenants:\n", "tenants:\n"+tenants.String(), 1))
	src := regional.StaticConfig{C: cfg}
	quiet := slog.New(slog.DiscardHandler)
	t0 := time.Now()
	clock := func() time.Time { return t0 }
	p := startProcess(t, redistest.Start(t), cfg, "envoy-concurrent", false)

	log := &keyedLog{byKey: map[quota.Key][]allowed{}}
	encoded, err := envoyrls.New(envoyrls.Options{Config: src, Logger: quiet, Limiter: &keyedRecorder{Limiter: p.lim, log: log}})
	if err != nil {
		t.Fatal(err)
	}
	envoyrls.SetClock(encoded, clock)
	reference, err := envoyrls.New(envoyrls.Options{Config: src, Logger: quiet, Limiter: &keyedReplayer{t: t, log: log}})
	if err != nil {
		t.Fatal(err)
	}
	envoyrls.SetClock(reference, clock)
	served, plain := serveEncoded(t, encoded), serveRegistered(t, reference)

	type exchange struct {
		req  *rlsv3.RateLimitRequest
		got  []byte
		err  error
		call int
	}
	sent := make([][]exchange, callers)
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(21, uint64(c)))
			for i := range calls {
				req := callerRequest(r, c)
				got, err := rawAnswer(t, served, req)
				sent[c] = append(sent[c], exchange{req, got, err, i})
			}
		})
	}
	wg.Wait()

	codes := map[rlsv3.RateLimitResponse_Code]int{}
	for c, list := range sent {
		for _, x := range list {
			want, wantErr := rawAnswer(t, plain, x.req)
			if fmt.Sprint(status.Convert(x.err)) != fmt.Sprint(status.Convert(wantErr)) {
				t.Fatalf("caller %d, call %d %v: answered error %v, Register %v", c, x.call, x.req, x.err, wantErr)
			}
			if string(x.got) != string(want) {
				t.Fatalf("caller %d, call %d %v: sent\n% x\nRegister sent\n% x", c, x.call, x.req, x.got, want)
			}
			if x.err == nil {
				var resp rlsv3.RateLimitResponse
				if err := proto.Unmarshal(x.got, &resp); err != nil {
					t.Fatalf("caller %d, call %d: %v", c, x.call, err)
				}
				codes[resp.GetOverallCode()]++
			}
		}
	}
	if rest := log.left(); rest != 0 {
		t.Errorf("%d decisions not replayed", rest)
	}
	t.Logf("answers by code of %d requests: %v", callers*calls, codes)
	if codes[rlsv3.RateLimitResponse_OK] < callers*calls/4 || codes[rlsv3.RateLimitResponse_OVER_LIMIT] < callers*calls/10 {
		t.Errorf("answers by code %v of %d requests: want at least a quarter OK and a tenth OVER_LIMIT", codes, callers*calls)
	}
}

// callerRequest draws a request of caller c about its own keys: its
// tiny-tier tenant's write (burst 3) and read (burst 10), a default-tier
// tenant's write (burst 100) and read through the edge domain, with unmatched descriptors,
// descriptors with hits_addend and, now and then, an invalid request.
func callerRequest(r *rand.Rand, c int) *rlsv3.RateLimitRequest {
	tiny := fmt.Sprintf("caller%d", c)
	descs := []func() *ratelimitv3.RateLimitDescriptor{
		func() *ratelimitv3.RateLimitDescriptor { return desc("tenant", tiny, "class", "write") },
		func() *ratelimitv3.RateLimitDescriptor { return desc("tenant", tiny, "class", "read") },
		func() *ratelimitv3.RateLimitDescriptor { return desc("tenant", tiny+"-std", "class", "write") },
		func() *ratelimitv3.RateLimitDescriptor { return desc("nobody", "x") },
	}
	switch r.IntN(10) {
	case 0:
		return request("edge", 0, desc("customer", tiny+"-edge"))
	case 1:
		return request("sluice", 0, withHits(descs[r.IntN(3)](), uint64(1+r.IntN(2))))
	case 2:
		return request("sluice", 0, desc("tenant", tiny, "class", "write", "tenant", "other")) // ambiguous: invalid
	case 3, 4:
		n := 2 + r.IntN(2)
		ds := make([]*ratelimitv3.RateLimitDescriptor, n)
		for i := range ds {
			ds[i] = descs[r.IntN(len(descs))]()
		}
		return request("sluice", uint32(r.IntN(3)), ds...)
	}
	return request("sluice", 0, descs[r.IntN(3)]())
}

// keyedLog is the decisions the served Service took, by key, for the
// reference Service to take again in each key's order.
type keyedLog struct {
	mu    sync.Mutex
	byKey map[quota.Key][]allowed
}

func (l *keyedLog) left() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, list := range l.byKey {
		n += len(list)
	}
	return n
}

// keyedRecorder is a Limiter that logs its Limiter's decisions by key.
type keyedRecorder struct {
	envoyrls.Limiter
	log *keyedLog
}

func (r *keyedRecorder) Allow(ctx context.Context, key quota.Key, cost int64) (quota.Decision, error) {
	d, err := r.Limiter.Allow(ctx, key, cost)
	r.log.mu.Lock()
	r.log.byKey[key] = append(r.log.byKey[key], allowed{key, cost, d, err})
	r.log.mu.Unlock()
	return d, err
}

// keyedReplayer is a Limiter that takes each key's logged decisions
// again, in order.
type keyedReplayer struct {
	t   *testing.T
	log *keyedLog
}

func (r *keyedReplayer) Allow(_ context.Context, key quota.Key, cost int64) (quota.Decision, error) {
	r.log.mu.Lock()
	defer r.log.mu.Unlock()
	list := r.log.byKey[key]
	if len(list) == 0 {
		r.t.Errorf("the reference asked for a decision on %v (cost %d) the served Service did not take", key, cost)
		return quota.Decision{}, fmt.Errorf("no decision logged")
	}
	a := list[0]
	r.log.byKey[key] = list[1:]
	if a.cost != cost {
		r.t.Errorf("the reference asked for %v cost %d, the served Service decided cost %d", key, cost, a.cost)
	}
	return a.d, a.err
}
