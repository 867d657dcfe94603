package lease

import (
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/status"
)

// Metrics. Labels never carry tenant ids: class, tier, result, degraded,
// path, method and code are bounded sets.
//
//	sluice_client_decisions_total{class,tier,result,degraded}  counter, folded
//	    from per-key atomics at scrape time (the hot path never touches
//	    Prometheus)
//	sluice_client_decision_duration_seconds{path}  histogram; path="slow"
//	    observes every decision that missed the lock-free path, path="fast"
//	    observes one in fastSampleRate lock-free decisions (its count is a
//	    sample, its distribution is representative)
//	sluice_client_rpc_duration_seconds{method,code}  histogram per lease RPC
//	sluice_client_degraded  gauge: 1 in degraded mode (Table.Degraded):
//	    from a decision by an on_failure policy until the region answers a
//	    call again, also while no key is active (the degraded keys idled
//	    out), since the next request would find the region as last seen
//	sluice_client_degraded_episodes_total  counter: entries into degraded
//	    mode (the gauge rising from 0), also those shorter than a scrape
//	sluice_client_credentials_refused  gauge: 1 while the region's last
//	    answer to this client refused its credentials (PermissionDenied or
//	    Unauthenticated): degraded by the client's certificate, not by an
//	    outage of the region
//	sluice_client_keys, sluice_client_tokens_held  gauges

// fastSampleRate: one in this many fast-path decisions is timed.
const fastSampleRate = 1024

type metrics struct {
	reg       prometheus.Registerer
	latency   *prometheus.HistogramVec
	fast      prometheus.Observer
	slow      prometheus.Observer
	rpc       *prometheus.HistogramVec
	collector *tableCollector
	// refused is whether the region's last answer refused the client's
	// credentials (Client.observeRPC sets it).
	refused atomic.Bool
}

func newMetrics(reg prometheus.Registerer, t *Table) (*metrics, error) {
	m := &metrics{
		reg: reg,
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_client_decision_duration_seconds",
			Help:    "Time to decide one Allow. path=fast is sampled (one in 1024 lock-free decisions); path=slow observes every other decision.",
			Buckets: prometheus.ExponentialBuckets(50e-9, 4, 13),
		}, []string{"path"}),
		rpc: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_client_rpc_duration_seconds",
			Help:    "Latency of lease RPCs to the regional service, by method and gRPC code.",
			Buckets: prometheus.ExponentialBuckets(100e-6, 2, 15),
		}, []string{"method", "code"}),
	}
	m.collector = newTableCollector(t, &m.refused)
	m.fast = m.latency.WithLabelValues("fast")
	m.slow = m.latency.WithLabelValues("slow")
	if reg == nil {
		return m, nil
	}
	var done []prometheus.Collector
	for _, c := range []prometheus.Collector{m.latency, m.rpc, m.collector} {
		if err := reg.Register(c); err != nil {
			for _, d := range done {
				reg.Unregister(d)
			}
			return nil, fmt.Errorf("lease: registering client metrics: %w", err)
		}
		done = append(done, c)
	}
	return m, nil
}

func (m *metrics) unregister() {
	if m.reg == nil {
		return
	}
	m.reg.Unregister(m.latency)
	m.reg.Unregister(m.rpc)
	m.reg.Unregister(m.collector)
}

func (m *metrics) observeRPC(method string, start time.Time, err error) {
	code := "OK"
	if err != nil {
		code = status.Code(err).String()
		if errors.Is(err, errBreakerOpen) {
			code = "BreakerOpen"
		}
	}
	m.rpc.WithLabelValues(method, code).Observe(time.Since(start).Seconds())
}

type tableCollector struct {
	t         *Table
	refused   *atomic.Bool
	credRef   *prometheus.Desc
	decisions *prometheus.Desc
	degraded  *prometheus.Desc
	episodes  *prometheus.Desc
	keys      *prometheus.Desc
	tokens    *prometheus.Desc
}

func newTableCollector(t *Table, refused *atomic.Bool) *tableCollector {
	return &tableCollector{
		t:       t,
		refused: refused,
		credRef: prometheus.NewDesc("sluice_client_credentials_refused",
			"1 while the regional service's last answer to this client refused its credentials (PermissionDenied: the certificate lacks the instance role; Unauthenticated: none was presented; a TLS alert about its certificate), or its own certificate is outside its validity period and was not presented. The client decides by on_failure meanwhile (sluice_client_degraded is 1) though the region is up.", nil, nil),
		decisions: prometheus.NewDesc("sluice_client_decisions_total",
			"Allow decisions by class, tier, result (allowed, denied, shadow_denied) and whether the on_failure policy made them.",
			[]string{"class", "tier", "result", "degraded"}, nil),
		degraded: prometheus.NewDesc("sluice_client_degraded",
			"1 from a decision by a class's on_failure policy (the regional service did not answer) until the regional service answers a call again, also while no key is active.", nil, nil),
		episodes: prometheus.NewDesc("sluice_client_degraded_episodes_total",
			"Times the instance entered degraded mode (sluice_client_degraded rose from 0), including episodes shorter than a scrape.", nil, nil),
		keys:   prometheus.NewDesc("sluice_client_keys", "Quota keys the instance tracks.", nil, nil),
		tokens: prometheus.NewDesc("sluice_client_tokens_held", "Leased tokens held locally, all keys.", nil, nil),
	}
}

func (c *tableCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.decisions
	ch <- c.degraded
	ch <- c.credRef
	ch <- c.episodes
	ch <- c.keys
	ch <- c.tokens
}

func (c *tableCollector) Collect(ch chan<- prometheus.Metric) {
	for _, n := range c.t.Counts() {
		ch <- prometheus.MustNewConstMetric(c.decisions, prometheus.CounterValue, float64(n.N),
			n.Class, n.Tier, n.Result.String(), strconv.FormatBool(n.Degraded))
	}
	degraded := 0.0
	if c.t.Degraded() {
		degraded = 1
	}
	ch <- prometheus.MustNewConstMetric(c.degraded, prometheus.GaugeValue, degraded)
	refused := 0.0
	if c.refused.Load() {
		refused = 1
	}
	ch <- prometheus.MustNewConstMetric(c.credRef, prometheus.GaugeValue, refused)
	ch <- prometheus.MustNewConstMetric(c.episodes, prometheus.CounterValue, float64(c.t.DegradedEpisodes()))
	ch <- prometheus.MustNewConstMetric(c.keys, prometheus.GaugeValue, float64(c.t.Len()))
	ch <- prometheus.MustNewConstMetric(c.tokens, prometheus.GaugeValue, float64(c.t.HeldTokens()))
}
