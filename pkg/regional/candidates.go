package regional

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regionsync"
)

// candKeys lists the region's candidate sets: one on a single Redis, one
// per hash slot on a cluster (luascripts.CandKeys).
func (s *Server) candKeys() []string {
	_, cluster := s.opts.Redis.(*redis.ClusterClient)
	return luascripts.CandKeys(s.opts.Prefix, cluster)
}

// candidates is the keys a report sent at sendUS (Redis time) reads: the
// keys the scripts marked in the candidate sets since
// regionsync.CandidatesSince and the keys the leader selected before
// (regionsync.Leader.Select). An epoch report also trims the marks older
// than the horizon, in the same round trip: on a single Redis every one,
// on a Redis Cluster every ClusterTrimEvery-th (and a leader's first). Nothing
// here reads more than the marks: the leader never scans the region's
// keys.
func (l *Leader) candidates(ctx context.Context, sendUS int64, epoch time.Duration, kind regionsync.Kind) ([]quota.Key, error) {
	s := l.s
	since := regionsync.CandidatesSince(sendUS, epoch)
	sets := s.candKeys()
	cluster := len(sets) > 1
	trim := kind == regionsync.Epoch && (!cluster || l.untrimmed%ClusterTrimEvery == 0)
	lists, err := l.readCandidates(ctx, sets, since, trim, epoch)
	if err != nil {
		return nil, fmt.Errorf("read candidates: %w", err)
	}
	if cluster && kind == regionsync.Epoch {
		l.untrimmed++
		if trim {
			l.untrimmed = 1
		}
	}
	var keys []quota.Key
	for _, members := range lists {
		keys = appendMembers(keys, members)
	}
	s.metrics.candidates.Set(float64(len(keys)))
	return l.sync.Select(keys), nil
}

// readCandidates reads the members of each candidate set marked since
// since (and trims older marks when trim). On one Redis, one pipeline
// that fails as a whole. On a Redis Cluster, one pipeline per master,
// side by side, each bounded by clusterBound: a master that fails (or
// was skipped after a failure, clusterNodes) has its slots' sets left
// out, logged and counted (sluice_regional_leader_left_out_total), and
// the other masters' marks are read. Leaving those keys out of the report
// is safe: the global tier keeps counting a key a report leaves out at
// the grant it gave, until that grant ends, and at the static share after
// (pkg/hierarchy TestGrantedKeyMissingFromReportsKeepsCounting). Before,
// one failed master failed the read, and with it every report of the
// region.
func (l *Leader) readCandidates(ctx context.Context, sets []string, since int64, trim bool, epoch time.Duration) ([][]string, error) {
	s := l.s
	lists := make([][]string, len(sets))
	queue := func(ctx context.Context, p redis.Pipeliner, idx []int) []*redis.StringSliceCmd {
		reads := make([]*redis.StringSliceCmd, len(idx))
		for j, i := range idx {
			reads[j] = p.ZRangeByScore(ctx, sets[i], &redis.ZRangeBy{Min: strconv.FormatInt(since, 10), Max: "+inf"})
			if trim {
				p.ZRemRangeByScore(ctx, sets[i], "-inf", "("+strconv.FormatInt(since, 10))
			}
		}
		return reads
	}
	if s.nodes == nil {
		all := make([]int, len(sets))
		for i := range all {
			all[i] = i
		}
		var reads []*redis.StringSliceCmd
		if _, err := s.opts.Redis.Pipelined(ctx, func(p redis.Pipeliner) error {
			reads = queue(ctx, p, all)
			return nil
		}); err != nil {
			return nil, err
		}
		for i, r := range reads {
			lists[i] = r.Val()
		}
		return lists, nil
	}
	errs := make([]error, len(sets))
	failed := map[string]int{} // failed master -> slots left out
	s.perNode(ctx, sets, l.clusterBound(epoch), func(i int, err error) {
		lists[i], errs[i] = nil, nil
		failed[nodeOf(err)]++
	}, func(ctx context.Context, idx []int) ([]error, func()) {
		var reads []*redis.StringSliceCmd
		// Each command's own error is judged (perNode).
		_, _ = s.opts.Redis.Pipelined(ctx, func(p redis.Pipeliner) error {
			reads = queue(ctx, p, idx)
			return nil
		})
		out := make([]error, len(idx))
		for j, r := range reads {
			out[j] = r.Err()
		}
		return out, func() {
			for j, r := range reads {
				lists[idx[j]], errs[idx[j]] = r.Val(), out[j]
			}
		}
	})
	for node, n := range failed {
		s.metrics.leftOut.WithLabelValues("candidate_slots").Add(float64(n))
		l.logLeftOut(node, "candidate sets of its slots not read", n)
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return lists, nil
}

// ClusterTrimEvery is how many epoch reports apart a region leader trims
// the candidate sets of a Redis Cluster. There is one set per hash slot,
// 16,384, nearly all empty, and a trim of each every epoch doubled the
// commands of every epoch's read (32,768 pipelined) and its time
// (BenchmarkClusterCandidateRead: 42-45 ms against 22-23 ms on a
// three-master cluster on loopback; past the epoch's bound on a starved
// machine, which failed the region's reports). The reads take only marks
// newer than the horizon, so an old mark left a few epochs longer changes
// no report: it only holds its set's memory, at most the keys marked in
// ClusterTrimEvery + CandidateHorizon epochs.
const ClusterTrimEvery = 8

// appendMembers appends the keys named by candidate-set members
// ("tenant|class") to keys, skipping any member that names no valid key:
// never trust Redis contents blindly.
func appendMembers(keys []quota.Key, members []string) []quota.Key {
	for _, m := range members {
		t, c, ok := strings.Cut(m, "|")
		k := quota.Key{Tenant: t, Class: c}
		if !ok || k.Validate() != nil {
			continue
		}
		keys = append(keys, k)
	}
	return keys
}

// freshKeys is a look between epochs at the candidate set of a single
// Redis (regionsync.FreshWatch): the keys newly marked that the leader
// neither reports nor watches, when the set grew since the last look. On
// a cluster, or when the look fails, none.
func (l *Leader) freshKeys(ctx context.Context, epoch time.Duration) []quota.Key {
	s := l.s
	sets := s.candKeys()
	if len(sets) != 1 {
		return nil
	}
	var now *redis.TimeCmd
	var card *redis.IntCmd
	if _, err := s.opts.Redis.Pipelined(ctx, func(p redis.Pipeliner) error {
		now = p.Time(ctx)
		card = p.ZCard(ctx, sets[0])
		return nil
	}); err != nil {
		l.fresh.Reset()
		return nil
	}
	nowUS := now.Val().UnixMicro()
	read, since := l.fresh.Look(card.Val(), nowUS)
	if !read {
		return nil
	}
	// Up to a little past now: a granted key's mark scores its grant's
	// expiry, and such a key is reported anyway.
	until := nowUS + regionsync.NudgeSpacing(epoch).Microseconds()
	members, err := s.opts.Redis.ZRangeByScore(ctx, sets[0], &redis.ZRangeBy{
		Min: strconv.FormatInt(since, 10), Max: strconv.FormatInt(until, 10)}).Result()
	if err != nil {
		l.fresh.Reset()
		return nil
	}
	return l.sync.Fresh(appendMembers(nil, members))
}
