package allocator

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/pkg/hierarchy"
	"github.com/sluicehq/sluice/pkg/regionsync"
)

// metrics are the global tier's Prometheus series. Labels carry region
// names and results only, never tenants. A nil *metrics records nothing.
type metrics struct {
	allocation  prometheus.Histogram
	grants      *prometheus.CounterVec // region
	grantedRate *prometheus.GaugeVec   // region
	reports     *prometheus.CounterVec // region, result
	nudges      *prometheus.CounterVec // region
	historyFail prometheus.Counter
}

// newMetrics registers the series of s on reg (when not nil) and attaches
// them to s. Call it before s serves.
func newMetrics(reg prometheus.Registerer, s *Service) *metrics {
	m := &metrics{
		allocation: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_global_allocation_seconds",
			Help:    "Time one allocation epoch (Allocate) took.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}),
		grants: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_global_grants_total", Help: "Key grants sent to regions.",
		}, []string{"region"}),
		grantedRate: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_global_granted_rate",
			Help: "Sum of the granted rates (tokens/s) in this leader's latest answer to each region (absent when not leading).",
		}, []string{"region"}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_global_reports_total",
			Help: "Region reports by result: ok, invalid, not_leader, stale or error; pages of paged reports also by page (taken, not the last) or page_out_of_order (refused: the region sends its report again from page 0).",
		}, []string{"region", "result"}),
		nudges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_global_nudges_total",
			Help: "Nudges sent on regions' Watch streams: requests to report now because capacity is moving (see docs/architecture.md, \"Nudges\").",
		}, []string{"region"}),
		historyFail: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_global_config_history_failed_total",
			Help: "Failed reads from etcd of the config of a revision a region reported and this replica never held (compacted, or etcd not answering); meanwhile a region reporting no revision held is reserved the largest share under the configs held.",
		}),
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	// revisionGauge is a config revision of the leader's Confirmations.
	revisionGauge := func(name, help string, rev func(*regionsync.Confirmations) (int64, bool)) prometheus.Collector {
		return gauge(name, help, func() float64 {
			if ok, _ := s.leaderAt(time.Now()); !ok {
				return -1
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if r, ok := rev(s.conf); ok {
				return float64(r)
			}
			return -1
		})
	}
	if reg != nil {
		reg.MustRegister(m.allocation, m.grants, leaderOnly{s: s, c: m.grantedRate}, m.reports, m.nudges, m.historyFail,
			gauge("sluice_global_watch_streams", "Open Watch streams (region leaders waiting for nudges).", func() float64 {
				return float64(s.hub.watchers())
			}),
			gauge("sluice_global_leader", "1 while this replica answers Sync as leader.", func() float64 {
				return boolGauge(s.IsLeader())
			}),
			gauge("sluice_global_learning", "1 while this replica leads in learning mode (only re-issuing held grants); 0 on a shard the live config does not name, which owns no keys.", func() float64 {
				now := time.Now()
				if ok, _ := s.leaderAt(now); !ok {
					return 0
				}
				s.mu.Lock()
				a, out := s.alloc, s.outLocked()
				s.mu.Unlock()
				if out {
					return 0
				}
				return boolGauge(a.Learning(now))
			}),
			gauge("sluice_global_epoch", "Allocation epochs run by the current allocator.", func() float64 {
				return float64(s.allocator().Epoch())
			}),
			gauge("sluice_global_contended_keys", "Keys some region wants more than its static share of (0 when not leading).", func() float64 {
				now := time.Now()
				if ok, _ := s.leaderAt(now); !ok {
					return 0
				}
				return float64(s.allocator().ContendedKeys())
			}),
			gauge("sluice_global_report_pages_bytes", "Bytes counted against -max-report-bytes for the paged region reports this replica holds until their last page arrives: the pages' wire bytes and 384 per key.", func() float64 {
				s.mu.Lock()
				defer s.mu.Unlock()
				return float64(s.pages.heldBytes())
			}),
			gauge("sluice_global_region_lease_below_failover", "1 while the config's region_lease is shorter than this replica's failover bound (session TTL + 0.5s + 5.25 epochs, allocator.FailoverBound): a leader that dies without resigning puts every region on its floor for part of the failover.", func() float64 {
				return boolGauge(s.leaseBelowFailover.Load())
			}),
			gauge("sluice_global_keys", "Keys the allocator tracks: named by a report or an answer within two grant validities and two epochs (0 when not leading).", func() float64 {
				if ok, _ := s.leaderAt(time.Now()); !ok {
					return 0
				}
				return float64(s.trackedKeys())
			}),
			revisionGauge("sluice_global_config_revision_confirmed", "The config revision this leader last confirmed to the regions (-1 when none yet or not leading).",
				func(c *regionsync.Confirmations) (int64, bool) { return c.Confirmed() }),
			revisionGauge("sluice_global_config_revision_assumed", "The config revision every region reported that this leader counts their shares under (-1 when none yet or not leading); above sluice_global_config_revision_confirmed for one grant validity and epoch, until the grants sized before have ended.",
				func(c *regionsync.Confirmations) (int64, bool) { return c.Assumed() }),
			&reportAgeCollector{s: s, desc: prometheus.NewDesc("sluice_global_region_report_age_seconds",
				"Seconds since the region's last accepted report to this leader (absent when never or not leading).",
				[]string{"region"}, nil)},
			&regionStateCollector{s: s, desc: prometheus.NewDesc("sluice_global_region_state",
				"1 for the state each region is in as this leader sees it (live, silent, lapsed, returning, drained), 0 for the others (absent when not leading).",
				[]string{"region", "state"}, nil)},
		)
	}
	s.m = m
	return m
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (m *metrics) report(region, result string) {
	if m == nil {
		return
	}
	m.reports.WithLabelValues(region, result).Inc()
}

func (m *metrics) answered(region string, grants int, rateSum float64) {
	if m == nil {
		return
	}
	m.reports.WithLabelValues(region, "ok").Inc()
	m.grants.WithLabelValues(region).Add(float64(grants))
	m.grantedRate.WithLabelValues(region).Set(rateSum)
}

func (m *metrics) nudgeSent(region string) {
	if m == nil {
		return
	}
	m.nudges.WithLabelValues(region).Inc()
}

func (m *metrics) historyFailed() {
	if m == nil {
		return
	}
	m.historyFail.Inc()
}

func (m *metrics) allocated(d time.Duration) {
	if m == nil {
		return
	}
	m.allocation.Observe(d.Seconds())
}

// newTerm drops the granted rates of an earlier term, which regions'
// answers in this one replace: a replica that leads again does not export
// the rates it answered before another leader took over.
func (m *metrics) newTerm() {
	if m == nil {
		return
	}
	m.grantedRate.Reset()
}

// leaderOnly exports a leader's gauge only while this replica leads: an
// ex-leader's last values would be summed with the new leader's.
type leaderOnly struct {
	s *Service
	c *prometheus.GaugeVec
}

func (l leaderOnly) Describe(ch chan<- *prometheus.Desc) { l.c.Describe(ch) }

func (l leaderOnly) Collect(ch chan<- prometheus.Metric) {
	if ok, _ := l.s.leaderAt(time.Now()); ok {
		l.c.Collect(ch)
	}
}

// forgetRegion drops the gauge of a region removed from the config, so it
// does not report its last value forever.
func (m *metrics) forgetRegion(region string) {
	if m == nil {
		return
	}
	m.grantedRate.DeleteLabelValues(region)
}

// reportAgeCollector computes report ages at scrape time.
type reportAgeCollector struct {
	s    *Service
	desc *prometheus.Desc
}

func (c *reportAgeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *reportAgeCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	if ok, _ := c.s.leaderAt(now); !ok {
		return
	}
	c.s.mu.Lock()
	ages := make(map[string]float64, len(c.s.lastReport))
	for region, at := range c.s.lastReport {
		ages[region] = now.Sub(at).Seconds()
	}
	c.s.mu.Unlock()
	for region, age := range ages {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, age, region)
	}
}

// regionStates are the values of sluice_global_region_state's state label.
var regionStates = []hierarchy.RegionState{
	hierarchy.StateLive, hierarchy.StateSilent, hierarchy.StateLapsed, hierarchy.StateReturning, hierarchy.StateDrained,
}

// regionStateCollector reads the regions' states at scrape time.
type regionStateCollector struct {
	s    *Service
	desc *prometheus.Desc
}

func (c *regionStateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *regionStateCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	if ok, _ := c.s.leaderAt(now); !ok {
		return
	}
	for _, r := range c.s.allocator().RegionViews(now) {
		for _, st := range regionStates {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, boolGauge(r.State == st), r.Name, string(st))
		}
	}
}
