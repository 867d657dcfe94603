package luascripts

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestPipelinedScriptsCarryTheConnectionsError: a pipeline whose
// connection Redis refused (a wrong password) gives its calls that error;
// they had none and no reply, and were read as "redis: unexpected
// type=<nil> for Slice", which said nothing of the password.
func TestPipelinedScriptsCarryTheConnectionsError(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	if err := srv.Client().ConfigSet(ctx, "requirepass", "right").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: "wrong", MaxRetries: -1})
	defer c.Close()
	_, err := New().StampBorn(ctx, c, BornKeys(DefaultPrefix, false), false)
	if err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("err %v, want Redis's WRONGPASS", err)
	}
}
