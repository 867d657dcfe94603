package regional

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Eviction breaks invariant 1 silently. A bucket is a hash with a TTL and
// the born sentinel has none, so a Redis with maxmemory and an evicting
// policy (volatile-* above all, allkeys-* too) drops buckets under memory
// pressure while their data set stays old, and the scripts trust a bucket
// missing from an old data set to be full (it idled out): each eviction
// of a key's bucket can hand out up to one more burst, again and again.
// So the daemon refuses to start on such a Redis unless told to accept it
// (DaemonOptions.AllowEviction), and keeps watching while it runs: a
// policy changed with CONFIG SET, a failover to a node configured
// otherwise, keys evicted all the same.

// RedisMemory is one Redis node's memory settings and eviction count as
// INFO reports them (INFO works where CONFIG is disabled, as on managed
// Redis).
type RedisMemory struct {
	// Node is the node's address.
	Node string
	// MaxMemory is maxmemory in bytes; 0 is no limit.
	MaxMemory int64
	// Policy is maxmemory-policy (noeviction, volatile-lru, allkeys-lru, ...).
	Policy string
	// EvictedKeys is INFO stats' evicted_keys: keys the node evicted since
	// it started or its statistics were reset.
	EvictedKeys int64
}

// Evicts says whether the node drops keys under memory pressure: a
// memory limit and any policy but noeviction.
func (m RedisMemory) Evicts() bool { return m.MaxMemory > 0 && m.Policy != "noeviction" }

// ReadRedisMemory reads INFO memory and INFO stats of every node of c (of
// every master on a Redis Cluster: replicas evict nothing of their own).
// The sections are read one by one: a Redis before 7 takes one section
// per INFO.
func ReadRedisMemory(ctx context.Context, c redis.UniversalClient) ([]RedisMemory, error) {
	if cc, ok := c.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		var out []RedisMemory
		err := cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			m, err := readNodeMemory(ctx, n, n.Options().Addr)
			if err != nil {
				return err
			}
			mu.Lock()
			out = append(out, m)
			mu.Unlock()
			return nil
		})
		slices.SortFunc(out, func(a, b RedisMemory) int { return strings.Compare(a.Node, b.Node) })
		return out, err
	}
	addr := ""
	if rc, ok := c.(*redis.Client); ok {
		addr = rc.Options().Addr
	}
	m, err := readNodeMemory(ctx, c, addr)
	if err != nil {
		return nil, err
	}
	return []RedisMemory{m}, nil
}

func readNodeMemory(ctx context.Context, c redis.Cmdable, addr string) (RedisMemory, error) {
	m := RedisMemory{Node: addr}
	mem, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return m, fmt.Errorf("redis %s: INFO memory: %w", addr, err)
	}
	stats, err := c.Info(ctx, "stats").Result()
	if err != nil {
		return m, fmt.Errorf("redis %s: INFO stats: %w", addr, err)
	}
	f := infoFields(mem + "\n" + stats)
	pol, ok := f["maxmemory_policy"]
	if !ok {
		return m, fmt.Errorf("redis %s: INFO memory has no maxmemory_policy", addr)
	}
	m.Policy = pol
	if m.MaxMemory, err = strconv.ParseInt(f["maxmemory"], 10, 64); err != nil {
		return m, fmt.Errorf("redis %s: INFO memory maxmemory %q: %w", addr, f["maxmemory"], err)
	}
	// evicted_keys is only counted; a Redis that does not report it
	// counts as none.
	m.EvictedKeys, _ = strconv.ParseInt(f["evicted_keys"], 10, 64)
	return m, nil
}

// infoFields reads INFO's "name:value" lines.
func infoFields(info string) map[string]string {
	f := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			f[k] = v
		}
	}
	return f
}

// EvictionError refuses a Redis that evicts keys.
type EvictionError struct {
	// Nodes are the evicting nodes.
	Nodes []RedisMemory
}

func (e *EvictionError) Error() string {
	var b strings.Builder
	for i, n := range e.Nodes {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s (maxmemory %d bytes, maxmemory-policy %s)", n.Node, n.MaxMemory, n.Policy)
	}
	return "regional: redis evicts keys under memory pressure: " + b.String() +
		"; an evicted token bucket comes back full, so the region admits more than its limit " +
		"(docs/architecture.md, invariant 1). Set maxmemory-policy noeviction (redis.conf, " +
		"CONFIG SET maxmemory-policy noeviction, or the managed service's parameter group), " +
		"or accept the over-admission with -redis-allow-eviction (DaemonOptions.AllowEviction)"
}

// evicting lists the nodes of mem that evict.
func evicting(mem []RedisMemory) []RedisMemory {
	var out []RedisMemory
	for _, m := range mem {
		if m.Evicts() {
			out = append(out, m)
		}
	}
	return out
}

// evictionWatch follows the nodes' eviction settings and counts while the
// daemon runs: it logs a change of a node's settings once, and the start
// of each run of evictions once, and keeps the evicting gauge and the
// evicted-keys counter. Used by one goroutine at a time.
type evictionWatch struct {
	log     *slog.Logger
	metrics *metrics
	last    map[string]RedisMemory // node → last reading
	growing map[string]bool        // node → its last reading saw keys evicted
	failing bool                   // the last reading failed

	readings atomic.Int64 // readings taken, failed or not (tests wait on it)
}

func newEvictionWatch(log *slog.Logger, m *metrics) *evictionWatch {
	return &evictionWatch{log: log, metrics: m, last: map[string]RedisMemory{}, growing: map[string]bool{}}
}

// observe takes one reading of every node.
func (w *evictionWatch) observe(mem []RedisMemory) {
	defer w.readings.Add(1)
	w.failing = false
	evicts := false
	for _, m := range mem {
		prev, seen := w.last[m.Node]
		w.last[m.Node] = m
		if m.Evicts() {
			evicts = true
		}
		switch {
		case m.Evicts() && (!seen || !prev.Evicts() || prev.Policy != m.Policy || prev.MaxMemory != m.MaxMemory):
			w.log.Error("redis evicts keys under memory pressure: an evicted token bucket comes back full and the region admits more than its limit (docs/architecture.md, invariant 1); set maxmemory-policy noeviction",
				"node", m.Node, "maxmemory", m.MaxMemory, "maxmemory_policy", m.Policy)
		case seen && prev.Evicts() && !m.Evicts():
			w.log.Info("redis no longer evicts keys", "node", m.Node, "maxmemory", m.MaxMemory, "maxmemory_policy", m.Policy)
		}
		if !seen {
			if m.EvictedKeys > 0 {
				w.log.Warn("redis evicted keys before this process started (INFO stats evicted_keys); if they were Sluice's token buckets, the region admitted more than its limit",
					"node", m.Node, "evicted_keys", m.EvictedKeys)
			}
			continue
		}
		grew := m.EvictedKeys - prev.EvictedKeys
		if grew < 0 { // restarted, or CONFIG RESETSTAT
			grew = m.EvictedKeys
		}
		if grew > 0 {
			w.metrics.evictedKeys.Add(float64(grew))
			if !w.growing[m.Node] {
				w.log.Error("redis is evicting keys: an evicted token bucket comes back full and the region admits more than its limit (docs/architecture.md, invariant 1)",
					"node", m.Node, "evicted", grew, "evicted_keys", m.EvictedKeys, "maxmemory", m.MaxMemory, "maxmemory_policy", m.Policy)
			}
		}
		w.growing[m.Node] = grew > 0
	}
	if evicts {
		w.metrics.evicting.Set(1)
	} else {
		w.metrics.evicting.Set(0)
	}
}

// failed notes a reading that failed, logged once per run of failures
// (Redis down shows in the readiness ping; a user that may not run INFO
// shows only here).
func (w *evictionWatch) failed(err error) {
	defer w.readings.Add(1)
	if !w.failing {
		w.log.Warn("cannot read redis's eviction settings (INFO memory, INFO stats); evictions go unnoticed until it can", "err", err)
	}
	w.failing = true
}
