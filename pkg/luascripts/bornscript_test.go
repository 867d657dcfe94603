package luascripts

import (
	"reflect"
	"testing"

	"github.com/sluicehq/sluice/pkg/quota"
)

// TestBornScriptCases runs born.lua on every combination that decides its
// answer: the sentinel present or missing, the generation present or
// missing, the caller's generation below, at or above the stored one, and
// the trust of a first look. A present sentinel is kept unless the data set
// went back in time (its generation below the one seen, or missing while
// one was seen, even 1: the first a sentinel with no generation gets from
// a saved bucket); then it is born again now, trusted or not. A sentinel
// written takes the generation past the highest of the stored and the seen
// one by GenJump. A kept one writes nothing, and answers a missing
// generation as 0, which a later call passes back as "none seen".
func TestBornScriptCases(t *testing.T) {
	const missing = -1
	const b0 = 1_700_000_000_000_000 // a stored birth, before the twin's now
	for _, tc := range []struct {
		name           string
		born, gen      int64 // stored (missing: no key)
		trust          string
		seen           int64
		want           func(now int64) []any
		wantBorn, wGen func(now int64) int64 // stored afterwards (missing: no key)
	}{
		{"first look, dated", missing, missing, "0", 0,
			func(now int64) []any { return []any{now, int64(1), int64(GenJump), int64(0)} },
			func(now int64) int64 { return now }, func(int64) int64 { return GenJump }},
		{"first look, trusted full", missing, missing, "1", 0,
			func(int64) []any { return []any{int64(0), int64(1), int64(GenJump), int64(0)} },
			func(int64) int64 { return 0 }, func(int64) int64 { return GenJump }},
		{"lost sentinel, generation kept above the seen one", missing, 7, "0", 5,
			func(now int64) []any { return []any{now, int64(1), int64(7 + GenJump), int64(0)} },
			func(now int64) int64 { return now }, func(int64) int64 { return 7 + GenJump }},
		{"lost sentinel, generation below the seen one", missing, 5, "1", 9,
			func(int64) []any { return []any{int64(0), int64(1), int64(9 + GenJump), int64(0)} },
			func(int64) int64 { return 0 }, func(int64) int64 { return 9 + GenJump }},
		{"kept: the generation seen", b0, 7, "0", 7,
			func(int64) []any { return []any{int64(b0), int64(0), int64(7), int64(0)} },
			func(int64) int64 { return b0 }, func(int64) int64 { return 7 }},
		{"kept: a generation above the seen one", b0, 7, "1", 6,
			func(int64) []any { return []any{int64(b0), int64(0), int64(7), int64(0)} },
			func(int64) int64 { return b0 }, func(int64) int64 { return 7 }},
		{"kept: no generation, none seen", b0, missing, "0", 0,
			func(int64) []any { return []any{int64(b0), int64(0), int64(0), int64(0)} },
			func(int64) int64 { return b0 }, func(int64) int64 { return missing }},
		{"gone back: generation below the seen one", b0, 7, "0", 8,
			func(now int64) []any { return []any{now, int64(1), int64(8 + GenJump), int64(1)} },
			func(now int64) int64 { return now }, func(int64) int64 { return 8 + GenJump }},
		{"gone back: no generation while one was seen", b0, missing, "0", 3,
			func(now int64) []any { return []any{now, int64(1), int64(3 + GenJump), int64(1)} },
			func(now int64) int64 { return now }, func(int64) int64 { return 3 + GenJump }},
		{"gone back: no generation while the first one was seen", b0, missing, "1", 1,
			func(now int64) []any { return []any{now, int64(1), int64(1 + GenJump), int64(1)} },
			func(now int64) int64 { return now }, func(int64) int64 { return 1 + GenJump }},
		{"gone back from a trusted birth, trusted again: born now", 0, 4, "1", 9,
			func(now int64) []any { return []any{now, int64(1), int64(9 + GenJump), int64(1)} },
			func(now int64) int64 { return now }, func(int64) int64 { return 9 + GenJump }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newTwin(t)
			k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
			for key, v := range map[string]int64{k.Born: tc.born, k.Gen: tc.gen} {
				if v != missing {
					if err := w.rdb.Set(w.ctx, key, itoa(v), 0).Err(); err != nil {
						t.Fatal(err)
					}
				}
			}
			res, err := w.sc.born.Run(w.ctx, w.rdb, []string{k.Born, k.Gen}, tc.trust, tc.seen, w.now).Slice()
			if want := tc.want(w.now); err != nil || !reflect.DeepEqual(res, want) {
				t.Fatalf("born.lua: %v, %v; want %v", res, err, want)
			}
			for key, want := range map[string]int64{k.Born: tc.wantBorn(w.now), k.Gen: tc.wGen(w.now)} {
				v, err := w.rdb.Get(w.ctx, key).Result()
				if want == missing {
					if err == nil {
						t.Fatalf("%s holds %q after the call, want it missing", key, v)
					}
					continue
				}
				if err != nil || v != itoa(want) {
					t.Fatalf("%s holds %q (%v) after the call, want %d", key, v, err, want)
				}
			}
		})
	}
}
