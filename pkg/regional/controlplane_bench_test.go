package regional_test

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/cputime"
	"github.com/sluicehq/sluice/internal/envcount"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/allocator"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

// BenchmarkControlPlaneCost measures what one region's leader costs per
// epoch when 1% of its active keys are contended, against the same region
// holding only its contended keys, in one run (the machine is shared and
// noisy: read the ratios):
//
//	go test -run '^$' -bench ControlPlaneCost -benchtime 10x ./pkg/regional/
//	SLUICE_BENCH_ACTIVE_KEYS=1000000 go test -run '^$' -bench ControlPlaneCost -benchtime 10x -timeout 40m ./pkg/regional/
//
// Each region is a real redis-server, a regional server, its leader and
// its own real allocator daemon (embedded etcd); every active key holds a
// live lease (filled through the real acquire script, pipelined), and each
// contended key's lease asks for twice the region's static share (epoch
// 3s: a leader round of 10,000 contended keys must fit in one on this
// shared machine; region_lease 1h: the static lease outlasts the fill).
// Both allocators leave learning mode before anything is measured, and the
// contended keys' leases report again then, marking them. An
// epoch is one SyncOnce (the leader's whole round: candidate read, state
// reads, report, the allocator's answer, installs). Reported per epoch:
// the leader's wall time without the allocator's (leader_ms), Redis
// commands (INFO commandstats delta, commands run inside scripts
// included) and report bytes (proto.Size), for the big region and the
// small one and as big/small ratios, and the Redis time of the leader's
// script calls (redis_ms: INFO commandstats usec); then (sub-benchmark
// instances) instance Sync throughput on the big region's Redis with the
// leader syncing every epoch against without (thr_ratio, alternating
// phases), with what each kind of phase used: the big Redis's CPU and µs
// per script call, and this process's CPU.
func BenchmarkControlPlaneCost(b *testing.B) {
	total := envcount.Get(b, "SLUICE_BENCH_ACTIVE_KEYS", 20_000, 100)
	hot := total / 100
	ctx := context.Background()
	etcd := etcdtest.Start(b)
	cli := etcd.Client(b)
	big := newCostRig(b, cli, "big", total, hot)
	small := newCostRig(b, cli, "small", hot, hot)
	// Each region settles before measuring: its allocator leaves learning
	// mode (one grant validity after it was elected; until then it only
	// re-issues what regions hold, so a region filled quickly would be
	// measured without grants), then two epochs (the first report's
	// baselines, grants installed). The regions are built once: the epochs
	// are a sub-benchmark, so the framework's probe run does not fill them
	// again.
	for big.learning() || small.learning() {
		// A round that outlasts its epoch on a busy machine fails as it
		// would in production (the region runs on its current grants);
		// only the measured epochs must all succeed.
		big.settle(b)
		small.settle(b)
	}
	// The contended keys see no traffic of their own here: a fresh report
	// on their leases marks them again (failed settling rounds may have
	// let their first marks age out of the candidate horizon).
	big.remark(b)
	small.remark(b)
	for range 2 {
		big.epoch(b)
		small.epoch(b)
	}
	b.Run("epoch", func(b *testing.B) { costEpochs(b, big, small) })

	// Instance throughput on the big region with and without the leader
	// at work, alternating phases of one epoch each (on, off, off, on,
	// ...: a drift of the machine's load weighs on both alike). Measured
	// once; the framework's later runs of the sub-benchmark report it
	// again.
	var with, without float64
	var useWith, useWithout phaseUse
	b.Run("instances", func(b *testing.B) {
		if without == 0 {
			for phase := range 8 {
				leading := phase%4 == 0 || phase%4 == 3
				before := readUse(b, big.rdb)
				ops := big.load(ctx, b, time.Duration(big.cfg.Epoch), leading)
				use := readUse(b, big.rdb).since(before)
				if leading {
					with += ops
					useWith = useWith.plus(use)
				} else {
					without += ops
					useWithout = useWithout.plus(use)
				}
			}
		}
		b.ReportMetric(without/4, "syncs/s_alone")
		b.ReportMetric(with/4, "syncs/s_leader")
		b.ReportMetric(with/without, "thr_ratio")
		// Where the time went in each kind of phase: the big Redis's
		// CPU (cores), its µs per script call (INFO commandstats:
		// EVALSHA, EVAL and FCALL together) and this process's CPU
		// (cores: the regional server, the leader and both allocators).
		b.ReportMetric(useWithout.redisCores(), "redis_cores_alone")
		b.ReportMetric(useWith.redisCores(), "redis_cores_leader")
		b.ReportMetric(useWithout.perScript(), "script_us_alone")
		b.ReportMetric(useWith.perScript(), "script_us_leader")
		b.ReportMetric(useWithout.goCores(), "go_cores_alone")
		b.ReportMetric(useWith.goCores(), "go_cores_leader")
	})
}

// phaseUse is what a load phase used: the Redis's CPU seconds, its script
// calls and their µs (INFO), this process's CPU seconds and the wall time.
type phaseUse struct {
	redisCPU, scriptCalls, scriptUS, goCPU float64
	wall                                   time.Duration
	at                                     time.Time
}

func (u phaseUse) since(before phaseUse) phaseUse {
	return phaseUse{
		redisCPU: u.redisCPU - before.redisCPU, scriptCalls: u.scriptCalls - before.scriptCalls,
		scriptUS: u.scriptUS - before.scriptUS, goCPU: u.goCPU - before.goCPU, wall: u.at.Sub(before.at),
	}
}

func (u phaseUse) plus(v phaseUse) phaseUse {
	return phaseUse{
		redisCPU: u.redisCPU + v.redisCPU, scriptCalls: u.scriptCalls + v.scriptCalls,
		scriptUS: u.scriptUS + v.scriptUS, goCPU: u.goCPU + v.goCPU, wall: u.wall + v.wall,
	}
}

func (u phaseUse) redisCores() float64 { return u.redisCPU / u.wall.Seconds() }
func (u phaseUse) goCores() float64    { return u.goCPU / u.wall.Seconds() }
func (u phaseUse) perScript() float64  { return u.scriptUS / max(1, u.scriptCalls) }

// readUse reads the counters phaseUse is made of.
func readUse(b *testing.B, rdb *redis.Client) phaseUse {
	b.Helper()
	info, err := rdb.Info(context.Background(), "cpu", "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	u := phaseUse{at: time.Now()}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		name, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch name {
		case "used_cpu_user", "used_cpu_sys":
			f, _ := strconv.ParseFloat(v, 64)
			u.redisCPU += f
		case "cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall":
			for _, kv := range strings.Split(v, ",") {
				k, x, _ := strings.Cut(kv, "=")
				f, _ := strconv.ParseFloat(x, 64)
				switch k {
				case "calls":
					u.scriptCalls += f
				case "usec":
					u.scriptUS += f
				}
			}
		}
	}
	d, err := cputime.Process()
	if err != nil {
		b.Fatal(err)
	}
	u.goCPU = d.Seconds()
	return u
}

// costEpochs runs b.N epochs of each region, alternating which goes first,
// and reports the per-epoch costs and their ratios.
func costEpochs(b *testing.B, big, small *costRig) {
	big.reset()
	small.reset()
	b.ResetTimer()
	for i := range b.N {
		if i%2 == 0 {
			big.epoch(b)
			small.epoch(b)
		} else {
			small.epoch(b)
			big.epoch(b)
		}
	}
	b.StopTimer()
	n := float64(b.N)
	bt, st := big.leaderNS.Load(), small.leaderNS.Load()
	bc, sc := big.cmds.Load(), small.cmds.Load()
	bb, sb := big.bytes.Load(), small.bytes.Load()
	b.ReportMetric(float64(bt)/n/1e6, "big_leader_ms/epoch")
	b.ReportMetric(float64(st)/n/1e6, "small_leader_ms/epoch")
	b.ReportMetric(float64(bt)/float64(st), "time_ratio")
	// The Redis time of the leader's scripts (state reads, installs).
	b.ReportMetric(float64(big.scriptUS.Load())/n/1e3, "big_redis_ms/epoch")
	b.ReportMetric(float64(small.scriptUS.Load())/n/1e3, "small_redis_ms/epoch")
	b.ReportMetric(float64(bc)/n, "big_cmds/epoch")
	b.ReportMetric(float64(sc)/n, "small_cmds/epoch")
	b.ReportMetric(float64(bc)/float64(sc), "cmds_ratio")
	b.ReportMetric(float64(bb)/n, "big_bytes/epoch")
	b.ReportMetric(float64(sb)/n, "small_bytes/epoch")
	b.ReportMetric(float64(bb)/float64(sb), "bytes_ratio")
	b.ReportMetric(float64(big.keys.Load())/float64(big.reports.Load()), "big_keys/report")
	b.ReportMetric(float64(small.keys.Load())/float64(small.reports.Load()), "small_keys/report")
	b.ReportMetric(float64(big.reports.Load())/n, "big_reports/epoch")
	b.ReportMetric(float64(small.reports.Load())/n, "small_reports/epoch")
	b.ReportMetric(float64(big.failed.Load()), "big_failed_rounds")
	b.ReportMetric(float64(small.failed.Load()), "small_failed_rounds")
}

// costRig is one region of BenchmarkControlPlaneCost.
type costRig struct {
	alloc  *allocator.Daemon
	rdb    *redis.Client
	srv    *regional.Server
	leader *regional.Leader
	cfg    *config.Config
	hot    []quota.Key // the contended keys
	idle   []quota.Key
	// reportsSent is how many demand reports remark made on the
	// contended keys' leases.
	reportsSent int64

	leaderNS, cmds, bytes, keys atomic.Int64
	failed                      atomic.Int64 // rounds that failed (outlasted their epoch)
	scriptUS                    atomic.Int64 // Redis µs in script calls (INFO commandstats)
	reports                     atomic.Int64
	globalNS                    atomic.Int64
}

// countingTier is the real allocator service, with what the leader sends
// it and how long it takes counted.
type countingTier struct {
	r *costRig
	s *allocator.Service
}

func (c countingTier) Sync(ctx context.Context, rep *sluicev1.RegionReport) (*sluicev1.RegionGrants, error) {
	start := time.Now()
	g, err := c.s.Sync(ctx, rep)
	c.r.globalNS.Add(int64(time.Since(start)))
	c.r.bytes.Add(int64(proto.Size(rep)))
	c.r.keys.Add(int64(len(rep.GetKeys())))
	c.r.reports.Add(1)
	return g, err
}

const costConfig = `
epoch: 3s
region_lease: 1h
lease_ttl: 10m
regions: {local: {weight: 1}}
classes: {read: {mode: lease}}
tiers: {free: {read: {rate: 100/s, burst: 100}}}
default_tier: free
`

func newCostRig(b testing.TB, cli *clientv3.Client, name string, total, hot int) *costRig {
	b.Helper()
	ctx := context.Background()
	cfg, err := config.Parse([]byte(costConfig))
	if err != nil {
		b.Fatal(err)
	}
	d, err := allocator.StartDaemon(ctx, allocator.DaemonOptions{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Etcd: cli, Prefix: "/" + name, SessionTTL: time.Second,
		Config: regional.StaticConfig{C: cfg},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(d.Stop)
	awaitAllocatorLeader(b, d, 20*time.Second)
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Start(b).Addr(), PoolSize: 64})
	b.Cleanup(func() { rdb.Close() })
	srv, err := regional.New(regional.Options{Region: "local", Redis: rdb, Config: regional.StaticConfig{C: cfg}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Close)
	r := &costRig{alloc: d, rdb: rdb, srv: srv, cfg: cfg}
	r.leader, err = regional.NewLeader(srv, regional.LeaderOptions{
		Etcd: cli, ElectionPrefix: "/" + name + "/election/", Global: countingTier{r: r, s: d.Service}, Identity: name,
	})
	if err != nil {
		b.Fatal(err)
	}
	// The first answer confers the static lease: the keys are filled on
	// the static share.
	if err := r.leader.SyncOnce(ctx, nil); err != nil {
		b.Fatal(err)
	}
	keys := make([]quota.Key, total)
	for i := range keys {
		keys[i] = quota.Key{Tenant: fmt.Sprintf("t%08d", i), Class: "read"}
	}
	r.hot, r.idle = keys[:hot], keys[hot:]
	// Every key gets one live lease; the contended keys' leases then
	// report 200/s over ten seconds of their instance's clock.
	r.fill(b, keys, func(i int, k quota.Key) luascripts.Report {
		return luascripts.Report{Instance: "fill", Incarnation: 1, Lease: 1, Seq: 1, Want: 1, Min: 1, BuiltUS: 1_000_000}
	})
	r.remark(b)
	return r
}

// remark reports ten more seconds of 200/s on every contended key's lease
// (the key's demand reading stays 200/s), which marks it a candidate.
func (r *costRig) remark(b testing.TB) {
	r.reportsSent++
	n := r.reportsSent
	r.fill(b, r.hot, func(i int, k quota.Key) luascripts.Report {
		return luascripts.Report{Instance: "fill", Incarnation: 1, Lease: 1, Seq: uint64(1 + n), Used: 2000 * n, Want: 1, Min: 1,
			BuiltUS: 1_000_000 + 10_000_000*n}
	})
}

// fill runs acquire.lua for keys in pipelines of 1,000.
func (r *costRig) fill(b testing.TB, keys []quota.Key, report func(int, quota.Key) luascripts.Report) {
	b.Helper()
	ctx := context.Background()
	sc := r.srv.Scripts()
	for start := 0; start < len(keys); start += 1000 {
		chunk := keys[start:min(start+1000, len(keys))]
		qs := luascripts.RunQueued(ctx, r.rdb, func(p redis.Pipeliner) []*luascripts.Queued {
			out := make([]*luascripts.Queued, len(chunk))
			for i, k := range chunk {
				ks, c, _, err := r.srv.CommonFor(r.cfg, k)
				if err != nil {
					b.Fatal(err)
				}
				out[i] = sc.QueueAcquire(ctx, p, ks, c, report(start+i, k))
			}
			return out
		})
		for _, q := range qs {
			if _, err := luascripts.ParseLease(q); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// learning says whether the region's allocator is still in learning mode.
func (r *costRig) learning() bool { return r.alloc.Service.View(time.Now()).Learning }

func (r *costRig) reset() {
	r.leaderNS.Store(0)
	r.globalNS.Store(0)
	r.cmds.Store(0)
	r.bytes.Store(0)
	r.keys.Store(0)
	r.reports.Store(0)
	r.failed.Store(0)
	r.scriptUS.Store(0)
}

// settle is one leader round, not counted; a failure is logged.
func (r *costRig) settle(b *testing.B) {
	if err := r.leader.SyncOnce(context.Background(), nil); err != nil {
		b.Logf("settling round: %v", err)
	}
}

// epoch is one leader round, counted.
func (r *costRig) epoch(b *testing.B) {
	ctx := context.Background()
	before := commandCalls(b, r.rdb)
	use := readUse(b, r.rdb)
	g0 := r.globalNS.Load()
	start := time.Now()
	if err := r.leader.SyncOnce(ctx, nil); err != nil {
		// A round that outlasts its epoch fails (the region runs on its
		// current grants): counted, not fatal, on a busy machine.
		r.failed.Add(1)
		b.Logf("round failed: %v", err)
	}
	el := time.Since(start)
	r.leaderNS.Add(int64(el) - (r.globalNS.Load() - g0))
	r.cmds.Add(commandCalls(b, r.rdb) - before - 1) // less the INFO itself
	r.scriptUS.Add(int64(readUse(b, r.rdb).since(use).scriptUS))
}

// commandCalls is the sum of every command's calls in INFO commandstats.
func commandCalls(b *testing.B, rdb *redis.Client) int64 {
	b.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := sc.Text()
		i := strings.Index(line, "calls=")
		if !strings.HasPrefix(line, "cmdstat_") || i < 0 {
			continue
		}
		v := line[i+len("calls="):]
		v, _, _ = strings.Cut(v, ",")
		c, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			b.Fatalf("commandstats line %q: %v", line, err)
		}
		n += c
	}
	return n
}

// load runs instance Syncs (one key each, 32 callers, every caller its own
// instance and keys among the idle ones) through the regional server for
// d, with the leader syncing every epoch when leading, and returns the
// Syncs per second.
func (r *costRig) load(ctx context.Context, b *testing.B, d time.Duration, leading bool) float64 {
	const callers = 32
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var done sync.WaitGroup
	if leading {
		done.Add(1)
		go func() {
			defer done.Done()
			t := time.NewTicker(time.Duration(r.cfg.Epoch))
			defer t.Stop()
			for {
				if err := r.leader.SyncOnce(ctx, nil); err != nil && ctx.Err() == nil {
					b.Logf("round failed: %v", err)
				}
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		}()
	}
	var ops atomic.Int64
	for c := range callers {
		done.Add(1)
		go func() {
			defer done.Done()
			id := fmt.Sprintf("w%d-%d", c, time.Now().UnixNano())
			seq := map[int]uint64{}
			for i := 0; ctx.Err() == nil; i++ {
				j := (c + i*callers) % len(r.idle)
				k := r.idle[j]
				seq[j]++
				_, err := r.srv.Sync(ctx, &sluicev1.SyncRequest{InstanceId: id, Incarnation: 1, Reports: []*sluicev1.KeyReport{{
					Key: &sluicev1.QuotaKey{Tenant: k.Tenant, Class: k.Class}, Seq: seq[j], Lease: 1, Want: 1,
				}}})
				if err == nil {
					ops.Add(1)
				}
			}
		}()
	}
	done.Wait()
	return float64(ops.Load()) / d.Seconds()
}
