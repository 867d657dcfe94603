package regional

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/pkg/quota"
)

// activeKeys remembers the keys this replica served since the last flush
// and the live lease count each showed. Every replica flushes them into a
// sorted set in Redis (member "tenant|class", score = Redis time in µs) so
// the region leader can find every active key without scanning Redis.
// Safe for concurrent use.
type activeKeys struct {
	mu   sync.Mutex          // guards seen and live
	seen map[quota.Key]bool  // served since the last flush
	live map[quota.Key]int64 // live leases per key, as last seen
}

func newActiveKeys() *activeKeys {
	return &activeKeys{seen: map[quota.Key]bool{}, live: map[quota.Key]int64{}}
}

func (a *activeKeys) touch(k quota.Key, live int64) {
	a.mu.Lock()
	a.seen[k] = true
	if live > 0 {
		a.live[k] = live
	} else {
		delete(a.live, k)
	}
	a.mu.Unlock()
}

func (a *activeKeys) mark(k quota.Key) {
	a.mu.Lock()
	a.seen[k] = true
	a.mu.Unlock()
}

func (a *activeKeys) leases() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var n int64
	for _, v := range a.live {
		n += v
	}
	return n
}

// flush writes the keys seen since the last flush into the index at Redis
// time nowUS and drops entries older than keepUS.
func (a *activeKeys) flush(ctx context.Context, c redis.Cmdable, index string, nowUS, keepUS int64) error {
	a.mu.Lock()
	members := make([]redis.Z, 0, len(a.seen))
	for k := range a.seen {
		members = append(members, redis.Z{Score: float64(nowUS), Member: k.Tenant + "|" + k.Class})
	}
	clear(a.seen)
	a.mu.Unlock()
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		if len(members) > 0 {
			p.ZAdd(ctx, index, members...)
		}
		p.ZRemRangeByScore(ctx, index, "-inf", fmt.Sprint(nowUS-keepUS))
		return nil
	})
	if err != nil {
		return fmt.Errorf("flush active keys to %s: %w", index, err)
	}
	return nil
}

// ActiveKeys reads the keys some replica of the region served since
// sinceUS (Redis time) from the index.
func ActiveKeys(ctx context.Context, c redis.Cmdable, prefix string, sinceUS int64) ([]quota.Key, error) {
	ms, err := c.ZRangeByScore(ctx, prefix+"active", &redis.ZRangeBy{Min: fmt.Sprint(sinceUS), Max: "+inf"}).Result()
	if err != nil {
		return nil, fmt.Errorf("read active keys: %w", err)
	}
	keys := make([]quota.Key, 0, len(ms))
	for _, m := range ms {
		t, c, ok := strings.Cut(m, "|")
		k := quota.Key{Tenant: t, Class: c}
		if !ok || k.Validate() != nil {
			continue // not ours; never trust Redis contents blindly
		}
		keys = append(keys, k)
	}
	return keys, nil
}
