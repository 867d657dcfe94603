package redistest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestUnchangedTellsExpiryFromRemoval pins what Unchanged calls a change
// on a real redis-server: a key that runs out of TTL between the two
// snapshots is not one (the fuzz tests that compare snapshots around a
// refused request otherwise fail on Redis keeping time), but a key
// deleted, written or given a longer TTL is, whether or not it has a TTL.
func TestUnchangedTellsExpiryFromRemoval(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client()
	snapshot := func() map[string]redistest.Image {
		t.Helper()
		s, err := redistest.Snapshot(ctx, rdb)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	mustDo := func(args ...any) {
		t.Helper()
		if err := rdb.Do(ctx, args...).Err(); err != nil {
			t.Fatal(err)
		}
	}

	mustDo("SET", "short", "v", "PX", 50)
	mustDo("SET", "long", "v", "EX", 3600)
	mustDo("SET", "forever", "v")
	before := snapshot()
	if len(before) != 3 {
		t.Fatalf("snapshot holds %d keys, want 3", len(before))
	}
	// Wait for the short key to expire (Redis's clock, not a guess).
	for deadline := time.Now().Add(10 * time.Second); ; {
		n, err := rdb.Exists(ctx, "short").Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a key with a 50 ms TTL still exists after 10 s")
		}
	}
	if err := redistest.Unchanged(before, snapshot()); err != nil {
		t.Fatalf("a key expiring by its own TTL counted as a change: %v", err)
	}

	for _, tc := range []struct {
		name, want string
		change     []any
	}{
		{"a key with a long TTL deleted", `key "long" was removed`, []any{"DEL", "long"}},
		{"a key without a TTL deleted", `key "forever" was removed`, []any{"DEL", "forever"}},
		{"a key written", `key "forever" changed`, []any{"SET", "forever", "w"}},
		{"a key created", `key "new" was created`, []any{"SET", "new", "v"}},
		{"a TTL extended", `key "long" TTL changed`, []any{"EXPIRE", "long", 7200}},
		{"a TTL set", `key "forever" TTL changed`, []any{"EXPIRE", "forever", 7200}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mustDo("FLUSHALL")
			mustDo("SET", "long", "v", "EX", 3600)
			mustDo("SET", "forever", "v")
			before := snapshot()
			mustDo(tc.change...)
			err := redistest.Unchanged(before, snapshot())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Unchanged = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// goneAfterDump deletes a key once a DUMP of it has been answered, as if
// its TTL ran out right then, from a client of its own.
type goneAfterDump struct{ other *redis.Client }

func (goneAfterDump) DialHook(next redis.DialHook) redis.DialHook { return next }
func (goneAfterDump) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h goneAfterDump) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == "dump" && err == nil {
			if derr := h.other.Del(ctx, cmd.Args()[1].(string)).Err(); derr != nil {
				return derr
			}
		}
		return err
	}
}

// TestSnapshotLeavesOutAKeyGoneAfterItsDump: a key that expires between
// Snapshot's DUMP and PTTL of it is left out, as one gone before its DUMP
// is (it was taken for a key without a TTL, and Unchanged then called its
// expiry a TTL removed).
func TestSnapshotLeavesOutAKeyGoneAfterItsDump(t *testing.T) {
	ctx := context.Background()
	rs := redistest.Start(t)
	rdb := rs.Client()
	if err := rdb.Set(ctx, "k", "v", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	rdb.AddHook(goneAfterDump{other: rs.Client()})
	s, err := redistest.Snapshot(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	if img, ok := s["k"]; ok {
		t.Fatalf("a key gone after its DUMP is in the snapshot: %+v", img)
	}
}
