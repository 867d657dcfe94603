package envoyrls

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// outcome classifies a whole ShouldRateLimit call for the latency
// histogram.
type outcome uint8

const (
	outcomeOK outcome = iota
	outcomeOverLimit
	outcomeInvalid
	outcomeError
	numOutcomes
)

func (o outcome) String() string {
	switch o {
	case outcomeOverLimit:
		return "over_limit"
	case outcomeInvalid:
		return "invalid_argument"
	case outcomeError:
		return "error"
	}
	return "ok"
}

type metrics struct {
	decisions *prometheus.CounterVec   // class, tier, result
	degraded  *prometheus.CounterVec   // class, tier
	unmatched prometheus.Counter       //
	unlimited prometheus.Counter       //
	duration  *prometheus.HistogramVec // result (an outcome)
	byOutcome [numOutcomes]prometheus.Observer

	// children caches the counters of each (class, tier) so that a
	// decision counts without a label lookup: copied on write under mu,
	// read without a lock. It holds the label sets the vectors hold.
	children atomic.Pointer[map[classTier]*classCounters]
	mu       sync.Mutex
}

type classTier struct{ class, tier string }

// classCounters are one (class, tier)'s counters, each looked up in its
// vector on its first use (so that a series appears once counted, as
// before the cache): slot r is result r, slot numResults degraded.
type classCounters struct {
	class, tier string
	slots       [numResults + 1]atomic.Pointer[counterBox]
	// shared is the answer parts of the class's last limit (see shared).
	shared atomic.Pointer[shared]
}

type counterBox struct{ prometheus.Counter }

const slotDegraded = int(numResults)

// inc adds one to c's counter in slot.
func (m *metrics) inc(c *classCounters, slot int) {
	b := c.slots[slot].Load()
	if b == nil {
		// Racing callers get the same child from the vector.
		if slot == slotDegraded {
			b = &counterBox{m.degraded.WithLabelValues(c.class, c.tier)}
		} else {
			b = &counterBox{m.decisions.WithLabelValues(c.class, c.tier, result(slot).String())}
		}
		c.slots[slot].Store(b)
	}
	b.Inc()
}

// of returns the counters of class and tier.
func (m *metrics) of(class, tier string) *classCounters {
	k := classTier{class, tier}
	if p := m.children.Load(); p != nil {
		if c, ok := (*p)[k]; ok {
			return c
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old := m.children.Load()
	if old != nil {
		if c, ok := (*old)[k]; ok {
			return c
		}
	}
	next := make(map[classTier]*classCounters, 1)
	if old != nil {
		next = make(map[classTier]*classCounters, len(*old)+1)
		for k, v := range *old {
			next[k] = v
		}
	}
	c := &classCounters{class: class, tier: tier}
	next[k] = c
	m.children.Store(&next)
	return c
}

func newMetrics() *metrics {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_envoy_decisions_total",
			Help: "Envoy descriptors decided, by class, tier and result (ok, over_limit, shadow_denied).",
		}, []string{"class", "tier", "result"}),
		degraded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_envoy_degraded_decisions_total",
			Help: "Envoy descriptors decided by the class's on_failure policy because the region could not be reached.",
		}, []string{"class", "tier"}),
		unmatched: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_envoy_unmatched_descriptors_total",
			Help: "Envoy descriptors that matched no envoy.descriptors mapping or envoy.domains tree (answered OK, charged nothing).",
		}),
		unlimited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_envoy_unlimited_descriptors_total",
			Help: "Envoy descriptors an envoy.domains node with unlimited: true decided (answered OK, charged nothing).",
		}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sluice_envoy_request_duration_seconds",
			Help: "ShouldRateLimit handling time, by result (ok, over_limit, invalid_argument, error).",
			// 25µs (a decision from a held lease) to ~0.6s (waiting on the region).
			Buckets: prometheus.ExponentialBuckets(25e-6, 2.5, 12),
		}, []string{"result"}),
	}
	for o := range numOutcomes {
		m.byOutcome[o] = m.duration.WithLabelValues(o.String())
	}
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.decisions, m.degraded, m.unmatched, m.unlimited, m.duration}
}

func (m *metrics) register(reg prometheus.Registerer) error {
	var done []prometheus.Collector
	for _, c := range m.collectors() {
		if err := reg.Register(c); err != nil {
			for _, d := range done {
				reg.Unregister(d)
			}
			var dup prometheus.AlreadyRegisteredError
			if errors.As(err, &dup) {
				return fmt.Errorf("envoyrls: metrics already registered (one Service per registry): %w", err)
			}
			return fmt.Errorf("envoyrls: registering metrics: %w", err)
		}
		done = append(done, c)
	}
	return nil
}
