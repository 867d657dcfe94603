package regional

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/shrink"
	"github.com/sluicehq/sluice/pkg/quota"
)

// activeKeys remembers the keys this replica served recently: the keys
// served since the last flush, which every replica flushes into a sorted
// set in Redis (member "tenant|class", score = Redis time in µs) so the
// region leader can find every active key without scanning Redis, and the
// live lease count each key showed in the last script reply.
//
// It holds only live keys: prune drops a key once it is flushed and has no
// live lease left as far as this replica knows (its last lease reply said
// none, a release took the last one off, or no reply came for a lease TTL,
// after which every lease that reply counted has expired or was renewed
// through another replica, which counts it). Keys a region holds a grant
// for need nothing here: the leader adds them to the Redis index itself.
// Safe for concurrent use.
type activeKeys struct {
	mu   sync.Mutex                // guards keys and peak
	keys map[quota.Key]activeEntry // guarded by mu
	peak shrink.Peak               // guarded by mu
}

type activeEntry struct {
	seen bool      // served since the last flush
	live int64     // live leases on the key, as last seen
	at   time.Time // when live was last read from a script reply
}

func newActiveKeys() *activeKeys {
	return &activeKeys{keys: map[quota.Key]activeEntry{}}
}

// touch records a lease reply at now that showed live leases on k.
func (a *activeKeys) touch(now time.Time, k quota.Key, live int64) {
	a.mu.Lock()
	a.keys[k] = activeEntry{seen: true, live: max(live, 0), at: now}
	a.peak.Note(len(a.keys))
	a.mu.Unlock()
}

// mark records that k was served without a lease count (a strict check).
func (a *activeKeys) mark(k quota.Key) {
	a.mu.Lock()
	e := a.keys[k]
	e.seen = true
	a.keys[k] = e
	a.peak.Note(len(a.keys))
	a.mu.Unlock()
}

// release records that an instance released its lease on k: the release
// script deletes that instance's lease, so one fewer is live.
func (a *activeKeys) release(k quota.Key) {
	a.mu.Lock()
	e := a.keys[k]
	e.seen = true
	e.live = max(e.live-1, 0)
	a.keys[k] = e
	a.peak.Note(len(a.keys))
	a.mu.Unlock()
}

// leases is the live leases on the keys whose count was read within ttl
// before now.
func (a *activeKeys) leases(now time.Time, ttl time.Duration) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var n int64
	for _, e := range a.keys {
		if e.live > 0 && now.Sub(e.at) < ttl {
			n += e.live
		}
	}
	return n
}

// size is how many keys the index holds.
func (a *activeKeys) size() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.keys)
}

// prune forgets the flushed keys with no live lease at now (see
// activeKeys) and gives the map's room back once it has mostly emptied.
func (a *activeKeys) prune(now time.Time, ttl time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, e := range a.keys {
		if !e.seen && (e.live <= 0 || now.Sub(e.at) >= ttl) {
			delete(a.keys, k)
		}
	}
	a.keys = shrink.Map(a.keys, &a.peak)
}

// flushChunk is how many keys one ZADD of a flush carries.
const flushChunk = 1024

// flush writes the keys seen since the last flush into the index at Redis
// time nowUS and drops entries older than keepUS. Keys it could not write
// stay marked for the next flush.
func (a *activeKeys) flush(ctx context.Context, c redis.Cmdable, index string, nowUS, keepUS int64) error {
	a.mu.Lock()
	var flushed []quota.Key
	members := make([]redis.Z, 0)
	for k, e := range a.keys {
		if !e.seen {
			continue
		}
		members = append(members, redis.Z{Score: float64(nowUS), Member: k.Tenant + "|" + k.Class})
		flushed = append(flushed, k)
		e.seen = false
		a.keys[k] = e
	}
	a.mu.Unlock()
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		// In slices, so one huge ZADD does not hold Redis up for the
		// other clients' commands.
		for ms := range slices.Chunk(members, flushChunk) {
			p.ZAdd(ctx, index, ms...)
		}
		p.ZRemRangeByScore(ctx, index, "-inf", fmt.Sprint(nowUS-keepUS))
		return nil
	})
	if err != nil {
		for _, k := range flushed {
			a.mark(k)
		}
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
