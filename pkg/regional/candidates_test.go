package regional_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
)

// demandDriver drives one instance's lease on keys of the rig's region
// through the regional server's real Acquire and Sync, with report build
// times it chooses, so each key's lease demand reading is what the test
// says.
type demandDriver struct {
	t     *testing.T
	r     *leaseRig
	seq   map[quota.Key]uint64
	used  map[quota.Key]int64
	last  map[quota.Key]int64 // when each key's last report was built
	built int64               // µs, the instance's clock
}

func newDemandDriver(r *leaseRig) *demandDriver {
	return &demandDriver{t: r.t, r: r, seq: map[quota.Key]uint64{}, used: map[quota.Key]int64{},
		last: map[quota.Key]int64{}, built: 1_000_000}
}

// open takes a lease on each key (no demand reading yet).
func (d *demandDriver) open(keys ...quota.Key) {
	d.t.Helper()
	for _, k := range keys {
		d.seq[k]++
		d.last[k] = d.built
		if _, err := d.r.srv.Acquire(context.Background(), &sluicev1.AcquireRequest{InstanceId: "app", Incarnation: 7,
			Report: &sluicev1.KeyReport{Key: &sluicev1.QuotaKey{Tenant: k.Tenant, Class: k.Class}, Seq: d.seq[k], Lease: 1, Want: 1, BuiltUs: d.built}}); err != nil {
			d.t.Fatal(err)
		}
	}
}

// demand reports, ten seconds of the instance's clock later, that each
// key used rate tokens/s since its last report: the key's lease demand
// reading becomes rate.
func (d *demandDriver) demand(rate float64, keys ...quota.Key) {
	d.t.Helper()
	d.built += 10_000_000
	var reps []*sluicev1.KeyReport
	for _, k := range keys {
		d.seq[k]++
		d.used[k] += int64(rate * float64(d.built-d.last[k]) / 1e6)
		d.last[k] = d.built
		reps = append(reps, &sluicev1.KeyReport{Key: &sluicev1.QuotaKey{Tenant: k.Tenant, Class: k.Class},
			Seq: d.seq[k], Lease: 1, Used: d.used[k], Want: 1, BuiltUs: d.built})
	}
	if _, err := d.r.srv.Sync(context.Background(), &sluicev1.SyncRequest{InstanceId: "app", Incarnation: 7, Reports: reps}); err != nil {
		d.t.Fatal(err)
	}
}

// newCandidatesRig is a lease rig on leaseConfig whose static lease
// outlives a test (region_lease 1m): these tests judge keys against the static share,
// and a driver opening and feeding hundreds of keys under -race on a busy
// machine can take longer than the rig's usual 2 s between reports, after
// which the scripts refuse to run under a lapsed lease.
func newCandidatesRig(t *testing.T) *leaseRig {
	t.Helper()
	return newLeaseRigWith(t, leaseConfigWith(t, time.Minute))
}

// reported syncs the rig's leader once and returns the keys of its report.
func (r *leaseRig) reported() []quota.Key {
	r.t.Helper()
	r.syncOnce(context.Background(), r.leader)
	var keys []quota.Key
	for _, kd := range r.tier.lastReport.Load().GetKeys() {
		keys = append(keys, quota.Key{Tenant: kd.GetKey().GetTenant(), Class: kd.GetKey().GetClass()})
	}
	return keys
}

// TestLeaderReportsOnlyKeysThatNeedTheGlobalTier: of a region's many
// served keys, the leader reports only those whose demand reached half the
// region's static share (50/s here, so 25/s): 300 idle keys and one at
// 20/s are never reported; a key at 40/s is reported by the next report;
// the 20/s key is reported by the first report after its demand crossed
// the threshold; and the reports stay small whatever the idle keys do.
func TestLeaderReportsOnlyKeysThatNeedTheGlobalTier(t *testing.T) {
	r := newCandidatesRig(t)
	// The first answer confers the static lease: the static share is 50/s.
	// The scripts read it from Redis, where its write is bounded by an
	// epoch (50 ms here) and may fail on a starved machine: until it is
	// stored they judge every key against its floor, and a key at 20/s
	// needs the global tier. So report until the lease is in Redis.
	r.reported()
	for i := 0; r.stored() <= r.redisUS(); i++ {
		if i >= 20 {
			t.Fatalf("%d answers stored no running static lease", i+1)
		}
		r.reported()
	}
	if got := r.static(r.srv); !near(got, staticRate) {
		t.Fatalf("static rate %v, want %v", got, staticRate)
	}
	d := newDemandDriver(r)
	var idle []quota.Key
	for i := range 300 {
		idle = append(idle, quota.Key{Tenant: fmt.Sprintf("idle%03d", i), Class: "write"})
	}
	hot := quota.Key{Tenant: "hot", Class: "write"}
	warm := quota.Key{Tenant: "warm", Class: "write"}
	d.open(append(idle, hot, warm)...)
	d.demand(0, idle...)
	d.demand(40, hot)
	d.demand(20, warm)
	if got := r.reported(); !slices.Equal(got, []quota.Key{hot}) {
		t.Fatalf("report names %d keys (%v...), want only %v", len(got), got[:min(len(got), 3)], hot)
	}
	if got := r.gauge("sluice_regional_report_keys"); got != 1 {
		t.Fatalf("sluice_regional_report_keys = %v, want 1", got)
	}
	// warm's demand crosses the threshold: its next report names it.
	d.demand(30, warm)
	if got := r.reported(); !slices.Contains(got, warm) || len(got) != 2 {
		t.Fatalf("report names %v, want %v and %v", got, hot, warm)
	}
	// The idle keys keep being served: still never reported.
	d.demand(0, idle...)
	if got := r.reported(); len(got) != 2 {
		t.Fatalf("report names %d keys after the idle keys were served again, want 2", len(got))
	}
}

// TestGrantedIdleKeyReportedUntilItsGrantEnds: the allocator grants eu a
// key eu never served nor reported (us wants far more than its share, so
// eu donates); from then on every eu report sent while eu holds a grant
// for the key names it, so the allocator hears eu acknowledge what it
// holds; once us goes idle and the grants end, the key leaves eu's reports.
func TestGrantedIdleKeyReportedUntilItsGrantEnds(t *testing.T) {
	ctx := context.Background()
	r := newCandidatesRig(t)
	key := quota.Key{Tenant: "donor", Class: "write"}
	epoch := time.Duration(r.cfg.Epoch)
	validity := time.Duration(r.cfg.GrantValidity)
	var useq uint64
	var held *sluicev1.KeyGrant
	var heldUntil time.Time
	// us reports demand (tokens/s over one epoch), echoing its grant.
	us := func(rate float64) {
		useq++
		kd := &sluicev1.KeyDemand{Key: &sluicev1.QuotaKey{Tenant: key.Tenant, Class: key.Class},
			Admitted: int64(rate * epoch.Seconds()), WindowMs: epoch.Milliseconds()}
		sent := time.Now()
		if held != nil && sent.Before(heldUntil) {
			kd.HeldRate, kd.HeldBurst, kd.HeldValidMs = held.Rate, held.Burst, heldUntil.Sub(sent).Milliseconds()
		}
		g, err := r.alloc.Service.Sync(ctx, &sluicev1.RegionReport{Region: "us", Seq: useq, Keys: []*sluicev1.KeyDemand{kd}})
		if err != nil {
			t.Fatal(err)
		}
		for _, gr := range g.GetGrants() {
			held, heldUntil = gr, sent.Add(time.Duration(gr.GetValidMs())*time.Millisecond)
		}
	}
	// validUntil is the end (eu's Redis time, µs) of the latest grant eu
	// echoed for the key; a report sent before it must name the key.
	var validUntil int64
	named, left := false, false
	// Budget: the allocator's learning (one validity), the grants' life
	// after us goes idle (validity), the horizon and hysteresis (five
	// epochs), with room for a busy machine.
	deadline := time.Now().Add(20*validity + 40*epoch)
	usIdleAt := time.Time{}
	for !left {
		if time.Now().After(deadline) {
			t.Fatalf("named %v, left %v by the deadline", named, left)
		}
		if usIdleAt.IsZero() {
			us(1000)
		} else {
			us(0)
		}
		// A round that outlived its epoch on a starved machine is a
		// missed round, as in the leader's loop: the reports that did
		// leave are judged all the same, and the deadline bounds them.
		if err := r.leader.SyncOnce(ctx, nil); err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal(err)
		}
		rep := r.tier.lastReport.Load()
		var kd *sluicev1.KeyDemand
		for _, x := range rep.GetKeys() {
			if x.GetKey().GetTenant() == key.Tenant {
				kd = x
			}
		}
		switch {
		case kd == nil && int64(rep.GetSeq()) < validUntil:
			t.Fatalf("report sent at %d omits the key while eu holds its grant until %d", rep.GetSeq(), validUntil)
		case kd == nil && named && !usIdleAt.IsZero():
			left = true
		case kd != nil:
			named = true
			if kd.GetHeldValidMs() > 0 {
				validUntil = max(validUntil, int64(rep.GetSeq())+kd.GetHeldValidMs()*1000)
				if usIdleAt.IsZero() {
					usIdleAt = time.Now() // eu holds a grant: us now goes idle
				}
			}
		}
		time.Sleep(epoch / 2) // the reports' period, not a wait for an event
	}
	// Every grant went to the keys of the key it names, the one never
	// reported included: nothing in eu's Redis lies outside its prefix.
	all, err := r.rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range all {
		if !strings.HasPrefix(k, luascripts.DefaultPrefix) {
			t.Fatalf("eu's Redis holds %q, outside its prefix %q", k, luascripts.DefaultPrefix)
		}
	}
}

// TestEpochReportTrimsMarksPastTheHorizon: an epoch report removes from
// the candidate set the marks older than its horizon (two epochs before
// it was sent), in the same round trip, and leaves the later ones.
func TestEpochReportTrimsMarksPastTheHorizon(t *testing.T) {
	ctx := context.Background()
	r := newCandidatesRig(t)
	set := luascripts.CandKeys(luascripts.DefaultPrefix, false)[0] // the rig's one Redis
	later := r.redisUS() + time.Hour.Microseconds()
	if err := r.rdb.ZAdd(ctx, set, redis.Z{Score: 1, Member: "stale|write"}, redis.Z{Score: float64(later), Member: "later|write"}).Err(); err != nil {
		t.Fatal(err)
	}
	r.syncOnce(ctx, r.leader)
	if err := r.rdb.ZScore(ctx, set, "stale|write").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("a mark older than the horizon is still in %s after an epoch report (err %v)", set, err)
	}
	if got, err := r.rdb.ZScore(ctx, set, "later|write").Result(); err != nil || got != float64(later) {
		t.Fatalf("a mark past the horizon: score %v, err %v; want %d kept", got, err, later)
	}
}
