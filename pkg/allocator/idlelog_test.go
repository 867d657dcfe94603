package allocator

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/internal/configtest"
)

// TestShardOutsideTheConfigSaysSo: a replica of a shard the live config
// leaves out (started ahead of a raise of global_shards, or with a -shard
// the config does not count) says at its election that it owns no keys,
// naming the count; raised to include it, it owns keys; lowered again, it
// says it owns none under the new count.
func TestShardOutsideTheConfigSaysSo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := configtest.NewSource(parseConfig(t, loopConfig+"global_shards: 2\n"), 1)
		s, logs := loggedService(t, src)
		s.sh.index = 2
		s.promote(1, time.Now().Add(time.Hour), nil)
		const out = `msg="this shard owns no keys under the live config: no region reports to it until global_shards includes it" shard=2 shards=2`
		if logs.Count(out) != 1 {
			t.Fatalf("shard 2 of a 2-shard config, elected, did not say it owns no keys:\n%s", logs)
		}
		src.Next(parseConfig(t, loopConfig+"global_shards: 3\n"))
		s.step(time.Now())
		if !strings.Contains(logs.String(), "this shard owns keys from now on") {
			t.Fatalf("raised to 3 shards, shard 2 did not say it owns keys:\n%s", logs)
		}
		src.Next(parseConfig(t, loopConfig+"global_shards: 2\n"))
		s.step(time.Now())
		const removed = `msg="this shard owns no keys under the new count: regions still running the old one report to it until they adopt it; stop its replicas afterwards" shard=2 shards=2`
		if logs.Count(removed) != 1 {
			t.Fatalf("lowered to 2 shards, shard 2 did not say it owns no keys:\n%s", logs)
		}
	})
}
