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
	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/pkg/config"
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
		before, keysBefore := s.View(now), namedKeys(s)
		_, err = s.Sync(ctx, &sluicev1.RegionReport{Region: "a", Seq: 2, Keys: []*sluicev1.KeyDemand{
			{Key: mine, Admitted: 100, WindowMs: 100}, {Key: other, Admitted: 100, WindowMs: 100}}})
		want := fmt.Sprintf("keys[1] %s/write belongs to shard 0 under the shard map (global_shards 3", other.Tenant)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "not to shard 1") {
			t.Fatalf("err = %v, want InvalidArgument containing %q", err, want)
		}
		if after := s.View(now); !reflect.DeepEqual(before, after) || !maps.Equal(keysBefore, namedKeys(s)) {
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

// TestShardTakesKeysItOwnsUnderAnyConfigInPlay: while a region may still
// run the config of another shard count, shard 1 takes a key it owns under
// either count and refuses one it owns under neither; once every region
// runs the new count the old one is out of play and a key shard 1 owned
// only under it is refused.
func TestShardTakesKeysItOwnsUnderAnyConfigInPlay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		three, two := parseConfig(t, loopConfig+"global_shards: 3\n"), parseConfig(t, loopConfig+"global_shards: 2\n")
		src := configtest.NewSource(three, 5)
		s := quietService(t, src)
		s.sh.index = 1
		s.promote(1, time.Now().Add(time.Hour), nil)
		src.Set(two, 6)
		// onlyOld is shard 1's under 3 shards only, onlyNew under 2 only,
		// neither under neither.
		var onlyOld, onlyNew, neither *sluicev1.QuotaKey
		for i := 0; onlyOld == nil || onlyNew == nil || neither == nil; i++ {
			k := quota.Key{Tenant: fmt.Sprintf("t%d", i), Class: "write"}
			qk := &sluicev1.QuotaKey{Tenant: k.Tenant, Class: k.Class}
			switch inOld, inNew := three.ShardMap().Of(k) == 1, two.ShardMap().Of(k) == 1; {
			case inOld && !inNew:
				onlyOld = qk
			case inNew && !inOld:
				onlyNew = qk
			case !inOld && !inNew:
				neither = qk
			}
		}
		seq := map[string]uint64{}
		sync := func(region string, revs []int64, keys ...*sluicev1.QuotaKey) error {
			seq[region]++
			rep := &sluicev1.RegionReport{Region: region, Seq: seq[region], ConfigRevisions: revs}
			for _, k := range keys {
				rep.Keys = append(rep.Keys, &sluicev1.KeyDemand{Key: k, Admitted: 5, WindowMs: 100})
			}
			_, err := s.Sync(t.Context(), rep)
			return err
		}
		// b has not reported: it may run revision 5.
		if err := sync("a", []int64{6}, onlyOld, onlyNew); err != nil {
			t.Fatalf("keys shard 1 owns under one of the counts in play: %v", err)
		}
		if err := sync("a", []int64{6}, onlyNew, neither); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "keys[1]") {
			t.Fatalf("a key shard 1 owns under neither count: %v, want InvalidArgument naming keys[1]", err)
		}
		// Every region runs revision 6: 3 shards are out of play.
		if err := sync("b", []int64{6}); err != nil {
			t.Fatal(err)
		}
		if err := sync("a", []int64{6}, onlyNew, onlyOld); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "keys[1]") {
			t.Fatalf("a key shard 1 owns only under the count out of play: %v, want InvalidArgument naming keys[1]", err)
		}
	})
}

// TestShardOwnsOnlyItsRange: shard 0 of 2 or 3 refuses a key another
// shard owns (it is not the whole global tier); shard 1 under a config of one shard
// refuses every key; and shard 1, while a region may still run
// a config of one shard, refuses a key shard 0 owns under both counts, on
// every try (whatever order it looks at the configs in).
func TestShardOwnsOnlyItsRange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		one, three := parseConfig(t, loopConfig), parseConfig(t, loopConfig+"global_shards: 3\n")
		var ofZero, ofOne *sluicev1.QuotaKey
		for i := 0; ofZero == nil || ofOne == nil; i++ {
			k := quota.Key{Tenant: fmt.Sprintf("t%d", i), Class: "write"}
			switch three.ShardMap().Of(k) {
			case 0:
				ofZero = &sluicev1.QuotaKey{Tenant: k.Tenant, Class: k.Class}
			case 1:
				ofOne = &sluicev1.QuotaKey{Tenant: k.Tenant, Class: k.Class}
			}
		}
		report := func(seq uint64, k *sluicev1.QuotaKey) *sluicev1.RegionReport {
			return &sluicev1.RegionReport{Region: "a", Seq: seq, Keys: []*sluicev1.KeyDemand{{Key: k, Admitted: 5, WindowMs: 100}}}
		}
		for n, cfg := range map[int]*config.Config{2: parseConfig(t, loopConfig+"global_shards: 2\n"), 3: three} {
			var own, other *sluicev1.QuotaKey
			for i := 0; own == nil || other == nil; i++ {
				k := quota.Key{Tenant: fmt.Sprintf("t%d", i), Class: "write"}
				if qk := (&sluicev1.QuotaKey{Tenant: k.Tenant, Class: k.Class}); cfg.ShardMap().Of(k) == 0 {
					own = qk
				} else {
					other = qk
				}
			}
			zero := quietService(t, StaticConfig{C: cfg})
			zero.promote(1, time.Now().Add(time.Hour), nil)
			if _, err := zero.Sync(t.Context(), report(1, own)); err != nil {
				t.Fatalf("shard 0 of %d, its own key: %v", n, err)
			}
			if _, err := zero.Sync(t.Context(), report(2, other)); status.Code(err) != codes.InvalidArgument {
				t.Fatalf("shard 0 of %d, a key of another shard: %v, want InvalidArgument", n, err)
			}
		}

		// A replica serving shard 1 under a config of one shard owns
		// nothing.
		lone := quietService(t, StaticConfig{C: one})
		lone.sh.index = 1
		lone.promote(1, time.Now().Add(time.Hour), nil)
		if _, err := lone.Sync(t.Context(), report(1, ofOne)); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("shard 1 under a config of one shard: %v, want InvalidArgument", err)
		}

		src := configtest.NewSource(one, 5)
		s := quietService(t, src)
		s.sh.index = 1
		s.promote(1, time.Now().Add(time.Hour), nil)
		src.Set(three, 6)
		if _, err := s.Sync(t.Context(), report(1, ofOne)); err != nil {
			t.Fatalf("shard 1, its own key under 3 shards: %v", err)
		}
		for range 20 {
			if _, err := s.Sync(t.Context(), report(2, ofZero)); status.Code(err) != codes.InvalidArgument {
				t.Fatalf("shard 1 with configs of 1 and 3 shards in play, a key of shard 0 under both: %v, want InvalidArgument", err)
			}
		}
	})
}

// TestShardRefusesReportsAddressedToAnother: a region names the shard each
// part of its report is for. Shard 0 of 2 refuses a part addressed to
// shard 1 (an empty one: the region has no key of shard 1) with
// FailedPrecondition naming both shards, by Sync and SyncPage, and
// whether it leads (a standby says so instead of redirecting to its
// leader), changing nothing: taken, that part would have been the region's
// report to shard 0 at its seq, naming none of the keys the region holds
// here. A report that names its shard 0, or no shard (a region built
// before the field), is taken.
func TestShardRefusesReportsAddressedToAnother(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := parseConfig(t, loopConfig+"global_shards: 2\n")
		s, err := newService(serviceOptions{config: StaticConfig{C: cfg}, advertise: "self:7500",
			logger: slog.New(slog.DiscardHandler)}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		s.promote(1, time.Now().Add(time.Hour), nil)
		var mine *sluicev1.QuotaKey
		for i := 0; mine == nil; i++ {
			if k := (quota.Key{Tenant: fmt.Sprintf("t%d", i), Class: "write"}); cfg.ShardMap().Of(k) == 0 {
				mine = &sluicev1.QuotaKey{Tenant: k.Tenant, Class: k.Class}
			}
		}
		ctx := t.Context()
		shard := func(i uint32) *uint32 { return &i }
		if _, err := s.Sync(ctx, &sluicev1.RegionReport{Region: "a", Seq: 1, Shard: shard(0), Keys: []*sluicev1.KeyDemand{
			{Key: mine, Admitted: 100, WindowMs: 100}}}); err != nil {
			t.Fatalf("a report addressed to shard 0: %v", err)
		}
		now := time.Now()
		before, keysBefore := s.View(now), namedKeys(s)
		refused := func(what string, err error) {
			t.Helper()
			want := "report addressed to global shard 1 reached a replica of shard 0"
			if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), want) {
				t.Fatalf("%s: err = %v, want FailedPrecondition containing %q", what, err, want)
			}
			if _, ok := NotLeaderAddr(err); ok {
				t.Fatalf("%s: %v reads as a redirect to a leader", what, err)
			}
			if after := s.View(now); !reflect.DeepEqual(before, after) || !maps.Equal(keysBefore, namedKeys(s)) {
				t.Fatalf("%s: a refused report changed the allocator:\nbefore %+v\nafter  %+v", what, before, after)
			}
			if seq, _ := s.alloc.LastSeq("a"); seq != 1 {
				t.Fatalf("%s: last seq %d after the refusal, want 1", what, seq)
			}
		}
		_, err = s.Sync(ctx, &sluicev1.RegionReport{Region: "a", Seq: 2, Shard: shard(1)})
		refused("Sync", err)
		_, err = s.SyncPage(ctx, &sluicev1.RegionReport{Region: "a", Seq: 2, Shard: shard(1)})
		refused("SyncPage", err)
		_, err = s.SyncPage(ctx, &sluicev1.RegionReport{Region: "a", Seq: 2, Shard: shard(1), Page: 0, Pages: 2,
			Keys: []*sluicev1.KeyDemand{{Key: mine, Admitted: 100, WindowMs: 100}}})
		refused("SyncPage, a page", err)
		s.demote(1)
		_, err = s.Sync(ctx, &sluicev1.RegionReport{Region: "a", Seq: 2, Shard: shard(1)})
		refused("Sync to a standby", err)
		s.promote(2, time.Now().Add(time.Hour), nil)
		for i, rep := range []*sluicev1.RegionReport{
			{Region: "a", Seq: 2, Shard: shard(0), Keys: []*sluicev1.KeyDemand{{Key: mine, Admitted: 100, WindowMs: 100}}},
			{Region: "a", Seq: 3, Keys: []*sluicev1.KeyDemand{{Key: mine, Admitted: 100, WindowMs: 100}}},
		} {
			if _, err := s.Sync(ctx, rep); err != nil {
				t.Fatalf("report %d (shard %v): %v", i, rep.Shard, err)
			}
		}
	})
}
