package regional

import (
	"fmt"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/pkg/config"
)

// TestRetiredShardMapKeptOneValidityAndOneEpoch: a shard map the chain
// drops (the count's change confirmed) stays in play, its shards' leases
// read, for exactly one grant validity and one epoch of the config that
// dropped it: grants issued under it may still be in force until then.
func TestRetiredShardMapKeptOneValidityAndOneEpoch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		parse := func(shards int) *config.Config {
			c, err := config.Parse(fmt.Appendf(nil, `
epoch: 100ms
grant_validity: 700ms
global_shards: %d
regions: {eu: {weight: 1}}
classes: {write: {mode: lease}}
tiers: {free: {write: {rate: 100/s, burst: 100}}}
default_tier: free
`, shards))
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		src := configtest.NewSource(parse(3), 1)
		rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
		defer rdb.Close()
		s, err := New(Options{Region: "eu", Redis: rdb, Config: src, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		counts := func() []int {
			var out []int
			for _, m := range s.shardMaps() {
				out = append(out, m.N())
			}
			return out
		}
		// 3 -> 2 shards at revision 2: both maps in play while the region
		// runs both configs.
		src.Set(parse(2), 2)
		s.staticChain()
		if got := fmt.Sprint(counts()); got != "[2 3]" {
			t.Fatalf("maps in play while both configs run: %s, want [2 3]", got)
		}
		if got := s.shardsInPlay(); got != 3 {
			t.Fatalf("shards in play %d, want 3", got)
		}
		// Revision 2 confirmed: the chain drops revision 1, and its map is
		// retired from now on.
		s.confirm(2)
		retired := time.Now() // the bubble's clock stands still until the test sleeps
		keep := time.Duration(src.Current().GrantValidity + src.Current().Epoch)
		for _, at := range []struct {
			after time.Duration
			want  string
		}{
			{0, "[2 3]"},
			{keep - time.Duration(src.Current().Epoch), "[2 3]"},
			{keep - time.Nanosecond, "[2 3]"},
			{keep, "[2]"},
			{2 * keep, "[2]"},
		} {
			time.Sleep(at.after - time.Since(retired))
			if got := fmt.Sprint(counts()); got != at.want {
				t.Fatalf("%v after the map of 3 was retired (keep %v): maps in play %s, want %s", at.after, keep, got, at.want)
			}
		}
		if got := s.shardsInPlay(); got != 2 {
			t.Fatalf("shards in play %d once the retired map expired, want 2", got)
		}
	})
}
