package lease

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/rapidfuzz"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestTableKeepsItsPromisesUnderAnyInterleaving drives a Table with random
// interleavings of what the Client does (decisions, acquires, refills,
// periodic Syncs and releases, answers that grant any amount with any TTL,
// lost answers, time passing, expiry, the clock landing exactly on a
// deadline or on the end of a wait the region asked for) and checks the package's invariants
// after every step, per key:
//
//   - a token is spent only strictly before the latest deadline any answer
//     gave it (the send time of its request + its TTL), and only from
//     tokens granted: admitted + pool <= granted;
//   - the table's own count of admissions is exact;
//   - a report is either new, with a seq above every earlier one of its
//     key, or an unanswered one resent byte for byte;
//   - a report never says more was used than was admitted, nor more was
//     used and returned than was granted;
//   - over quota is a decision: Allow never fails on a valid request, and
//     a denial has a time to retry after unless no wait can cure it.
func TestTableKeepsItsPromisesUnderAnyInterleaving(t *testing.T) {
	rapid.Check(t, tablePromises(t))
}

// tablePromises is the property of TestTableKeepsItsPromisesUnderAnyInterleaving,
// its tables built on t.
func tablePromises(t *testing.T) func(*rapid.T) {
	return func(rt *rapid.T) {
		tb := newTestTable(t, func(o *TableOptions) { o.IdleTimeout = 3 * time.Second })
		keys := []quota.Key{kR, kW}
		now := t0
		var inflight []*Batch
		lastSeq := map[quota.Key]uint64{}
		sent := map[uint64]*sluicev1.KeyReport{} // by seq: every report sent
		answered := map[uint64]bool{}
		granted := map[quota.Key]int64{}
		admitted := map[quota.Key]int64{}
		spent := map[quota.Key]int64{} // admissions since the table made the key
		deadline := map[quota.Key]time.Time{}

		send := func(b *Batch) {
			if b == nil {
				return
			}
			for i, r := range b.Reports {
				key := quota.Key{Tenant: r.Key.GetTenant(), Class: r.Key.GetClass()}
				if k := b.Keys()[i]; k != key {
					rt.Fatalf("report %d names %s, its entry %s", i, key, k)
				}
				if old, ok := sent[r.Seq]; ok {
					if answered[r.Seq] || !proto.Equal(old, r) {
						rt.Fatalf("seq %d sent again (answered %v):\n%v\nwas\n%v", r.Seq, answered[r.Seq], r, old)
					}
				} else {
					if r.Seq <= lastSeq[key] {
						rt.Fatalf("new report of %s with seq %d after seq %d", key, r.Seq, lastSeq[key])
					}
					lastSeq[key] = r.Seq
					sent[r.Seq] = proto.Clone(r).(*sluicev1.KeyReport)
				}
				if r.Used > admitted[key] || r.Used+r.Returned > granted[key] || r.Used < 0 || r.Returned < 0 || r.Want < 0 || r.Min < 0 {
					rt.Fatalf("report %v of %s: admitted %d, granted %d", r, key, admitted[key], granted[key])
				}
			}
			inflight = append(inflight, b)
		}
		check := func(what string) {
			for _, key := range keys {
				st, ok := tb.State(key)
				if !ok {
					spent[key] = 0
					continue
				}
				if st.Spent != spent[key] {
					rt.Fatalf("%s: %s counts %d admitted, %d were", what, key, st.Spent, spent[key])
				}
				if st.Tokens < 0 || admitted[key]+st.Tokens > granted[key] {
					rt.Fatalf("%s: %s holds %d tokens after admitting %d of %d granted", what, key, st.Tokens, admitted[key], granted[key])
				}
			}
		}

		rt.Repeat(map[string]func(*rapid.T){
			"allow": func(rt *rapid.T) {
				key := rapid.SampledFrom(keys).Draw(rt, "key")
				cost := rapid.Int64Range(1, 4).Draw(rt, "cost")
				d, act, err := tb.Allow(now, key, cost)
				if err != nil {
					rt.Fatalf("Allow(%s, %d): %v", key, cost, err)
				}
				if !d.Allowed && act == ActNone && !d.RetryNever && d.RetryAfter <= 0 {
					rt.Fatalf("%s denied with nothing to wait for: %+v", key, d)
				}
				if d.Allowed && !d.Degraded {
					if !now.Before(deadline[key]) {
						rt.Fatalf("%s admitted at %v, its latest deadline %v", key, now.Sub(t0), deadline[key].Sub(t0))
					}
					admitted[key] += cost
					spent[key] += cost
				}
				switch act {
				case ActAcquire:
					b, _ := tb.PrepareAcquire(now, key, cost)
					send(b)
				case ActRefill:
					send(tb.PrepareRefill(now))
				}
				check("allow")
			},
			"sync": func(rt *rapid.T) {
				syncs, release := tb.PrepareSync(now)
				for _, b := range syncs {
					send(b)
				}
				if release != nil {
					send(release)
				}
				check("sync")
			},
			"answer": func(rt *rapid.T) {
				if len(inflight) == 0 {
					rt.Skip("nothing in flight")
				}
				i := rapid.IntRange(0, len(inflight)-1).Draw(rt, "which")
				b := inflight[i]
				inflight = append(inflight[:i], inflight[i+1:]...)
				if rapid.Bool().Draw(rt, "lost") {
					tb.Failed(now, b)
					check("failed")
					return
				}
				ttl := rapid.SampledFrom([]time.Duration{time.Second, testTTL}).Draw(rt, "ttl")
				grants := make([]*sluicev1.Grant, len(b.Reports))
				for j, r := range b.Reports {
					n := rapid.Int64Range(0, r.Want).Draw(rt, fmt.Sprintf("granted%d", j))
					grants[j] = regionGrant(r, n, func(g *sluicev1.Grant) {
						g.TtlMs = ttl.Milliseconds()
						if n == 0 {
							g.RetryAfterMs = rapid.SampledFrom([]int64{0, 50, -1}).Draw(rt, "retry")
						}
					})
					key := quota.Key{Tenant: r.Key.GetTenant(), Class: r.Key.GetClass()}
					granted[key] += n
					if end := b.SentAt().Add(ttl); end.After(deadline[key]) {
						deadline[key] = end
					}
					answered[r.Seq] = true
				}
				if err := tb.Apply(now, b, grants); err != nil {
					rt.Fatalf("Apply: %v", err)
				}
				check("apply")
			},
			// The instants where decisions change: a deadline, the end of a
			// wait the region asked for. The clock lands on them exactly,
			// and nothing expires the key first (the owner may be late).
			"edge": func(rt *rapid.T) {
				key := rapid.SampledFrom(keys).Draw(rt, "key")
				st, _ := tb.State(key)
				at := rapid.SampledFrom([]time.Time{deadline[key], st.Deadline, st.NegUntil}).Draw(rt, "edge")
				if !at.After(now) {
					rt.Skip("the instant has passed")
				}
				now = at
			},
			"wait": func(rt *rapid.T) {
				now = now.Add(time.Duration(rapid.IntRange(0, 2000).Draw(rt, "ms")) * time.Millisecond)
				tb.Expire(now)
				check("expire")
			},
		})
	}
}

// FuzzTableKeepsItsPromises searches tablePromises with the fuzzer choosing
// every step (allow, sync, answer, an edge of a deadline, a wait) and value.
func FuzzTableKeepsItsPromises(f *testing.F) {
	rapidfuzz.AddSeeds(f, 32, 1<<16)
	f.Fuzz(rapidfuzz.Target(tablePromises))
}
