package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/flagenv"
	"github.com/sluicehq/sluice/pkg/config"
)

// maxTopKeys is the most keys AllocatorService.Status lists.
const maxTopKeys = 1000

// statusReport is everything status shows; it is also the JSON output.
type statusReport struct {
	EtcdPrefix string `json:"etcd_prefix,omitempty"`
	// EtcdError says why etcd could not be read; empty when it was.
	EtcdError string `json:"etcd_error,omitempty"`
	// ConfigError says why the daemons refuse the config stored in etcd
	// (they keep the last good one; status exits exitInvalid); empty when
	// it is valid or absent. The regions listed are then those of the
	// newest valid config in etcd's history, the one the daemons run.
	ConfigError string `json:"config_error,omitempty"`
	// ConfigMissing says that etcd holds no config while the global tier
	// runs one it loaded from etcd (its key was deleted past sluicectl, or
	// etcd lost its data): the daemons keep it, and one that starts runs
	// it only while etcd's history holds it (status exits exitNotFound);
	// empty otherwise.
	ConfigMissing string `json:"config_missing,omitempty"`
	// configKey is the config key when etcd was read and holds no config.
	configKey string
	// GlobalLeader is nil when no global allocator holds the election.
	GlobalLeader  *leaderView        `json:"global_leader"`
	RegionLeaders []regionLeaderView `json:"region_leaders"`
	// GlobalAddr is the replica asked for the allocation.
	GlobalAddr string `json:"global_addr,omitempty"`
	// AskedStandby is the replica asked first when it was a standby naming
	// the leader at GlobalAddr, which was asked next.
	AskedStandby string `json:"asked_standby,omitempty"`
	// GlobalError says why the global tier could not be asked.
	GlobalError string      `json:"global_error,omitempty"`
	Global      *globalView `json:"global,omitempty"`
	// Shards are the global tier's shards past shard 0 (global_shards >
	// 1), each asked at the leader etcd names; Global then counts
	// contended keys, learning and degraded regions across all shards and
	// lists the most contended keys of all.
	Shards []shardView `json:"shards,omitempty"`
	// refused says a global allocator answered but refused this client's
	// credentials (exitRefused rather than exitUnreachable).
	refused bool
}

// shardView is one global-tier shard past shard 0.
type shardView struct {
	Shard int `json:"shard"`
	// Unconfigured: the config in etcd has fewer shards (its replicas were
	// started ahead of a raise of global_shards, or still run after a
	// lowering): it owns no keys, and its figures are shown but not folded
	// into the global tier's.
	Unconfigured bool        `json:"unconfigured,omitempty"`
	Leader       *leaderView `json:"leader"`
	Error        string      `json:"error,omitempty"`
	Global       *globalView `json:"global,omitempty"`
}

// leaderView is the holder of one election: the candidate whose key was
// created first.
type leaderView struct {
	Addr       string `json:"addr"`
	Key        string `json:"key"`
	Candidates int    `json:"candidates"`
}

type regionLeaderView struct {
	Region string      `json:"region"`
	Leader *leaderView `json:"leader"`
	// Configured is false for a region that holds an election but is not
	// in the config in etcd.
	Configured bool `json:"configured"`
	// Drained: the config in etcd drains the region.
	Drained bool `json:"drained,omitempty"`
}

type globalView struct {
	AnsweredByLeader bool   `json:"answered_by_leader"`
	LeaderAddr       string `json:"leader_addr"`
	Learning         bool   `json:"learning"`
	Epoch            uint64 `json:"epoch"`
	ConfigRevision   int64  `json:"config_revision"`
	ContendedKeys    int64  `json:"contended_keys"`
	// ClassFloors is each class's partition_share: what a lapsed or
	// drained region is reserved of its static share for that class's
	// keys. Empty from an allocator that does not send it.
	ClassFloors map[string]float64 `json:"class_floors,omitempty"`
	Regions     []regionView       `json:"regions"`
	// Degraded lists the silent regions: the allocator counts each at
	// max(its last grant, its static share).
	Degraded []string  `json:"degraded"`
	Keys     []keyView `json:"keys"`
}

type regionView struct {
	Region string `json:"region"`
	// LastReportAgeMs is -1 when the region was never heard from.
	LastReportAgeMs int64  `json:"last_report_age_ms"`
	Silent          bool   `json:"silent"`
	LastSeq         uint64 `json:"last_seq"`
	// State is the allocator's view of the region's static lease: live,
	// silent, lapsed, returning or drained; empty from an allocator that
	// does not report it.
	State string `json:"state,omitempty"`
	// SilentSince is when the region was last heard from (the instant
	// the allocator stored, on its clock; from an allocator that does not
	// send it, this machine's clock minus the report age), set while it
	// is silent or lapsed.
	SilentSince *time.Time `json:"silent_since,omitempty"`
	// StaticLeaseMs is what the allocator believes remains of the region's
	// static lease; 0 when it runs on its floor.
	StaticLeaseMs int64 `json:"static_lease_ms"`
	// ReservedFraction is the fraction of its static share the global tier
	// reserves for the region without a grant: 1 while it counts the whole
	// share, else its floor fraction, which is per class (the class's
	// partition_share, Global.ClassFloors): the largest of them.
	ReservedFraction float64 `json:"reserved_fraction"`
	// ReservedMinFraction is the smallest per-class figure: equal to
	// ReservedFraction unless classes with different partition_shares
	// make the reserve a range.
	ReservedMinFraction float64 `json:"reserved_min_fraction"`
	// DrainPending: the config drains the region but the global tier
	// still reserves its share under the revision it runs (it has not
	// reported the drain: not yet, or it is silent), until it does or its
	// static lease lapses.
	DrainPending bool `json:"drain_pending,omitempty"`
	// Lapsed: its static lease lapsed; the global tier counts it at its
	// floor (also for a drained region).
	Lapsed bool `json:"lapsed,omitempty"`
	// OtherShards are the shards past shard 0 (global_shards > 1) that see
	// the region otherwise than this view does: a region cut off from one
	// shard alone is silent there, and its keys of that shard run on its
	// static shares, then its floor. Empty when every shard agrees.
	OtherShards []shardRegionView `json:"other_shards,omitempty"`
}

// shardRegionView is one shard's view of a region that differs from shard
// 0's.
type shardRegionView struct {
	Shard           int        `json:"shard"`
	State           string     `json:"state"`
	Silent          bool       `json:"silent"`
	LastReportAgeMs int64      `json:"last_report_age_ms"`
	SilentSince     *time.Time `json:"silent_since,omitempty"`
}

type keyView struct {
	Tenant  string          `json:"tenant"`
	Class   string          `json:"class"`
	Rate    float64         `json:"rate"`
	Burst   float64         `json:"burst"`
	Demand  float64         `json:"demand"`
	Regions []keyRegionView `json:"regions"`
}

type keyRegionView struct {
	Region       string  `json:"region"`
	Demand       float64 `json:"demand"`
	Target       float64 `json:"target"`
	GrantedRate  float64 `json:"granted_rate"`
	GrantedBurst float64 `json:"granted_burst"`
	ValidMs      int64   `json:"valid_ms"`
	StaticRate   float64 `json:"static_rate"`
}

func (a *app) statusCmd(fs *flag.FlagSet) func(context.Context, []string) error {
	top := fs.Int("top", 10, fmt.Sprintf("how many of the most contended keys to list (1..%d)", maxTopKeys))
	format := fs.String("o", "text", "output format: text or json")
	return func(ctx context.Context, args []string) error {
		if err := noPositional(args); err != nil {
			return err
		}
		if *top < 1 || *top > maxTopKeys {
			return exitf(exitUsage, "-top %d: want 1..%d", *top, maxTopKeys)
		}
		if *format != "text" && *format != "json" {
			return exitf(exitUsage, "-o %q: want text or json", *format)
		}
		addrs, err := a.globalAddrs()
		if err != nil {
			return err
		}
		if len(a.g.endpoints()) == 0 && len(addrs) == 0 {
			return exitf(exitUsage, "status needs etcd (-etcd-endpoints, %s) or a global allocator (-global-addr, %s)",
				flagenv.EnvName(envPrefix, "etcd-endpoints"), flagenv.EnvName(envPrefix, "global-addr"))
		}
		if err := a.positiveTimeout(); err != nil {
			return err
		}
		// Credentials problems are usage errors, not an unreachable tier.
		if _, err := a.grpcCredentials(a.g.globalTLSName); err != nil {
			return err
		}

		var rep statusReport
		if len(a.g.endpoints()) > 0 {
			if err := a.readEtcdStatus(ctx, &rep); err != nil {
				return err
			}
		}
		if len(addrs) == 0 && rep.GlobalLeader != nil {
			addrs = []string{rep.GlobalLeader.Addr}
		}
		switch {
		case len(addrs) == 0 && rep.EtcdError != "":
			// etcd was not read: nothing is known of a global leader.
			rep.GlobalError = fmt.Sprintf("no global allocator to ask: the global leader is unknown because etcd could not be read; give -global-addr (%s) of a replica",
				flagenv.EnvName(envPrefix, "global-addr"))
		case len(addrs) == 0 && len(rep.Shards) > 0:
			// Sharded: only shard 0 is unknown; the other shards are asked
			// below and shown all the same.
			rep.GlobalError = fmt.Sprintf("no allocator of shard 0 to ask: etcd shows no leader of global shard 0 (no replica holds its election); give -global-addr (%s) of a shard 0 replica, or start cmd/global -shard 0",
				flagenv.EnvName(envPrefix, "global-addr"))
		case len(addrs) == 0:
			rep.GlobalError = fmt.Sprintf("no global allocator to ask: etcd shows no global leader; give -global-addr (%s) of a replica, or start cmd/global",
				flagenv.EnvName(envPrefix, "global-addr"))
		default:
			if err := a.askFirst(ctx, addrs, int32(*top), &rep); err != nil {
				return err
			}
		}
		if err := a.askShards(ctx, int32(*top), &rep); err != nil {
			return err
		}
		if rep.configKey != "" && rep.Global != nil && rep.Global.ConfigRevision > 0 {
			rep.ConfigMissing = fmt.Sprintf("etcd holds no config at %s, but the global tier runs revision %d from etcd: the config key was deleted past sluicectl, or etcd lost its data (rebuilt empty). "+
				"The running daemons keep the config they run, and one that starts runs the key's last config while etcd's history holds it; "+
				"on an etcd with no record of the key (rebuilt, or its history compacted) it writes its -config bootstrap file, or runs the built-in sample\n"+
				"apply a good config with sluicectl apply -f FILE", rep.configKey, rep.Global.ConfigRevision)
		}

		if *format == "json" {
			out, err := json.MarshalIndent(rep, "", "  ")
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "%s\n", out)
		} else if err := writeStatusText(a.stdout, &rep); err != nil {
			return err
		}
		code := exitUnreachable
		if rep.refused && rep.EtcdError == "" {
			code = exitRefused
		}
		if rep.ConfigError != "" {
			// A stored config the daemons refuse is the finding to act on,
			// whatever else could not be asked.
			return exitf(exitInvalid, "%s", strings.Join(slices.DeleteFunc([]string{rep.ConfigError, rep.GlobalError}, func(s string) bool { return s == "" }), "\n"))
		}
		if rep.ConfigMissing != "" {
			return exitf(exitNotFound, "%s", strings.Join(slices.DeleteFunc([]string{rep.ConfigMissing, rep.GlobalError}, func(s string) bool { return s == "" }), "\n"))
		}
		switch {
		case rep.EtcdError != "" && rep.GlobalError != "":
			return exitf(code, "%s\n%s", rep.EtcdError, rep.GlobalError)
		case rep.EtcdError != "":
			return exitf(code, "%s", rep.EtcdError)
		case rep.GlobalError != "":
			return exitf(code, "%s", rep.GlobalError)
		}
		return nil
	}
}

// readEtcdStatus fills in the leaders, and the configured regions from the
// config in etcd. A failure to reach etcd is recorded in rep, not returned,
// so status can still ask the global tier.
func (a *app) readEtcdStatus(ctx context.Context, rep *statusReport) error {
	cli, store, err := a.etcd()
	if err != nil {
		if ee, ok := err.(*exitError); ok && ee.code == exitUnreachable {
			rep.EtcdError = ee.msg
			return nil
		}
		return err
	}
	defer cli.Close()
	rep.EtcdPrefix = store.Prefix()

	stepCtx, cancel := a.step(ctx)
	defer cancel()
	resp, err := cli.Get(stepCtx, store.ElectionPrefix(), clientv3.WithPrefix())
	if ctx.Err() != nil {
		return interrupted(ctx, "reading the leaders from etcd")
	}
	if err != nil {
		rep.EtcdError = a.etcdFailure(fmt.Errorf("read elections: %w", err)).Error()
		return nil
	}
	// A missing config only means regions without a leader are not
	// listed. A refused one is reported: the daemons keep the last good
	// config, whose regions are listed, and a daemon that starts runs it
	// too, or fails if etcd's history no longer holds it.
	cfg, rev, err := store.Get(stepCtx)
	if err == nil && cfg == nil {
		rep.configKey = store.Key()
	}
	if errors.Is(err, config.ErrInvalidConfig) && ctx.Err() == nil {
		rep.ConfigError = fmt.Sprintf("the config stored in etcd at revision %d is refused by the daemons, which keep their last good config: %v\n"+
			"apply a good config with sluicectl apply -f FILE", rev, err)
		if last, lastRev, herr := store.LastValid(stepCtx, rev); herr == nil {
			cfg = last
			rep.ConfigError += fmt.Sprintf(" (a daemon that starts meanwhile runs revision %d)", lastRev)
		} else {
			rep.ConfigError += fmt.Sprintf("; no daemon can start meanwhile: %v", herr)
		}
	}
	global, regions := electionLeaders(store.ElectionPrefix(), resp.Kvs)
	rep.GlobalLeader = global
	shards := shardLeaders(store.ElectionPrefix(), resp.Kvs)
	n, configured := 1, 0
	if cfg != nil {
		n = cfg.ShardMap().N()
		configured = n
	}
	for i := range shards {
		n = max(n, i+1)
	}
	for i := 1; i < n; i++ {
		rep.Shards = append(rep.Shards, shardView{Shard: i, Leader: shards[i], Unconfigured: cfg != nil && i >= configured})
	}
	names := map[string]bool{}
	for r := range regions {
		names[r] = false
	}
	if cfg != nil {
		for r := range cfg.Regions {
			names[r] = true
		}
	}
	for _, r := range sortedNames(names) {
		v := regionLeaderView{Region: r, Leader: regions[r], Configured: names[r]}
		if cfg != nil {
			v.Drained = cfg.Regions[r].Drained
		}
		rep.RegionLeaders = append(rep.RegionLeaders, v)
	}
	return nil
}

// electionLeaders finds the holder of the global election
// (<electionPrefix>global/<lease>) and of every region's election
// (<electionPrefix>region/<region>/<lease>): in an etcd election the
// candidate whose key was created first leads, and its value is its address.
func electionLeaders(electionPrefix string, kvs []*mvccpb.KeyValue) (*leaderView, map[string]*leaderView) {
	var global *leaderView
	var globalRev int64
	regions := map[string]*leaderView{}
	regionRev := map[string]int64{}
	consider := func(cur *leaderView, curRev int64, key, value string, rev int64) (*leaderView, int64) {
		if cur == nil {
			return &leaderView{Addr: value, Key: key, Candidates: 1}, rev
		}
		cur.Candidates++
		if rev < curRev {
			cur.Addr, cur.Key = value, key
			return cur, rev
		}
		return cur, curRev
	}
	for _, item := range kvs {
		key := string(item.Key)
		rest := strings.TrimPrefix(key, electionPrefix)
		switch {
		case strings.HasPrefix(rest, "global/"):
			global, globalRev = consider(global, globalRev, key, string(item.Value), item.CreateRevision)
		case strings.HasPrefix(rest, "region/"):
			region, _, ok := strings.Cut(strings.TrimPrefix(rest, "region/"), "/")
			if !ok || region == "" {
				continue
			}
			regions[region], regionRev[region] = consider(regions[region], regionRev[region], key, string(item.Value), item.CreateRevision)
		}
	}
	return global, regions
}

// shardLeaders finds the holder of each shard's election past shard 0
// (<electionPrefix>global-shard-I/<lease>), by shard.
func shardLeaders(electionPrefix string, kvs []*mvccpb.KeyValue) map[int]*leaderView {
	out := map[int]*leaderView{}
	revs := map[int]int64{}
	for _, item := range kvs {
		rest, ok := strings.CutPrefix(string(item.Key), electionPrefix+"global-shard-")
		if !ok {
			continue
		}
		num, _, ok := strings.Cut(rest, "/")
		i, err := strconv.Atoi(num)
		if !ok || err != nil || i < 1 {
			continue
		}
		cur := out[i]
		if cur == nil {
			out[i], revs[i] = &leaderView{Addr: string(item.Value), Key: string(item.Key), Candidates: 1}, item.CreateRevision
			continue
		}
		cur.Candidates++
		if item.CreateRevision < revs[i] {
			cur.Addr, cur.Key, revs[i] = string(item.Value), string(item.Key), item.CreateRevision
		}
	}
	return out
}

// askShards asks every shard past shard 0 whose leader etcd names, and
// folds the answers of the shards the config counts into rep.Global:
// contended keys summed, learning if any shard learns, degraded regions of
// any shard, and the top keys of all. A shard past the config's count owns
// no keys (its replicas outlived a lowered global_shards): its answer is
// shown on its own line only, since its learning and silent regions say
// nothing of the global tier. A shard that cannot be asked is an error of
// the report.
func (a *app) askShards(ctx context.Context, top int32, rep *statusReport) error {
	for i := range rep.Shards {
		sh := &rep.Shards[i]
		if sh.Leader == nil {
			sh.Error = fmt.Sprintf("shard %d: no leader (no replica holds its election)", sh.Shard)
			continue
		}
		var one statusReport
		if err := a.askGlobal(ctx, sh.Leader.Addr, top, &one); err != nil {
			return err
		}
		sh.Error, sh.Global = one.GlobalError, one.Global
		rep.refused = rep.refused || one.refused
		if sh.Global == nil || rep.Global == nil || sh.Unconfigured {
			continue
		}
		g := rep.Global
		g.ContendedKeys += sh.Global.ContendedKeys
		g.Learning = g.Learning || sh.Global.Learning
		for _, d := range sh.Global.Degraded {
			if !slices.Contains(g.Degraded, d) {
				g.Degraded = append(g.Degraded, d)
			}
		}
		sort.Strings(g.Degraded)
		g.Keys = append(g.Keys, sh.Global.Keys...)
		noteShardRegions(g, sh)
	}
	if rep.Global != nil && len(rep.Shards) > 0 {
		keys := rep.Global.Keys
		sort.SliceStable(keys, func(i, j int) bool { return pressure(keys[i]) > pressure(keys[j]) })
		rep.Global.Keys = keys[:min(len(keys), int(top))]
	}
	var errs []string
	for _, sh := range rep.Shards {
		if sh.Error != "" && !sh.Unconfigured {
			errs = append(errs, sh.Error)
		}
	}
	if len(errs) > 0 && rep.GlobalError == "" {
		rep.GlobalError = strings.Join(errs, "\n")
	}
	return nil
}

// noteShardRegions adds to g's regions (shard 0's view) the view of shard
// sh where it differs: another state (a region heard by shard 0 but not by
// sh is silent, then lapsed, there only), or silent on one and not the
// other. Before, the region table was shard 0's alone, and a region cut
// off from another shard read live.
func noteShardRegions(g *globalView, sh *shardView) {
	for _, r := range sh.Global.Regions {
		for i := range g.Regions {
			base := &g.Regions[i]
			if base.Region != r.Region || (base.State == r.State && base.Silent == r.Silent) {
				continue
			}
			base.OtherShards = append(base.OtherShards, shardRegionView{Shard: sh.Shard, State: r.State,
				Silent: r.Silent, LastReportAgeMs: r.LastReportAgeMs, SilentSince: r.SilentSince})
		}
	}
}

// configuredShards is the config's shard count: shard 0 and the shards
// past it the config counts.
func configuredShards(shards []shardView) int {
	n := 1
	for _, sh := range shards {
		if !sh.Unconfigured {
			n++
		}
	}
	return n
}

// pressure is a key's demand over its rate (how Status ranks keys).
func pressure(k keyView) float64 {
	if k.Rate <= 0 {
		return 0
	}
	return k.Demand / k.Rate
}

// askGlobal calls AllocatorService.Status on addr. A standby holds no
// allocation: when it names the leader, the leader is asked once instead
// (as the allocator client follows a redirect); otherwise, or when the
// leader cannot be asked, the standby's answer is kept and the report says
// why there are no figures (status exits exitUnreachable). Failures to
// reach a replica are recorded in rep.
func (a *app) askGlobal(ctx context.Context, addr string, top int32, rep *statusReport) error {
	resp, err := a.askReplica(ctx, addr, top, rep)
	if err != nil || resp == nil || resp.GetLeader() {
		if resp != nil {
			rep.Global = newGlobalView(resp, time.Now())
		}
		return err
	}
	standby := newGlobalView(resp, time.Now())
	leader := resp.GetLeaderAddr()
	if leader == "" || leader == addr {
		rep.Global = standby
		rep.GlobalError = fmt.Sprintf("the global allocator at %s is a standby and knows no leader: a standby holds no allocation, so there are no figures to show\n"+
			"run status again once a replica leads (etcd's global election shows it)", addr)
		return nil
	}
	var next statusReport
	lresp, err := a.askReplica(ctx, leader, top, &next)
	if err != nil {
		return err
	}
	if lresp != nil && lresp.GetLeader() {
		rep.AskedStandby, rep.GlobalAddr = addr, leader
		rep.Global = newGlobalView(lresp, time.Now())
		return nil
	}
	why := next.GlobalError
	if lresp != nil {
		why = "it does not lead either (leadership is moving): run status again"
	}
	rep.Global = standby
	rep.refused = next.refused
	rep.GlobalError = fmt.Sprintf("the global allocator at %s is a standby: a standby holds no allocation, so there are no figures to show\n"+
		"the leader it names, %s, could not be asked: %s", addr, leader, why)
	return nil
}

// globalAddrs is -global-addr split at its commas, each address host:port
// ("{shard}" in it, which cmd/regional reads as a shard's number, stands
// for shard 0, whose allocator status asks first); nil when it is not
// given. One that is not host:port is a usage error naming it.
func (a *app) globalAddrs() ([]string, error) {
	if strings.TrimSpace(a.g.globalAddr) == "" {
		return nil, nil
	}
	var addrs []string
	for _, s := range strings.Split(a.g.globalAddr, ",") {
		addr := strings.ReplaceAll(strings.TrimSpace(s), "{shard}", "0")
		if flagenv.HostPort(addr) != nil {
			return nil, exitf(exitUsage, "-global-addr (%s) %q: %q is not host:port; give one address, or several separated by commas",
				flagenv.EnvName(envPrefix, "global-addr"), a.g.globalAddr, strings.TrimSpace(s))
		}
		addrs = append(addrs, addr)
	}
	return addrs, nil
}

// givenGlobal reports whether addr is one of -global-addr's.
func (a *app) givenGlobal(addr string) bool {
	addrs, _ := a.globalAddrs()
	return slices.Contains(addrs, addr)
}

// askFirst asks the global allocators at addrs in turn (askGlobal) until
// one answers, or refuses this client (the others would too). rep then
// holds that answer; when none answers, the failure of each, in order.
func (a *app) askFirst(ctx context.Context, addrs []string, top int32, rep *statusReport) error {
	var failures []string
	for i, addr := range addrs {
		try := *rep
		try.GlobalAddr = addr
		if err := a.askGlobal(ctx, addr, top, &try); err != nil {
			return err
		}
		if try.Global != nil || try.refused || i == len(addrs)-1 {
			if try.Global == nil && len(failures) > 0 {
				try.GlobalError = strings.Join(append(failures, try.GlobalError), "\n")
			}
			*rep = try
			return nil
		}
		failures = append(failures, try.GlobalError)
	}
	return nil
}

// askReplica calls AllocatorService.Status on one replica at addr. A
// failure to reach it, or its refusal, is recorded in rep and the answer
// is nil.
func (a *app) askReplica(ctx context.Context, addr string, top int32, rep *statusReport) (*sluicev1.StatusResponse, error) {
	conn, err := a.dialGRPC(addr, a.g.globalTLSName)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stepCtx, cancel := a.step(ctx)
	defer cancel()
	resp, err := sluicev1.NewAllocatorServiceClient(conn).Status(stepCtx, &sluicev1.StatusRequest{TopKeys: top})
	if ctx.Err() != nil {
		return nil, interrupted(ctx, "asking the global allocator at "+addr+" for status")
	}
	if err != nil {
		hint := "check -global-addr (" + flagenv.EnvName(envPrefix, "global-addr") + "), that a global allocator runs there, and the -tls-ca/-tls-cert/-tls-key flags (-global-tls-name when the certificate does not carry the address dialed)"
		switch status.Code(err) {
		case codes.Unimplemented:
			hint = "the server there does not serve AllocatorService.Status; point -global-addr at a global allocator"
		case codes.PermissionDenied, codes.Unauthenticated:
			rep.refused = true
			rep.GlobalError = fmt.Sprintf("the global allocator at %s answered but refused this client (%s): %s\n"+
				"check that -tls-cert/-tls-key are given and hold the %s role (the auth section of the config)",
				addr, status.Code(err), status.Convert(err).Message(), config.RoleOperator)
			return nil, nil
		}
		if why, ok := a.transportRefusal(err); ok {
			rep.refused = true
			rep.GlobalError = fmt.Sprintf("the global allocator at %s: %s", addr, why)
			return nil, nil
		}
		if c := status.Code(err); (c == codes.Unavailable || c == codes.DeadlineExceeded) && !tlsFailure(err) {
			rep.GlobalError = a.unreachableGlobal(addr, err)
			return nil, nil
		}
		rep.GlobalError = fmt.Sprintf("cannot get status from the global allocator at %s: %v\n%s", addr, err, hint)
		return nil, nil
	}
	return resp, nil
}

// unreachableGlobal says, for an operator, that the global allocator at
// addr could not be reached (err is Unavailable or DeadlineExceeded): what
// failed, that a global failover may be under way (etcd names a leader
// until its session expires; a standby then takes over), and what to do.
// status still exits exitUnreachable.
func (a *app) unreachableGlobal(addr string, err error) string {
	why := "it did not answer within -timeout " + a.g.timeout.String()
	if status.Code(err) == codes.Unavailable {
		why = "it cannot be reached: " + transportCause(status.Convert(err).Message())
	}
	next := fmt.Sprintf("or give -global-addr (%s) of a global allocator replica that is up", flagenv.EnvName(envPrefix, "global-addr"))
	if a.givenGlobal(addr) {
		next = fmt.Sprintf("or check -global-addr (%s): a global allocator must run there (leave it out to ask the leader etcd names)",
			flagenv.EnvName(envPrefix, "global-addr"))
	}
	return fmt.Sprintf("cannot get status from the global allocator at %s: %s\n"+
		"a global failover may be in progress: etcd names a leader until its session expires (cmd/global -session-ttl), then a standby takes over\n"+
		"run status again in a few seconds, %s", addr, why, next)
}

// tlsFailure reports whether a failed call's message is about TLS (a
// handshake, a certificate): the flags, not a failover, are to check.
func tlsFailure(err error) bool {
	msg := status.Convert(err).Message()
	return strings.Contains(msg, "handshake") || strings.Contains(msg, "x509") || strings.Contains(msg, "tls:")
}

// transportCause is the last reason in a gRPC connection error's message,
// such as "connection refused" or "i/o timeout" out of "connection error:
// desc = \"transport: Error while dialing: dial tcp ...: connect:
// connection refused\"", or the message itself when it has none.
func transportCause(msg string) string {
	msg = strings.TrimRight(msg, `"`)
	if i := strings.LastIndex(msg, ": "); i >= 0 && i+2 < len(msg) {
		return msg[i+2:]
	}
	return msg
}

// Region states as the allocator reports them (RegionStatus.state).
const (
	stateLive      = "live"
	stateSilent    = "silent"
	stateLapsed    = "lapsed"
	stateReturning = "returning"
	stateDrained   = "drained"
)

// newGlobalView turns the allocator's answer, received at now, into the
// report's view.
func newGlobalView(resp *sluicev1.StatusResponse, now time.Time) *globalView {
	g := &globalView{
		AnsweredByLeader: resp.GetLeader(),
		LeaderAddr:       resp.GetLeaderAddr(),
		Learning:         resp.GetLearning(),
		Epoch:            resp.GetEpoch(),
		ConfigRevision:   resp.GetConfigRevision(),
		ContendedKeys:    resp.GetContendedKeys(),
		Regions:          []regionView{},
		Degraded:         []string{},
		Keys:             []keyView{},
	}
	lowest := math.Inf(1)
	for _, f := range resp.GetClassFloors() {
		if g.ClassFloors == nil {
			g.ClassFloors = map[string]float64{}
		}
		g.ClassFloors[f.GetClass()] = f.GetPartitionShare()
		lowest = math.Min(lowest, f.GetPartitionShare())
	}
	for _, r := range resp.GetRegions() {
		rv := regionView{
			Region: r.GetRegion(), LastReportAgeMs: r.GetLastReportAgeMs(), Silent: r.GetSilent(), LastSeq: r.GetLastSeq(),
			State: r.GetState(), StaticLeaseMs: r.GetStaticLeaseMs(), ReservedFraction: r.GetReservedFraction(),
			ReservedMinFraction: r.GetReservedFraction(),
			DrainPending:        r.GetDrainPending(), Lapsed: r.GetLapsed() || r.GetState() == stateLapsed,
		}
		if rv.ReservedFraction < 1 && lowest < rv.ReservedFraction {
			// On its floor: each class keeps its own partition_share.
			rv.ReservedMinFraction = lowest
		}
		if (rv.Silent || rv.Lapsed) && rv.LastReportAgeMs >= 0 {
			// The stored instant: the same on every call. Computed from
			// the age and this call's now, it moved by a millisecond or so
			// from call to call for the same report.
			since := time.UnixMilli(r.GetLastReportUnixMs())
			if r.GetLastReportUnixMs() <= 0 {
				since = now.Add(-time.Duration(rv.LastReportAgeMs) * time.Millisecond).Truncate(time.Millisecond)
			}
			rv.SilentSince = &since
		}
		g.Regions = append(g.Regions, rv)
		if r.GetSilent() {
			g.Degraded = append(g.Degraded, r.GetRegion())
		}
	}
	sort.Slice(g.Regions, func(i, j int) bool { return g.Regions[i].Region < g.Regions[j].Region })
	sort.Strings(g.Degraded)
	for _, k := range resp.GetKeys() {
		kv := keyView{
			Tenant: k.GetKey().GetTenant(), Class: k.GetKey().GetClass(),
			Rate: k.GetRate(), Burst: k.GetBurst(), Demand: k.GetDemand(),
			Regions: []keyRegionView{},
		}
		for _, r := range k.GetRegions() {
			kv.Regions = append(kv.Regions, keyRegionView{
				Region: r.GetRegion(), Demand: r.GetDemand(), Target: r.GetTarget(),
				GrantedRate: r.GetGrantedRate(), GrantedBurst: r.GetGrantedBurst(),
				ValidMs: r.GetValidMs(), StaticRate: r.GetStaticRate(),
			})
		}
		g.Keys = append(g.Keys, kv)
	}
	return g
}

// writeStatusText renders rep as aligned tables.
func writeStatusText(out io.Writer, rep *statusReport) error {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	switch {
	case rep.EtcdError != "":
		fmt.Fprintln(w, "etcd: unreachable (see below)")
	case rep.EtcdPrefix == "":
		fmt.Fprintln(w, "etcd: not asked (no -etcd-endpoints)")
	default:
		fmt.Fprintf(w, "etcd prefix:\t%s\n", rep.EtcdPrefix)
		if rep.ConfigError != "" {
			fmt.Fprintf(w, "config:\tREFUSED\t(the stored config is refused; regions are those of the config the daemons run; see below)\n")
		}
		if rep.ConfigMissing != "" {
			fmt.Fprintf(w, "config:\tDELETED\t(etcd holds none; the daemons keep revision %d; see below)\n", rep.Global.ConfigRevision)
		}
		if rep.GlobalLeader != nil {
			fmt.Fprintf(w, "global leader:\t%s\t(%s)\n", rep.GlobalLeader.Addr, candidates(rep.GlobalLeader.Candidates))
		} else if len(rep.Shards) > 0 {
			fmt.Fprintf(w, "global leader:\tnone\t(no replica of shard 0 holds its election; the other shards are listed below)\n")
		} else {
			fmt.Fprintf(w, "global leader:\tnone\t(no global allocator holds the election)\n")
		}
		fmt.Fprintln(w)
		fmt.Fprintln(w, "REGION\tLEADER\tCANDIDATES\tNOTE")
		if len(rep.RegionLeaders) == 0 {
			fmt.Fprintln(w, "-\t-\t0\tno config in etcd and no region elections")
		}
		for _, r := range rep.RegionLeaders {
			addr, n, note := "none", 0, ""
			if r.Leader != nil {
				addr, n = r.Leader.Addr, r.Leader.Candidates
			} else {
				note = "no leader: no replica of the region syncs with the global tier"
			}
			if !r.Configured {
				note = "not in the config in etcd"
			}
			if r.Drained {
				note = "drained in the config (sluicectl region restore " + r.Region + " undoes it)"
			}
			fmt.Fprintf(w, "%s\t%s\t%d\t%s\n", r.Region, addr, n, note)
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)

	if rep.Global == nil {
		switch {
		case rep.GlobalAddr != "" && rep.refused:
			fmt.Fprintf(out, "global allocator %s: refused this client's credentials (see below)\n", rep.GlobalAddr)
		case rep.GlobalAddr != "":
			fmt.Fprintf(out, "global allocator %s: unreachable (see below)\n", rep.GlobalAddr)
		default:
			fmt.Fprintln(out, "global allocator: unknown (see below)")
		}
		// The other shards answer on their own: a shard 0 that cannot be
		// asked does not make them unknown.
		if len(rep.Shards) > 0 {
			w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
			writeShardLines(w, rep)
			return w.Flush()
		}
		return nil
	}
	g := rep.Global
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	role := "leader"
	if rep.AskedStandby != "" {
		role = "leader; asked " + rep.AskedStandby + ", a standby, which named it"
	}
	if !g.AnsweredByLeader {
		// A standby's allocator state is not the one regions run on.
		role = "standby; leader is " + orNone(g.LeaderAddr) + ")\t(STANDBY'S FIGURES: a standby holds no allocation, these are not the global tier's; see below"
	}
	fmt.Fprintf(w, "global allocator:\t%s\t(%s)\n", rep.GlobalAddr, role)
	learning := "no"
	if g.Learning {
		learning = "yes (only re-issuing what regions hold, for one grant validity)"
	}
	fmt.Fprintf(w, "learning:\t%s\n", learning)
	fmt.Fprintf(w, "epoch:\t%d\n", g.Epoch)
	rev := strconv.FormatInt(g.ConfigRevision, 10)
	if g.ConfigRevision == 0 {
		rev = "0 (bootstrap config)"
	}
	fmt.Fprintf(w, "config revision:\t%s\n", rev)
	fmt.Fprintf(w, "contended keys:\t%d\n", g.ContendedKeys)
	writeShardLines(w, rep)
	if len(g.Degraded) > 0 {
		fmt.Fprintf(w, "degraded:\t%s\t(silent: counted at max(last grant, static share) until the static lease lapses, then at the floor)\n", strings.Join(g.Degraded, ", "))
	} else {
		fmt.Fprintf(w, "degraded:\tnone\n")
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "REGION\tLAST REPORT\tSEQ\tSTATIC LEASE\tRESERVED\tSTATE")
	byClass := false
	for _, r := range g.Regions {
		lease, reserved := "-", "-"
		if r.State != "" {
			lease = validity(r.StaticLeaseMs)
			if r.StaticLeaseMs <= 0 {
				lease = "none"
			}
			reserved = num(100*r.ReservedFraction) + "%"
			if r.ReservedMinFraction < r.ReservedFraction {
				reserved = num(100*r.ReservedMinFraction) + "-" + reserved + " by class"
				byClass = true
			}
		}
		state := regionState(r)
		for _, o := range r.OtherShards {
			state += fmt.Sprintf("; at shard %d: %s", o.Shard, regionState(regionView{State: o.State, Silent: o.Silent,
				LastReportAgeMs: o.LastReportAgeMs, SilentSince: o.SilentSince}))
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\n", r.Region, age(r.LastReportAgeMs), r.LastSeq, lease, reserved, state)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(rep.Shards) > 0 {
		fmt.Fprintln(out, "(the region columns are shard 0's view; STATE adds each other shard that sees a region otherwise)")
	}
	if byClass {
		// The floor is per class: say which class keeps what, so a key's
		// TARGET can be read against it.
		names := make([]string, 0, len(g.ClassFloors))
		for name := range g.ClassFloors {
			names = append(names, name)
		}
		sort.Strings(names)
		parts := make([]string, len(names))
		for i, name := range names {
			parts[i] = name + " " + num(100*g.ClassFloors[name]) + "%"
		}
		fmt.Fprintf(out, "RESERVED on a floor is per class (its partition_share): %s\n", strings.Join(parts, ", "))
	}
	if len(g.Keys) == 0 {
		fmt.Fprintln(out, "\nno contended keys")
		return nil
	}
	fmt.Fprintln(out)
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "KEY\tRATE/S\tBURST\tREGION\tDEMAND/S\tTARGET/S\tGRANT/S\tGRANT BURST\tVALID\tSTATIC/S")
	for _, k := range g.Keys {
		// The "all" row sums the regions, so an operator sees at a glance
		// that grants stay within the key's rate and burst.
		var target, grantRate, grantBurst, static float64
		for _, r := range k.Regions {
			target += r.Target
			grantRate += r.GrantedRate
			grantBurst += r.GrantedBurst
			static += r.StaticRate
		}
		fmt.Fprintf(w, "%s/%s\t%s\t%s\tall\t%s\t%s\t%s\t%s\t-\t%s\n", k.Tenant, k.Class, num(k.Rate), num(k.Burst),
			num(k.Demand), num(target), num(grantRate), num(grantBurst), num(static))
		for _, r := range k.Regions {
			fmt.Fprintf(w, "\t\t\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Region, num(r.Demand), num(r.Target),
				num(r.GrantedRate), num(r.GrantedBurst), validity(r.ValidMs), num(r.StaticRate))
		}
	}
	return w.Flush()
}

// regionState explains a region's state in a few words. RESERVED is the
// share of its static share the global tier holds back for it without a
// grant; the rest goes to the other regions.
func regionState(r regionView) string {
	since := ""
	if r.SilentSince != nil {
		since = " since " + r.SilentSince.Local().Format("15:04:05.000")
	}
	switch r.State {
	case "":
		// An allocator that does not report static leases.
		if r.Silent {
			return "DEGRADED (silent)"
		}
		return "ok"
	case stateLive:
		return "live"
	case stateSilent:
		if r.LastReportAgeMs < 0 {
			return "SILENT (never heard; static lease still counted)"
		}
		return "SILENT" + since + " (static lease still counted)"
	case stateLapsed:
		// The allocator reports when the region was last heard from, not
		// when its lease lapsed (region_lease + grant_validity + a margin
		// later).
		if r.SilentSince != nil {
			return "LEASE EXPIRED (silent since " + r.SilentSince.Local().Format("15:04:05.000") + "; lapsed: on its floor, its share re-divided)"
		}
		return "LEASE EXPIRED (lapsed: on its floor, its share re-divided)"
	case stateReturning:
		return "RETURNING (on its floor until its static lease is conferred again)"
	case stateDrained:
		return drainedState(r, since)
	}
	return strings.ToUpper(r.State)
}

// drainedState explains a drained region: whether the global tier has
// re-divided its share yet, and whether the region is silent or lapsed (a
// region that is down cannot adopt the drain, so its share stays reserved
// until its static lease lapses).
func drainedState(r regionView, since string) string {
	switch {
	case r.Lapsed:
		return "DRAINED, LEASE EXPIRED (silent" + since + "; lapsed: on its floor, its share re-divided)"
	case r.DrainPending && r.Silent:
		return "DRAINED in the config, SILENT" + since + " (has not adopted the drain: its static share stays reserved until its lease lapses)"
	case r.DrainPending:
		return "DRAINED in the config, not yet adopted (its static share stays reserved until it reports the draining revision)"
	case r.Silent:
		return "DRAINED, SILENT" + since + " (on its floor, its share re-divided)"
	}
	return "DRAINED (config: on its floor, its share re-divided)"
}

func candidates(n int) string {
	if n == 1 {
		return "1 candidate"
	}
	return strconv.Itoa(n) + " candidates"
}

func orNone(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// age renders a report age in milliseconds; negative means never.
func age(ms int64) string {
	if ms < 0 {
		return "never"
	}
	return (time.Duration(ms) * time.Millisecond).String() + " ago"
}

func validity(ms int64) string {
	if ms <= 0 {
		return "expired"
	}
	return (time.Duration(ms) * time.Millisecond).String()
}

// num renders a rate or burst with at most two decimals.
func num(v float64) string {
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64)
}

// writeShardLines writes one line per shard past shard 0: its leader and
// figures, or why it has none.
func writeShardLines(w io.Writer, rep *statusReport) {
	for _, sh := range rep.Shards {
		switch {
		case sh.Unconfigured && sh.Global != nil:
			fmt.Fprintf(w, "shard %d:\t%s\t(NOT IN THE CONFIG, which has %d shards: owns no keys, its figures are not counted above; raise global_shards to include it, or stop its replicas)\n",
				sh.Shard, sh.Leader.Addr, configuredShards(rep.Shards))
		case sh.Global != nil:
			l := "no"
			if sh.Global.Learning {
				l = "yes"
			}
			fmt.Fprintf(w, "shard %d:\t%s\t(learning: %s, contended keys: %d)\n", sh.Shard, sh.Leader.Addr, l, sh.Global.ContendedKeys)
		case sh.Unconfigured:
			fmt.Fprintf(w, "shard %d:\tunreachable\t(NOT IN THE CONFIG, which has %d shards: an election key of a replica that outlived a lowered global_shards)\n",
				sh.Shard, configuredShards(rep.Shards))
		default:
			fmt.Fprintf(w, "shard %d:\tunreachable\t(see below)\n", sh.Shard)
		}
	}
}
