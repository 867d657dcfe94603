package regional

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/redis/go-redis/v9"
)

// RouteRedisLogs sends the Redis client library's own log lines (a dial
// that failed after its retries, a connection a pool hook refused) to
// logger at DEBUG, as records with the message "redis client" and the
// library's text in "line". Left alone, the library writes them to stderr
// unstructured, one per failed dial while Redis is down; the daemon logs
// the outage itself at WARN. The library's logger is process-wide: a
// daemon calls this once, at start.
func RouteRedisLogs(logger *slog.Logger) { redis.SetLogger(redisLog{logger}) }

// redisLog is the library's logging interface over a slog.Logger.
type redisLog struct{ l *slog.Logger }

func (r redisLog) Printf(ctx context.Context, format string, v ...any) {
	if ctx == nil {
		ctx = context.Background()
	}
	if !r.l.Enabled(ctx, slog.LevelDebug) {
		return
	}
	line := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	r.l.DebugContext(ctx, "redis client", "line", line)
}
