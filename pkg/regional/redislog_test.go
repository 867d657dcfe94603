package regional_test

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/regional"
)

// recordsHandler keeps the records logged through it.
type recordsHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *recordsHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordsHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *recordsHandler) WithGroup(string) slog.Handler            { return h }
func (h *recordsHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}

func (h *recordsHandler) all() []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]slog.Record(nil), h.records...)
}

// TestRedisClientLogsAreSlogRecords: a line the Redis client library logs
// itself (here: a dial refused after its retries, by a Redis that is gone)
// arrives as a DEBUG slog record of the daemon's logger, with the
// library's text in "line", not as an unstructured line on stderr.
func TestRedisClientLogsAreSlogRecords(t *testing.T) {
	h := &recordsHandler{}
	regional.RouteRedisLogs(slog.New(h))
	t.Cleanup(func() { regional.RouteRedisLogs(slog.New(slog.NewTextHandler(os.Stderr, nil))) })

	rs := redistest.Start(t)
	addr := rs.Addr()
	rs.Stop() // every dial is refused from now on
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err == nil {
		t.Fatal("a ping to a stopped Redis succeeded")
	}
	var lines []string
	for _, r := range h.all() {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "line" && r.Message == "redis client" && r.Level == slog.LevelDebug {
				lines = append(lines, a.Value.String())
			}
			return true
		})
	}
	found := false
	for _, l := range lines {
		if strings.Contains(l, "failed to dial") && !strings.HasPrefix(l, "redis: ") {
			found = true
		}
	}
	if !found {
		t.Fatalf("no DEBUG record \"redis client\" with the library's failed dial in its line; records: %v", lines)
	}
}
