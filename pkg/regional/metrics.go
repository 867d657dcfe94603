package regional

import (
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the regional service's Prometheus series. Labels never carry
// tenant ids (cardinality); class and tier are bounded by config.
type metrics struct {
	requests      *prometheus.CounterVec   // method, code
	rpcSeconds    *prometheus.HistogramVec // method
	scriptSeconds *prometheus.HistogramVec // script
	redisErrors   *prometheus.CounterVec   // script
	decisions     *prometheus.CounterVec   // class, tier, result
	granted       *prometheus.CounterVec   // class, tier
	reclaimed     prometheus.Counter
	released      prometheus.Counter
	returned      prometheus.Counter
	restarts      prometheus.CounterFunc
	rollbacks     prometheus.CounterFunc
	activeLeases  prometheus.GaugeFunc
	activeKeys    prometheus.GaugeFunc
	leader        prometheus.Gauge       // this replica leads its region
	globalSyncs   *prometheus.CounterVec // result: ok, error
	reports       *prometheus.CounterVec // kind: epoch, ack, catch_up, nudged
	rises         prometheus.Counter
	falls         prometheus.Counter
	reportKeys    prometheus.Gauge // keys in the last epoch report
	candidates    prometheus.Gauge // keys marked in the candidate sets, as the last report read them
	grantsApplied prometheus.Counter
	// released and deposited count the burst transfer's tokens: clipped
	// by a lowered cap, and added by a grant's deposit.
	burstReleased, burstDeposited prometheus.Counter
	staticLeft                    prometheus.GaugeFunc // remaining static lease, seconds
	onFloor                       prometheus.GaugeFunc // 1 while the replica hands its scripts the floor
	evicting                      prometheus.Gauge     // 1 while a Redis node may evict keys (eviction.go)
	evictedKeys                   prometheus.Counter   // keys Redis evicted while the daemon watched
	// startedUnconfirmed counts starts that could not read the config
	// last confirmed to the region (Server.ResumeChain).
	startedUnconfirmed prometheus.Counter
	// resumedLate counts reads of the region's history that succeeded
	// after a failed one at start (Server.resumeLate); unconfirmed is 1
	// while the process runs unconfirmed (Server.unconfirmedRev).
	resumedLate prometheus.Counter
	unconfirmed prometheus.GaugeFunc
}

func newMetrics(reg prometheus.Registerer, s *Server) *metrics {
	buckets := []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_regional_requests_total", Help: "LeaseService RPCs by method and gRPC code.",
		}, []string{"method", "code"}),
		rpcSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sluice_regional_rpc_duration_seconds", Help: "LeaseService RPC latency by method.", Buckets: buckets,
		}, []string{"method"}),
		scriptSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sluice_regional_lua_duration_seconds", Help: "Lua script round trip latency by script; also the replica's own Redis calls: ping (readiness check), sentinel (restart guard), time and state (region leader's reads).", Buckets: buckets,
		}, []string{"script"}),
		redisErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_regional_redis_errors_total", Help: "Failed Redis calls by script: acquire, sync, release and check for callers still waiting; ping, sentinel, time and state for the replica's own calls.",
		}, []string{"script"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_regional_decisions_total",
			Help: "Strict checks and lease requests by class, tier and result (allowed, denied, shadow_denied, granted, empty).",
		}, []string{"class", "tier", "result"}),
		granted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_regional_granted_tokens_total", Help: "Tokens handed out in leases by class and tier.",
		}, []string{"class", "tier"}),
		reclaimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_regional_reclaimed_tokens_total", Help: "Unspent tokens of expired leases returned to buckets.",
		}),
		released: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_regional_released_tokens_total", Help: "Tokens returned by instances on Release.",
		}),
		returned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_regional_returned_tokens_total",
			Help: "Tokens instances gave back in their Acquire and Sync reports (a pool above its batch cap, an expired lease's unspent tokens), put back in buckets.",
		}),
	}
	m.leader = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_regional_leader", Help: "1 while this replica is its region's leader (reports to the global tier).",
	})
	m.globalSyncs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_regional_global_syncs_total", Help: "Region leader syncs with the global tier by result (ok, error).",
	}, []string{"result"})
	m.reports = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_regional_global_reports_total",
		Help: "Reports the region leader sent the global tier by kind: epoch (one per epoch), ack (at once, for a lowered grant), catch_up (for a pending raise), nudged (the global leader asked for it, or the region's own demand rose, between epochs).",
	}, []string{"kind"})
	m.rises = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_regional_demand_rises_total",
		Help: "Times the region leader found a watched key's demand risen between epochs and reported at once (docs/architecture.md, \"Nudges\").",
	})
	m.falls = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_regional_demand_falls_total",
		Help: "Times the region leader found the demand of a key it holds a grant for fallen between epochs and reported at once, so that the capacity moves to the regions waiting for it (docs/architecture.md, \"Nudges\").",
	})
	m.reportKeys = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_regional_report_keys",
		Help: "Keys in the region leader's last epoch report to the global tier: the keys that need it (demand at half the static share, a grant, an acknowledgement owed) and those still within their hysteresis.",
	})
	m.candidates = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_regional_candidates",
		Help: "Keys the scripts marked in the region's candidate sets within the horizon, as the region leader's last report read them.",
	})
	m.grantsApplied = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_regional_grants_applied_total", Help: "Grants from the global tier installed in Redis by the region leader.",
	})
	m.burstReleased = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_regional_burst_released_tokens_total", Help: "Tokens the region's buckets gave up to a lowered grant cap, for the global tier to hand on (docs/architecture.md, \"Burst transfer\").",
	})
	m.burstDeposited = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_regional_burst_deposited_tokens_total", Help: "Tokens deposits from the global tier named in grants the region leader installed while they were in force (added up to the cap; docs/architecture.md, \"Burst transfer\").",
	})
	m.restarts = prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "sluice_regional_redis_data_losses_total", Help: "Times Redis was found to have lost its data: a born sentinel missing, or a data set gone back in time (restored from an older snapshot, a replica promoted while it lagged; docs/architecture.md, \"Redis rolls back\").",
	}, func() float64 { return float64(s.guard.Restarts()) })
	m.rollbacks = prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "sluice_regional_redis_rollbacks_total", Help: "Of sluice_regional_redis_data_losses_total, the times a data set was found gone back in time (its write generation below one a replica saw: a snapshot restore, a replica promoted while it lagged) and re-birthed; the rest found a born sentinel missing or renewed. A re-birth made by a call whose reply never reached this process (its caller gave up) shows only as a data loss (docs/architecture.md, \"Redis rolls back\").",
	}, func() float64 { return float64(s.guard.Rollbacks()) })
	m.activeLeases = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_regional_active_leases",
		Help: "Live leases on the keys this replica served within one lease TTL, as the last script reply on each key counted them, less the releases since.",
	}, func() float64 {
		return float64(s.active.leases(time.Now(), time.Duration(s.opts.Config.Current().LeaseTTL)))
	})
	m.activeKeys = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_regional_active_keys",
		Help: "Keys this replica keeps in memory: served since its last housekeeping tick, or holding live leases.",
	}, func() float64 { return float64(s.active.size()) })
	m.staticLeft = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_regional_static_lease_seconds",
		Help: "What remains of the region's static lease on this replica's conservative estimate of Redis time (0: lapsed or none; +Inf when the server runs unleased). With a sharded global tier, the least over the shards' leases.",
	}, func() float64 {
		if s.opts.Unleased {
			return math.Inf(1)
		}
		_, left := s.onStatic(time.Now())
		return left.Seconds()
	})
	m.onFloor = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_regional_on_floor",
		Help: "1 while this replica hands its scripts each key's floor (partition_share of the static share) because the static lease is not known valid; 0 on static shares. With a sharded global tier, 1 while any shard's lease is not known valid (the keys of the others stay on their static shares).",
	}, func() float64 {
		if on, _ := s.onStatic(time.Now()); on {
			return 0
		}
		return 1
	})
	m.evicting = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_regional_redis_evicting",
		Help: "1 while a node of the region's Redis has maxmemory set with a maxmemory-policy other than noeviction, as the daemon read it at its last epoch (INFO memory): evicted token buckets come back full and the region admits more than its limit.",
	})
	m.evictedKeys = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_regional_redis_evicted_keys_total",
		Help: "Keys the region's Redis nodes evicted while the daemon watched (growth of INFO stats evicted_keys between epochs); any of them may be a token bucket that came back full.",
	})
	m.startedUnconfirmed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_regional_chain_started_unconfirmed_total",
		Help: "Starts on a config other than the one last confirmed to the region whose confirmed config could not be read (Redis not answering, the revision compacted in etcd or etcd not answering): the config started on counted as confirmed, so until the region confirms it, or a read retried while Redis or etcd does not answer succeeds (sluice_regional_chain_resumed_late_total), its static shares may run above the old ones while another region still runs them (docs/architecture.md, invariant 2; sluice_regional_chain_unconfirmed).",
	})
	m.resumedLate = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_regional_chain_resumed_late_total",
		Help: "Reads of the config last confirmed to the region that succeeded after Redis or etcd did not answer at start: the process's static shares are bounded by the region's history from then on, as if it had read it at start.",
	})
	m.unconfirmed = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_regional_chain_unconfirmed",
		Help: "1 while this process runs on a config it counted as confirmed because it could not read the one last confirmed to the region at start (sluice_regional_chain_started_unconfirmed_total): until a later read succeeds (retried while Redis or etcd does not answer) or the region confirms the config it runs; 0 otherwise.",
	}, func() float64 {
		if s.unconfirmedRev.Load() != 0 {
			return 1
		}
		return 0
	})
	if reg != nil {
		reg.MustRegister(m.evicting, m.evictedKeys, m.startedUnconfirmed, m.resumedLate, m.unconfirmed)
		reg.MustRegister(m.requests, m.rpcSeconds, m.scriptSeconds, m.redisErrors, m.decisions,
			m.granted, m.reclaimed, m.released, m.returned, m.restarts, m.rollbacks, m.activeLeases, m.activeKeys,
			m.leader, m.globalSyncs, m.reports, m.rises, m.falls, m.reportKeys, m.candidates, m.grantsApplied, m.burstReleased, m.burstDeposited, m.staticLeft, m.onFloor)
	}
	return m
}
