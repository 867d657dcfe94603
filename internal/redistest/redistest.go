// Package redistest starts real redis-server processes for tests.
//
// Each Server is its own process on a free loopback port with persistence
// off, killed by t.Cleanup. Tests that need Redis call Start; when
// redis-server is not on PATH the test fails with a message that says how to
// install it (make test installs it), so a missing dependency is never
// mistaken for a pass.
package redistest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is one redis-server process. Safe for concurrent use.
type Server struct {
	t    testing.TB
	port int

	mu  sync.Mutex // guards cmd
	cmd *exec.Cmd
}

// Start launches redis-server on a free port and waits until it answers PING.
func Start(t testing.TB) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server is not on PATH (run `make test`, which installs it, or apt-get install redis-server): %v", err)
	}
	s := &Server{t: t, port: freePort(t)}
	s.start()
	t.Cleanup(s.Stop)
	return s
}

// Addr is host:port of the server; it stays the same across Stop/Restart.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Client returns a go-redis client for the server, closed at cleanup.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: time.Second})
	s.t.Cleanup(func() { c.Close() })
	return c
}

// Stop kills the server (as a crash would: no save, no goodbye). Idempotent.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	s.cmd.Wait()
	s.cmd = nil
}

// Restart starts an empty server on the same port again.
func (s *Server) Restart() {
	s.Stop()
	s.start()
}

func (s *Server) start() {
	s.t.Helper()
	cmd := exec.Command("redis-server",
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--protected-mode", "no",
		"--loglevel", "warning")
	out, err := cmd.StdoutPipe()
	if err != nil {
		s.t.Fatalf("redis-server pipe: %v", err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	var logMu sync.Mutex
	var log strings.Builder
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			logMu.Lock()
			log.WriteString(sc.Text() + "\n")
			logMu.Unlock()
		}
	}()
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()

	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			logMu.Lock()
			defer logMu.Unlock()
			s.t.Fatalf("redis-server on %s did not answer PING within 10s: %v\n%s", s.Addr(), err, log.String())
		}
		time.Sleep(5 * time.Millisecond) // polling a process start-up with a deadline
	}
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
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
