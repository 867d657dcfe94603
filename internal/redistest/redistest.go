// Package redistest starts real redis-server processes for tests.
//
// Each Server is its own process on a free loopback port with persistence
// off, killed by t.Cleanup. Tests that need Redis call Start; when
// redis-server is not on PATH the test fails with a message that says how to
// install it (make test installs it), so a missing dependency is never
// mistaken for a pass.
package redistest

import (
	"context"
	"crypto/tls"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redisproc"
)

// Server is one redis-server process. Safe for concurrent use.
type Server struct {
	t testing.TB
	p *redisproc.Proc
}

// Start launches redis-server on a free port and waits until it answers PING.
func Start(t testing.TB) *Server {
	t.Helper()
	p, err := redisproc.Start(false)
	if err != nil {
		t.Fatalf("%v (run `make test`, which installs it)", err)
	}
	s := &Server{t: t, p: p}
	t.Cleanup(s.Stop)
	return s
}

// StartWith is Start with more redis-server arguments (for example
// "--maxmemory", "64mb"; or "--dir", a directory for the RDB file, so a
// Restart loads what SAVE wrote there: a Redis restored from an older
// snapshot).
func StartWith(t testing.TB, args ...string) *Server {
	t.Helper()
	p, err := redisproc.StartWith(args...)
	if err != nil {
		t.Fatalf("%v (run `make test`, which installs it)", err)
	}
	s := &Server{t: t, p: p}
	t.Cleanup(s.Stop)
	return s
}

// StartTLS launches redis-server serving TLS only, with the server
// certificate and key in certFile and keyFile, requiring client
// certificates from the CA in caFile when clientAuth; client is what the
// start-up check dials with. Client returns a plaintext client: use
// go-redis with a TLS configuration of the test's own. A redis-server
// built without TLS skips the test, saying so.
func StartTLS(t testing.TB, client *tls.Config, certFile, keyFile, caFile string, clientAuth bool) *Server {
	t.Helper()
	p, err := redisproc.StartTLS(client, certFile, keyFile, caFile, clientAuth)
	if err != nil && strings.Contains(err.Error(), "Bad directive") {
		// A redis-server built without TLS (BUILD_TLS=no) knows no
		// tls-port; Debian's and the official images' know it.
		t.Skipf("redis-server has no TLS support, so the TLS test cannot run: %v", err)
	}
	if err != nil {
		t.Fatalf("%v (run `make test`, which installs it)", err)
	}
	s := &Server{t: t, p: p}
	t.Cleanup(s.Stop)
	return s
}

// Addr is host:port of the server; it stays the same across Stop/Restart.
func (s *Server) Addr() string { return s.p.Addr() }

// Client returns a go-redis client for the server, closed at cleanup.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: time.Second})
	s.t.Cleanup(func() { c.Close() })
	return c
}

// Stop kills the server (as a crash would: no save, no goodbye). Idempotent.
func (s *Server) Stop() { s.p.Stop() }

// Pause stops the server (SIGSTOP): it answers nothing until Resume.
func (s *Server) Pause() {
	s.t.Helper()
	if err := s.p.Pause(); err != nil {
		s.t.Fatal(err)
	}
}

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() {
	s.t.Helper()
	if err := s.p.Resume(); err != nil {
		s.t.Fatal(err)
	}
}

// Restart starts the server again on the same port: empty, or with what
// the last SAVE wrote when it was started with a "--dir".
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.p.Restart(); err != nil {
		s.t.Fatal(err)
	}
}

// Dump returns every key of the server with its type and value, as a sorted,
// printable string, so tests can assert that an operation changed nothing.
// TTLs are left out: they tick down by themselves.
func Dump(ctx context.Context, c *redis.Client) (string, error) {
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		return "", err
	}
	sortStrings(keys)
	var b strings.Builder
	for _, k := range keys {
		typ, err := c.Type(ctx, k).Result()
		if err != nil {
			return "", err
		}
		var v any
		switch typ {
		case "string":
			v, err = c.Get(ctx, k).Result()
		case "hash":
			var m map[string]string
			m, err = c.HGetAll(ctx, k).Result()
			v = sortedMap(m)
		case "zset":
			v, err = c.ZRangeWithScores(ctx, k, 0, -1).Result()
		case "set":
			var m []string
			m, err = c.SMembers(ctx, k).Result()
			sortStrings(m)
			v = m
		case "list":
			v, err = c.LRange(ctx, k, 0, -1).Result()
		}
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "%s (%s) = %v\n", k, typ, v)
	}
	return b.String(), nil
}

// StartCluster runs an n-node Redis Cluster (no replicas) of real
// redis-server processes and returns the node addresses once the cluster
// reports ok. Everything is stopped at cleanup.
func StartCluster(t testing.TB, n int) []string {
	t.Helper()
	var addrs []string
	for _, p := range StartClusterProcs(t, n) {
		addrs = append(addrs, p.Addr())
	}
	return addrs
}

// StartClusterProcs is StartCluster, returning the node processes (to
// pause or stop one) in the order of their addresses; args are more
// redis-server arguments for every node (e.g. "--cluster-require-full-coverage", "no").
func StartClusterProcs(t testing.TB, n int, args ...string) []*redisproc.Proc {
	t.Helper()
	dir := t.TempDir()
	var addrs []string
	var procs []*redisproc.Proc
	for i := range n {
		p, err := redisproc.StartWith(append([]string{"--cluster-enabled", "yes",
			"--cluster-config-file", fmt.Sprintf("%s/nodes-%d.conf", dir, i), "--cluster-node-timeout", "2000"}, args...)...)
		if err != nil {
			t.Fatalf("%v (run `make test`, which installs it)", err)
		}
		t.Cleanup(p.Stop)
		addrs = append(addrs, p.Addr())
		procs = append(procs, p)
	}
	create := append([]string{"--cluster", "create"}, addrs...)
	create = append(create, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", create...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	// Every node must see the cluster ok (and every slot covered) before a
	// client may rely on any of them.
	deadline := time.Now().Add(20 * time.Second)
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		for {
			info, err := c.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_slots_ok:16384") {
				break
			}
			if time.Now().After(deadline) {
				c.Close()
				t.Fatalf("cluster not ok on %s after 20s: %v\n%s", a, err, info)
			}
			time.Sleep(20 * time.Millisecond) // polling cluster formation with a deadline
		}
		c.Close()
	}
	return procs
}

// KeyCount is the number of keys on one server (a cluster node).
func KeyCount(t testing.TB, addr string) int64 {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	n, err := c.DBSize(context.Background()).Result()
	if err != nil {
		t.Fatalf("dbsize %s: %v", addr, err)
	}
	return n
}

// Image is one key as DUMP serialises it (type, encoding and value,
// byte for byte) and its PTTL in ms (-1 when it has none).
type Image struct {
	Dump string
	PTTL int64
	// expiresNotBefore is the earliest instant, on this process's clock,
	// at which the key can expire by its own TTL: the clock read before
	// PTTL was asked, plus the PTTL less a millisecond of rounding. Zero
	// when the key has no TTL.
	expiresNotBefore time.Time
}

// Snapshot returns every key of the server as DUMP bytes and PTTL, for
// tests that must show an operation changed nothing byte for byte: compare
// two snapshots with Unchanged.
func Snapshot(ctx context.Context, c *redis.Client) (map[string]Image, error) {
	out := map[string]Image{}
	iter := c.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		d, err := c.Dump(ctx, k).Result()
		if err == redis.Nil {
			continue // expired between SCAN and DUMP
		}
		if err != nil {
			return nil, err
		}
		asked := time.Now()
		ttl, err := c.PTTL(ctx, k).Result()
		if err != nil {
			return nil, err
		}
		if ttl == -2 {
			continue // expired between DUMP and PTTL (-2: no such key)
		}
		img := Image{Dump: d, PTTL: -1}
		if ttl >= 0 {
			img.PTTL = ttl.Milliseconds()
			img.expiresNotBefore = asked.Add(ttl - time.Millisecond)
		}
		out[k] = img
	}
	return out, iter.Err()
}

// Unchanged returns nil when after holds the same keys as before with the
// same bytes, and every TTL only ticked down (none set, extended or
// removed); otherwise an error naming the first key that differs. A key
// missing from after counts as removed only if its own TTL could not have
// run out by now (Unchanged is called once after is taken): a key that
// expires between the two snapshots is Redis keeping time, not a change.
func Unchanged(before, after map[string]Image) error {
	keys := make([]string, 0, len(before)+len(after))
	for k := range before {
		keys = append(keys, k)
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			keys = append(keys, k)
		}
	}
	sortStrings(keys)
	for _, k := range keys {
		b, inB := before[k]
		a, inA := after[k]
		switch {
		case !inA && (b.expiresNotBefore.IsZero() || time.Now().Before(b.expiresNotBefore)):
			return fmt.Errorf("key %q was removed", k)
		case !inA:
			// expired by its own TTL
		case !inB:
			return fmt.Errorf("key %q was created", k)
		case a.Dump != b.Dump:
			return fmt.Errorf("key %q changed: %q -> %q", k, b.Dump, a.Dump)
		case (a.PTTL < 0) != (b.PTTL < 0) || a.PTTL > b.PTTL:
			return fmt.Errorf("key %q TTL changed: %d ms -> %d ms", k, b.PTTL, a.PTTL)
		}
	}
	return nil
}
