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
// than the horizon, in the same round trip. Nothing here reads more than
// the marks: the leader never scans the region's keys.
func (l *Leader) candidates(ctx context.Context, sendUS int64, epoch time.Duration, kind regionsync.Kind) ([]quota.Key, error) {
	s := l.s
	since := regionsync.CandidatesSince(sendUS, epoch)
	sets := s.candKeys()
	reads := make([]*redis.StringSliceCmd, len(sets))
	_, err := s.opts.Redis.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, set := range sets {
			reads[i] = p.ZRangeByScore(ctx, set, &redis.ZRangeBy{Min: strconv.FormatInt(since, 10), Max: "+inf"})
			if kind == regionsync.Epoch {
				p.ZRemRangeByScore(ctx, set, "-inf", "("+strconv.FormatInt(since, 10))
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read candidates: %w", err)
	}
	var keys []quota.Key
	for _, r := range reads {
		for _, m := range r.Val() {
			t, c, ok := strings.Cut(m, "|")
			k := quota.Key{Tenant: t, Class: c}
			if !ok || k.Validate() != nil {
				continue // not ours; never trust Redis contents blindly
			}
			keys = append(keys, k)
		}
	}
	s.metrics.candidates.Set(float64(len(keys)))
	return l.sync.Select(keys), nil
}
