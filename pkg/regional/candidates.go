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
	reads := make([]*redis.StringSliceCmd, len(sets))
	_, err := s.opts.Redis.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, set := range sets {
			reads[i] = p.ZRangeByScore(ctx, set, &redis.ZRangeBy{Min: strconv.FormatInt(since, 10), Max: "+inf"})
			if trim {
				p.ZRemRangeByScore(ctx, set, "-inf", "("+strconv.FormatInt(since, 10))
			}
		}
		return nil
	})
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
	for _, r := range reads {
		keys = appendMembers(keys, r.Val())
	}
	s.metrics.candidates.Set(float64(len(keys)))
	return l.sync.Select(keys), nil
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
