package luascripts

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestRolledBackDataSetHandsOutNoFreeBurst: three instances saturate one
// key (20/s, burst 40) through the production scripts on a real Redis;
// the data set then goes back 1.5s in time while leases taken since are
// out, either restored from an older snapshot (SAVE, more leases, the
// server restarted from that RDB) or by promoting a replica that stopped
// receiving the primary's writes 1.5s before the primary died. Every
// token granted over the run, counted as spent the moment it was granted,
// stays within b + r·t on Redis time, and the call that finds the data
// set gone back re-births it, once. Without the generation check the
// restored bucket refilled the 1.5s it had already handed out (about 30
// tokens over).
func TestRolledBackDataSetHandsOutNoFreeBurst(t *testing.T) {
	for _, tc := range []struct {
		name string
		// start returns the client to load, and back the client of the
		// data set gone back in time, called 1.5s of load after mark.
		start func(t *testing.T) (c *redis.Client, mark func(), back func() *redis.Client)
	}{
		{"restored from an older snapshot", func(t *testing.T) (*redis.Client, func(), func() *redis.Client) {
			srv := redistest.StartWith(t, "--dir", t.TempDir())
			c := srv.Client()
			return c, func() {
					if err := c.Save(context.Background()).Err(); err != nil {
						t.Fatalf("save: %v", err)
					}
				}, func() *redis.Client {
					srv.Restart() // kill -9, then start from the saved RDB
					return srv.Client()
				}
		}},
		{"a lagging replica promoted", func(t *testing.T) (*redis.Client, func(), func() *redis.Client) {
			// Both in their own directory: a replica writes the RDB of its
			// full sync to disk.
			primary := redistest.StartWith(t, "--dir", t.TempDir(), "--repl-diskless-sync-delay", "0")
			host, port, _ := splitAddr(primary.Addr())
			replica := redistest.StartWith(t, "--dir", t.TempDir(), "--replicaof", host, port)
			pc, rc := primary.Client(), replica.Client()
			waitReplicated(t, pc, rc)
			return pc, func() {
					waitReplicated(t, pc, rc)
					// The replica receives nothing from here on: it lags.
					if err := rc.SlaveOf(context.Background(), "NO", "ONE").Err(); err != nil {
						t.Fatalf("cut replication: %v", err)
					}
				}, func() *redis.Client {
					primary.Stop() // the primary dies; the lagging replica takes over
					return rc
				}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, mark, back := tc.start(t)
			k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "write"})
			cm := Common{StaticRate: 20, StaticBurst: 40, LeaseTTL: time.Second, Reclaim: true,
				RestartWait: 2 * time.Second, ReapBudget: 8, DemandWindow: 500 * time.Millisecond}
			ld := &rollbackLoad{sc: New(), k: k, cm: cm, rdb: c}
			var rebirths []int64
			ld.sc.Generations().OnRebirth(func(born string, bornUS int64) {
				ld.mu.Lock()
				defer ld.mu.Unlock()
				if born != k.Born {
					t.Errorf("re-birth of %s, want %s", born, k.Born)
				}
				rebirths = append(rebirths, bornUS)
			})
			// A new deployment: the bucket starts full.
			if _, err := ld.sc.StampBorn(context.Background(), c, []string{k.Born}, true); err != nil {
				t.Fatal(err)
			}
			t0 := ld.run(t, 0, time.Second)
			mark()
			t1 := ld.run(t, t0, 1500*time.Millisecond)
			ld.rdb = back()
			t2 := ld.run(t, t1, cm.RestartWait+1500*time.Millisecond)

			excess, at := ld.excess(cm.StaticRate, cm.StaticBurst)
			if excess > 1e-6 {
				t.Errorf("granted %.3f tokens over b + r·t (at Redis time %d, %dms after the data set went back)", excess, at, (at-t1)/1000)
			}
			if len(rebirths) != 1 || rebirths[0] < t1 {
				t.Errorf("re-births %v, want one after the data set went back at %d", rebirths, t1)
			}
			// Loaded again from its re-birth + the restart wait, the
			// key admits its rate again.
			if got, want := ld.grantedBetween(t2-1_000_000, t2), int64(10); got < want {
				t.Errorf("granted %d tokens in the last second, want at least %d (the key recovers after the restart wait)", got, want)
			}
		})
	}
}

// rollbackLoad is three instances that each take leases on one key as fast
// as Redis answers and spend every token the moment it is granted.
type rollbackLoad struct {
	sc  *Scripts
	k   Keys
	cm  Common
	rdb *redis.Client // the Redis loaded; changed between runs only

	mu     sync.Mutex
	grants []timedGrant // guarded by mu
	inst   [3]rollbackInstance
}

type timedGrant struct{ atUS, n int64 }

type rollbackInstance struct{ seq, used int64 }

// run loads the key until the Redis time of a reply is d past from (the
// first reply's time when from is 0) and returns that time.
func (l *rollbackLoad) run(t *testing.T, from int64, d time.Duration) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d+20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	end, failed := int64(0), error(nil)
	for i := range l.inst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in := &l.inst[i]
			for {
				mu.Lock()
				stop := end != 0 || failed != nil
				mu.Unlock()
				if stop {
					return
				}
				in.seq++
				r := Report{Instance: fmt.Sprintf("i-%d", i), Incarnation: uint64(i + 1), Lease: 1, Seq: uint64(in.seq),
					Used: in.used, Want: 5, Min: 1}
				lr, err := l.sc.Sync(ctx, l.rdb, l.k, l.cm, r)
				if err != nil {
					if ctx.Err() == nil && isLoading(err) {
						continue // the restarted server still loads its RDB
					}
					mu.Lock()
					failed = err
					mu.Unlock()
					return
				}
				in.used += lr.Granted
				l.mu.Lock()
				if lr.Granted > 0 {
					l.grants = append(l.grants, timedGrant{lr.NowUS, lr.Granted})
				}
				l.mu.Unlock()
				mu.Lock()
				if from == 0 {
					from = lr.NowUS
				}
				if lr.NowUS >= from+d.Microseconds() && end == 0 {
					end = lr.NowUS
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if failed != nil {
		t.Fatalf("sync: %v", failed)
	}
	return end
}

func isLoading(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && redis.HasErrorPrefix(re, "LOADING")
}

// excess runs GCRA over the grants in Redis-time order and returns the
// most tokens granted over b + r·t on any interval, and when.
func (l *rollbackLoad) excess(r, b float64) (float64, int64) {
	l.mu.Lock()
	gs := append([]timedGrant(nil), l.grants...)
	l.mu.Unlock()
	sort.SliceStable(gs, func(i, j int) bool { return gs[i].atUS < gs[j].atUS })
	tat, worst, at := 0.0, 0.0, int64(0)
	for i, g := range gs {
		ts := float64(g.atUS) / 1e6
		if i == 0 || tat < ts {
			tat = ts
		}
		tat += float64(g.n) / r
		if over := (tat-ts)*r - b; over > worst {
			worst, at = over, g.atUS
		}
	}
	return worst, at
}

func (l *rollbackLoad) grantedBetween(fromUS, toUS int64) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var n int64
	for _, g := range l.grants {
		if g.atUS > fromUS && g.atUS <= toUS {
			n += g.n
		}
	}
	return n
}

func splitAddr(addr string) (string, string, error) {
	for i := len(addr) - 1; i >= 0; i-- {
		if addr[i] == ':' {
			return addr[:i], addr[i+1:], nil
		}
	}
	return "", "", fmt.Errorf("no port in %q", addr)
}

// waitReplicated waits until the replica has applied everything the
// primary has written (its offset reached the primary's), polling with a
// deadline.
func waitReplicated(t *testing.T, primary, replica *redis.Client) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p, err1 := primary.InfoMap(ctx, "replication").Result()
		r, err2 := replica.InfoMap(ctx, "replication").Result()
		if err1 == nil && err2 == nil {
			pr, rr := p["Replication"], r["Replication"]
			if rr["master_link_status"] == "up" && pr["master_repl_offset"] == rr["slave_repl_offset"] {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica not in sync within 10s: %v %v (%v, %v)", p, r, err1, err2)
		}
		time.Sleep(10 * time.Millisecond) // polling replication with a deadline
	}
}
