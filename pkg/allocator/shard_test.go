package allocator

import (
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestShardRefusesKeysItDoesNotOwn: shard 1 of 3 answers a report of its
// own keys, and refuses one that also names a key shard 0 owns with
// InvalidArgument naming the shard map, changing nothing (its View and
// tracked keys at the same instant are as before, the region's seq is not
// taken).
func TestShardRefusesKeysItDoesNotOwn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := parseConfig(t, loopConfig+"global_shards: 3\n")
		s, err := newService(serviceOptions{config: StaticConfig{C: cfg}, advertise: "self:7500",
			logger: slog.New(slog.DiscardHandler)}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		s.sh.index = 1
		s.promote(1, time.Now().Add(time.Hour), nil)
		m := cfg.ShardMap()
		var mine, other *sluicev1.QuotaKey
		for i := 0; mine == nil || other == nil; i++ {
			k := quota.Key{Tenant: fmt.Sprintf("t%d", i), Class: "write"}
			switch m.Of(k) {
			case 1:
				mine = &sluicev1.QuotaKey{Tenant: k.Tenant, Class: k.Class}
			case 0:
				other = &sluicev1.QuotaKey{Tenant: k.Tenant, Class: k.Class}
			}
		}
		ctx := t.Context()
		if _, err := s.Sync(ctx, &sluicev1.RegionReport{Region: "a", Seq: 1, Keys: []*sluicev1.KeyDemand{
			{Key: mine, Admitted: 100, WindowMs: 100}}}); err != nil {
			t.Fatalf("a report of shard 1's own key: %v", err)
		}
		now := time.Now()
		before, keysBefore := s.View(now), maps.Clone(s.keys)
		_, err = s.Sync(ctx, &sluicev1.RegionReport{Region: "a", Seq: 2, Keys: []*sluicev1.KeyDemand{
			{Key: mine, Admitted: 100, WindowMs: 100}, {Key: other, Admitted: 100, WindowMs: 100}}})
		want := fmt.Sprintf("keys[1] %s/write belongs to shard 0 under the shard map (global_shards 3", other.Tenant)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "not to shard 1") {
			t.Fatalf("err = %v, want InvalidArgument containing %q", err, want)
		}
		if after := s.View(now); !reflect.DeepEqual(before, after) || !maps.Equal(keysBefore, s.keys) {
			t.Fatalf("a refused report changed the allocator:\nbefore %+v\nafter  %+v", before, after)
		}
		if seq, _ := s.alloc.LastSeq("a"); seq != 1 {
			t.Fatalf("last seq %d after the refusal, want 1", seq)
		}
	})
}

// TestOneShardTakesEveryKey: with global_shards left out, shard 0 is the
// whole global tier, as before shards.
func TestOneShardTakesEveryKey(t *testing.T) {
	s, err := newService(serviceOptions{config: StaticConfig{C: parseConfig(t, loopConfig)}, advertise: "self:7500",
		logger: slog.New(slog.DiscardHandler)}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	s.promote(1, time.Now().Add(time.Hour), nil)
	var keys []*sluicev1.KeyDemand
	for i := range 50 {
		keys = append(keys, &sluicev1.KeyDemand{Key: &sluicev1.QuotaKey{Tenant: fmt.Sprintf("t%d", i), Class: "write"}, WindowMs: 100})
	}
	if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: "a", Seq: 1, Keys: keys}); err != nil {
		t.Fatal(err)
	}
	if LapsedKeyOf("/sl", 0) != "/sl/global/lapsed" || LapsedKeyOf("/sl", 2) != "/sl/global/lapsed-shard-2" {
		t.Fatalf("lapsed keys: %s %s", LapsedKeyOf("/sl", 0), LapsedKeyOf("/sl", 2))
	}
}
