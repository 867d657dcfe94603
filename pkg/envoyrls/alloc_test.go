package envoyrls

import (
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/pkg/quota"
)

// TestAnswerMatchesReference: the status and headers built in place,
// without fmt and with their messages allocated together, are exactly
// what the straightforward construction (kept here as the reference)
// builds, over random decisions.
func TestAnswerMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	classes := []string{"read", "a", "write.bulk:x@y-z_1", `we"ird\cl` + "\x01ass\u00e9", ""}
	durations := []time.Duration{0, 1, time.Millisecond, 999 * time.Millisecond, time.Second, 1500 * time.Millisecond, 3 * time.Hour, -time.Second}
	// Answers about one class share parts while its limit stays the
	// same; the random limits change it often.
	caches := map[string]*classCounters{}
	for _, c := range classes {
		caches[c] = &classCounters{class: c}
	}
	for i := range 20000 {
		dd := decided{
			limit:     quota.Limit{Rate: []float64{0, 0.1, 1, 2.5, 100, 1e9, 5e9}[r.IntN(7)], Burst: []int64{0, 1, 5, 100, 1e9, math.MaxInt64}[r.IntN(6)]},
			result:    result(r.IntN(int(numResults))),
			cap:       []int64{0, 3, 1e9, math.MaxInt64}[r.IntN(4)],
			remaining: []uint32{0, 1, 99, math.MaxUint32}[r.IntN(4)],
			reset:     durations[r.IntN(len(durations))],
			retry:     durations[r.IntN(len(durations))],
			never:     r.IntN(4) == 0,
		}
		class := classes[r.IntN(len(classes))]
		if r.IntN(8) != 0 {
			dd.cache = caches[class]
		}
		if got, want := dd.status(class), referenceStatus(dd, class); !proto.Equal(got, want) {
			t.Fatalf("case %d: status %v, want %v", i, got, want)
		}
		overLimit, never := r.IntN(2) == 0, r.IntN(4) == 0
		retry := durations[r.IntN(len(durations))]
		got, want := headers(dd, class, overLimit, never, retry), referenceHeaders(dd, class, overLimit, never, retry)
		if len(got) != len(want) {
			t.Fatalf("case %d: %d headers, want %d", i, len(got), len(want))
		}
		for j := range got {
			if !proto.Equal(got[j], want[j]) {
				t.Fatalf("case %d: header %d %v, want %v", i, j, got[j], want[j])
			}
		}
	}
}

// TestHeadersAllocateOnce: once the class's limit is cached, the headers
// of an answer cost two allocations (their block and their own values'
// one string) whatever their number, and its status one.
func TestHeadersAllocateOnce(t *testing.T) {
	dd := decided{limit: quota.Limit{Rate: 100, Burst: 200}, cap: 150, remaining: 7, reset: time.Second, cache: &classCounters{class: "read"}}
	if n := testing.AllocsPerRun(100, func() { headers(dd, "read", true, false, time.Second) }); n != 2 {
		t.Errorf("headers: %v allocations, want 2", n)
	}
	if n := testing.AllocsPerRun(100, func() { dd.status("read") }); n != 1 {
		t.Errorf("status: %v allocations, want 1", n)
	}
}

func referenceStatus(dd decided, className string) *rlsv3.RateLimitResponse_DescriptorStatus {
	code := rlsv3.RateLimitResponse_OK
	if dd.result == resultOverLimit {
		code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	n, unit := limitUnit(dd.limit)
	st := &rlsv3.RateLimitResponse_DescriptorStatus{
		Code:           code,
		CurrentLimit:   &rlsv3.RateLimitResponse_RateLimit{Name: className, RequestsPerUnit: n, Unit: unit},
		LimitRemaining: dd.remaining,
	}
	if !dd.never {
		st.DurationUntilReset = durationpb.New(dd.reset)
	}
	return st
}

func referenceHeaders(shown decided, className string, overLimit, never bool, retry time.Duration) []*corev3.HeaderValue {
	burst := strconv.FormatInt(shown.limit.Burst, 10)
	window := strconv.FormatInt(refillWindow(shown.limit), 10)
	remaining := strconv.FormatUint(uint64(shown.remaining), 10)
	name := sfString(className)
	h := []*corev3.HeaderValue{
		{Key: HeaderLimit, Value: strconv.FormatInt(shown.cap, 10) + ", " + burst + ";w=" + window},
		{Key: HeaderRemaining, Value: remaining},
		{Key: HeaderRateLimitPolicy, Value: name + ";q=" + burst + ";w=" + window},
	}
	var t int64
	switch {
	case overLimit && never, !overLimit && shown.never:
		h = append(h, &corev3.HeaderValue{Key: HeaderRateLimit, Value: name + ";r=" + remaining})
		return h
	case overLimit:
		t = max(ceilSeconds(retry), 1)
	default:
		t = ceilSeconds(shown.reset)
	}
	ts := strconv.FormatInt(t, 10)
	h = append(h,
		&corev3.HeaderValue{Key: HeaderRateLimit, Value: name + ";r=" + remaining + ";t=" + ts},
		&corev3.HeaderValue{Key: HeaderReset, Value: ts})
	if overLimit {
		h = append(h, &corev3.HeaderValue{Key: HeaderRetryAfter, Value: ts})
	}
	return h
}

// TestCountersCachedPerClassAndTier: counting through the cache from many
// goroutines at once lands every decision in its (class, tier, result)
// series, and creates a series only once it is counted, as the vectors
// alone did.
func TestCountersCachedPerClassAndTier(t *testing.T) {
	m := newMetrics()
	pairs := []classTier{{"read", "std"}, {"write", "std"}, {"read", "free"}}
	const goroutines, each = 8, 300
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				c := m.of(pairs[(g+i)%len(pairs)].class, pairs[(g+i)%len(pairs)].tier)
				m.inc(c, int(resultOK))
				if i%3 == 0 {
					m.inc(c, int(resultOverLimit))
				}
			}
		})
	}
	wg.Wait()
	var ok, over float64
	for _, p := range pairs {
		ok += counterValue(t, m.decisions.WithLabelValues(p.class, p.tier, "ok"))
		over += counterValue(t, m.decisions.WithLabelValues(p.class, p.tier, "over_limit"))
	}
	if ok != goroutines*each || over != goroutines*each/3 {
		t.Errorf("counted ok %v, over_limit %v; want %v, %v", ok, over, goroutines*each, goroutines*each/3)
	}
	// ok and over_limit of three pairs, looked up above too; no
	// shadow_denied and no degraded series.
	if n := seriesCount(m.decisions); n != 6 {
		t.Errorf("%d decision series, want 6", n)
	}
	if n := seriesCount(m.degraded); n != 0 {
		t.Errorf("%d degraded series, want 0", n)
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	var pb dto.Metric
	if err := c.Write(&pb); err != nil {
		t.Fatal(err)
	}
	return pb.GetCounter().GetValue()
}

func seriesCount(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric)
	go func() { c.Collect(ch); close(ch) }()
	n := 0
	for range ch {
		n++
	}
	return n
}

// TestSharedPartsConcurrently: answers built and marshalled at once from
// many goroutines share a class's parts while its limit changes under
// them (run with -race), and each answer still carries its own limit.
func TestSharedPartsConcurrently(t *testing.T) {
	cache := &classCounters{class: "read"}
	limits := []quota.Limit{{Rate: 100, Burst: 200}, {Rate: 5, Burst: 10}}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 500 {
				lim := limits[(g+i)%2]
				dd := decided{limit: lim, cap: lim.Burst, remaining: uint32(i), reset: time.Second, cache: cache}
				resp := &rlsv3.RateLimitResponse{
					Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{dd.status("read")},
					ResponseHeadersToAdd: headers(dd, "read", false, false, 0),
				}
				b, err := proto.Marshal(resp)
				if err != nil {
					t.Error(err)
					return
				}
				var back rlsv3.RateLimitResponse
				if err := proto.Unmarshal(b, &back); err != nil {
					t.Error(err)
					return
				}
				want := strconv.FormatInt(lim.Burst, 10) + ", " + strconv.FormatInt(lim.Burst, 10) + ";w=2"
				if got := back.GetResponseHeadersToAdd()[0].GetValue(); got != want {
					t.Errorf("x-ratelimit-limit %q, want %q", got, want)
					return
				}
			}
		})
	}
	wg.Wait()
}
