package shard

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/sluicehq/sluice/pkg/quota"
)

// The hash is part of the wire contract between regions and shards: a
// change would send keys to shards that refuse them.
func TestHashIsPinned(t *testing.T) {
	got := fmt.Sprintf("%#x %#x %#x", Hash(quota.Key{Tenant: "acme", Class: "write"}),
		Hash(quota.Key{Tenant: "a", Class: "bc"}), Hash(quota.Key{Tenant: "ab", Class: "c"}))
	const want = "0x663a905b17a39c40 0x79da3d653c671ba8 0x7f7664c711b06b0"
	if got != want {
		t.Fatalf("hashes = %s, want %s", got, want)
	}
}

func TestOneShardOwnsEverything(t *testing.T) {
	for _, m := range []Map{{}, mustNew(t, 1)} {
		for i := range 1000 {
			k := quota.Key{Tenant: fmt.Sprintf("t%d", i), Class: "write"}
			if m.Of(k) != 0 || m.N() != 1 {
				t.Fatalf("%v: key %v owned by %d", m, k, m.Of(k))
			}
		}
	}
}

func TestRangesCoverTheHashSpaceEvenly(t *testing.T) {
	for _, n := range []int{2, 3, 4, 7, MaxShards} {
		m := mustNew(t, n)
		if m.OfHash(0) != 0 || m.OfHash(math.MaxUint64) != n-1 {
			t.Fatalf("%d shards: ends owned by %d and %d", n, m.OfHash(0), m.OfHash(math.MaxUint64))
		}
		// Ranges are contiguous: the owner never decreases along the space.
		prev := 0
		for i := range uint64(4096) {
			o := m.OfHash(i * (math.MaxUint64 / 4096))
			if o < prev || o >= n {
				t.Fatalf("%d shards: owner %d after %d", n, o, prev)
			}
			prev = o
		}
		counts := make([]int, n)
		const keys = 200000
		for i := range keys {
			counts[m.Of(quota.Key{Tenant: fmt.Sprintf("tenant-%d", i), Class: "read"})]++
		}
		for i, c := range counts {
			want := float64(keys) / float64(n)
			if math.Abs(float64(c)-want) > 6*math.Sqrt(want)+1 {
				t.Fatalf("%d shards: shard %d owns %d keys, want about %.0f", n, i, c, want)
			}
		}
	}
}

func TestBadCountsAreRefused(t *testing.T) {
	for _, n := range []int{0, -1, MaxShards + 1} {
		_, err := New(n)
		if !errors.Is(err, quota.ErrInvalid) {
			t.Fatalf("New(%d) = %v, want ErrInvalid", n, err)
		}
	}
}

// TestNames: shard 0 keeps the unsharded global tier's election and
// lapsed-set names, and every other shard, shard 1 included, has its own
// (two shards sharing an election would elect one leader for both).
func TestNames(t *testing.T) {
	if ElectionName(0) != "global" || LapsedName(0) != "lapsed" {
		t.Fatal("shard 0 must keep the unsharded global tier's names")
	}
	for _, i := range []int{1, 3, MaxShards - 1} {
		e, l := ElectionName(i), LapsedName(i)
		if want := fmt.Sprintf("global-shard-%d", i); e != want {
			t.Fatalf("ElectionName(%d) = %q, want %q", i, e, want)
		}
		if want := fmt.Sprintf("lapsed-shard-%d", i); l != want {
			t.Fatalf("LapsedName(%d) = %q, want %q", i, l, want)
		}
	}
}

func TestSplitKeepsOrder(t *testing.T) {
	m := mustNew(t, 3)
	var keys []quota.Key
	for i := range 50 {
		keys = append(keys, quota.Key{Tenant: fmt.Sprintf("t%d", i), Class: "c"})
	}
	parts := m.Split(keys)
	if len(parts) != m.N() {
		t.Fatalf("Split into %d parts, want one per shard (%d)", len(parts), m.N())
	}
	seen := 0
	for i, p := range parts {
		for j, x := range p {
			if m.Of(keys[x]) != i || (j > 0 && p[j-1] >= x) {
				t.Fatalf("part %d: %v", i, p)
			}
			seen++
		}
	}
	if seen != len(keys) {
		t.Fatalf("split %d keys into %d", len(keys), seen)
	}
}

func mustNew(t *testing.T, n int) Map {
	t.Helper()
	m, err := New(n)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestOwnsIsTheOwner: shard i owns a key exactly when Of names it, so no
// key is served by two shards or by none.
func TestOwnsIsTheOwner(t *testing.T) {
	for _, n := range []int{1, 3} {
		m := mustNew(t, n)
		for j := range 100 {
			k := quota.Key{Tenant: fmt.Sprintf("t%d", j), Class: "write"}
			owners := 0
			for i := range n {
				if m.Owns(i, k) {
					owners++
					if i != m.Of(k) {
						t.Fatalf("%v: shard %d owns %v, Of says %d", m, i, k, m.Of(k))
					}
				}
			}
			if owners != 1 {
				t.Fatalf("%v: %v has %d owners", m, k, owners)
			}
		}
	}
	var zero Map
	if zero.String() != "1 shard" || mustNew(t, 1).String() != "1 shard" || mustNew(t, 2).String() != "2 shards" || mustNew(t, 3).String() != "3 shards" {
		t.Fatalf("names: %q %q %q %q", zero.String(), mustNew(t, 1).String(), mustNew(t, 2).String(), mustNew(t, 3).String())
	}
}

// TestCountsOneTo256: the documented range of global_shards, in numbers:
// 1 and 256 are accepted (and make maps of that many shards), 0 and 257
// are refused.
func TestCountsOneTo256(t *testing.T) {
	for _, tc := range []struct {
		n  int
		ok bool
	}{{0, false}, {1, true}, {2, true}, {255, true}, {256, true}, {257, false}} {
		m, err := New(tc.n)
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, quota.ErrInvalid)) {
			t.Fatalf("New(%d) = %v, want ok=%v", tc.n, err, tc.ok)
		}
		if tc.ok && m.N() != tc.n {
			t.Fatalf("New(%d).N() = %d", tc.n, m.N())
		}
	}
}
