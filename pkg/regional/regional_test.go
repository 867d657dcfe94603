package regional_test

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
)

// oneRegion is a config with a single region, so the region's static share
// is the whole limit.
const oneRegion = `
lease_ttl: 1s
refresh: 200ms
regions: {local: {weight: 1}}
classes:
  read:     {mode: lease}
  forfeit:  {mode: lease, reclaim: none}
  export:   {mode: strict, on_failure: closed}
tiers:
  free: {read: {rate: 1/s, burst: 100}, forfeit: {rate: 1/s, burst: 100}, export: {rate: 50/s, burst: 20}}
default_tier: free
`

func qk(tenant, class string) *sluicev1.QuotaKey {
	return &sluicev1.QuotaKey{Tenant: tenant, Class: class}
}

// strictRegion is a single region with one strict key whose burst is
// 10 s of its rate: an empty bucket reaches its cap only after 10 s
// without a single decision.
const strictRegion = `
regions: {local: {weight: 1}}
classes:
  export: {mode: strict, on_failure: closed}
tiers:
  free: {export: {rate: 10/s, burst: 100}}
default_tier: free
`

// TestStrictAdmitsExactly: many goroutines Check one strict key at once
// until it is saturated; the region gives out exactly b + r·t: what it
// admitted plus what the bucket still holds is b + r·t (±1 for rounding).
// t is the Redis time the requests actually spanned, read from the
// bucket's own refill timestamp, with the tokens it holds then, in one
// read: after a first Check that takes the whole burst (so the bucket
// starts the window empty) and after the last decision. Idle time before
// the first or after the last request is not counted.
//
// The count is exact while the bucket stays below its cap (refill it
// cannot hold is lost, as it should be), and the tokens it holds at the
// end are counted: with a burst of 20 at 50/s and a fixed 1.5 s, a worker
// pool starved of CPU on a loaded machine let the bucket fill (81
// admitted where b + floor(r t) was 113), or never emptied it again (583
// admitted and none denied where 644 were given out). The burst here is
// 10 s of refill, no stall the run survives reaches it, and the run lasts
// until the key was seen saturated.
func TestStrictAdmitsExactly(t *testing.T) {
	reg := regiontest.Start(t, regiontest.MustConfig(t, strictRegion), "local")
	client := sluicev1.NewLeaseServiceClient(reg.Dial(t))
	ctx := context.Background()
	if _, err := client.Check(ctx, &sluicev1.CheckRequest{Key: qk("warm", "export"), Cost: 1}); err != nil {
		t.Fatalf("warm-up check: %v", err) // connection and script cache, on another key
	}

	const workers = 16
	const r, b = 10.0, 100.0
	key := qk("acme", "export")
	keys, _, _, err := reg.Server.CommonFor(reg.Server.ConfigForTest(), quota.Key{Tenant: "acme", Class: "export"})
	if err != nil {
		t.Fatal(err)
	}
	// bucketAt is the bucket's refill timestamp (the Redis time of the
	// last script call that wrote the key; a leader's state read that
	// reaps nothing does not) and the tokens it held then. A plain read:
	// it changes nothing.
	bucketAt := func() (time.Time, float64) {
		t.Helper()
		v, err := reg.RDB.HMGet(ctx, keys.Bucket, "ts", "t").Result()
		if err != nil {
			t.Fatalf("bucket ts, t: %v", err)
		}
		ts, err1 := strconv.ParseInt(fmt.Sprint(v[0]), 10, 64)
		var tk float64 // t left out: 0 (a bucket leaves out a zero never written)
		var err2 error
		if v[1] != nil {
			tk, err2 = strconv.ParseFloat(fmt.Sprint(v[1]), 64)
		}
		if err1 != nil || err2 != nil {
			t.Fatalf("bucket ts %v, t %v", v[0], v[1])
		}
		return time.UnixMicro(ts), tk
	}
	first, err := client.Check(ctx, &sluicev1.CheckRequest{Key: key, Cost: int64(b)})
	if err != nil || !first.Allowed || first.Remaining != 0 {
		t.Fatalf("first check (the whole burst): %v %v", first, err)
	}
	start, _ := bucketAt()
	var admitted, denied atomic.Int64
	admitted.Add(int64(b))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := client.Check(ctx, &sluicev1.CheckRequest{Key: key, Cost: 1})
				if err != nil {
					t.Errorf("check: %v", err)
					return
				}
				if resp.Allowed {
					admitted.Add(1)
				} else {
					denied.Add(1)
				}
			}
		}()
	}
	// Run for a bounded while: at least 1.5 s, and until the key was
	// denied a request per worker (it was saturated).
	began := time.Now()
	for time.Since(began) < 1500*time.Millisecond || denied.Load() < workers {
		if time.Since(began) > 30*time.Second {
			close(stop)
			wg.Wait()
			t.Fatalf("%d workers were denied %d requests in 30 s: the key was never saturated", workers, denied.Load())
		}
		time.Sleep(10 * time.Millisecond) // polling the denials with a deadline
	}
	close(stop)
	wg.Wait()
	end, left := bucketAt()

	elapsed := end.Sub(start).Seconds()
	want := b + r*elapsed
	got := admitted.Load()
	st := bucketState(t, reg, quota.Key{Tenant: "acme", Class: "export"})
	t.Logf("admitted %d, denied %d over %.6fs of Redis time, %.6f tokens left; b + r t = %.6f; the bucket counted %d admitted",
		got, denied.Load(), elapsed, left, want, st.Admitted)
	// A bucket never holds less than nothing: admitting on too few
	// tokens would leave the sum right and the bucket in debt.
	if left < 0 {
		t.Fatalf("the bucket holds %.6f tokens after %d admitted: it admitted on credit", left, got)
	}
	if gave := float64(got) + left; math.Abs(gave-want) > 1 {
		t.Fatalf("admitted %d + %.6f left = %.6f, want b + r t = %.6f ± 1", got, left, gave, want)
	}
	if st.Admitted != got {
		t.Fatalf("the bucket counted %d admitted, the clients saw %d", st.Admitted, got)
	}
}

// TestLeaseReclaim: an instance takes a lease, reports some use and
// disappears without Release. After the lease TTL its unspent tokens are
// back in the bucket under reclaim: reported, and are not under reclaim:
// none. The two classes run side by side so their refill is the same.
func TestLeaseReclaim(t *testing.T) {
	reg := regiontest.Start(t, regiontest.MustConfig(t, oneRegion), "local")
	client := sluicev1.NewLeaseServiceClient(reg.Dial(t))
	ctx := context.Background()
	for _, class := range []string{"read", "forfeit"} {
		resp, err := client.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: "gone-1",
			Report: &sluicev1.KeyReport{Key: qk("acme", class), Seq: 1, Want: 60, Min: 1}})
		if err != nil || resp.Grant.Granted != 60 {
			t.Fatalf("%s: acquire: %v %v", class, resp, err)
		}
		if _, err := client.Sync(ctx, &sluicev1.SyncRequest{InstanceId: "gone-1",
			Reports: []*sluicev1.KeyReport{{Key: qk("acme", class), Seq: 2, Used: 10}}}); err != nil {
			t.Fatalf("%s: sync: %v", class, err)
		}
	}
	// The instance is gone. Poll (with a deadline) until both leases were
	// reaped: every script call reaps expired leases.
	state := func(class string) luascripts.State {
		return bucketState(t, reg, quota.Key{Tenant: "acme", Class: class})
	}
	deadline := time.Now().Add(10 * time.Second)
	var rep, none luascripts.State
	for {
		rep, none = state("read"), state("forfeit")
		if rep.Outstanding == 0 && none.Outstanding == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("leases not reaped after 10s: %+v %+v", rep, none)
		}
		time.Sleep(20 * time.Millisecond) // polling Redis state with a deadline
	}
	diff := rep.Tokens - none.Tokens
	t.Logf("reported: %.3f tokens, none: %.3f tokens", rep.Tokens, none.Tokens)
	// 50 unspent tokens came back under "reported"; the reads were a few
	// microseconds apart at 1 token/s.
	if diff < 49.9 || diff > 50.1 {
		t.Fatalf("reported - none = %.3f tokens, want 50", diff)
	}
}

// TestReleaseReturnsAtOnce: Release puts unspent tokens back immediately.
func TestReleaseReturnsAtOnce(t *testing.T) {
	reg := regiontest.Start(t, regiontest.MustConfig(t, oneRegion), "local")
	client := sluicev1.NewLeaseServiceClient(reg.Dial(t))
	ctx := context.Background()
	if _, err := client.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: "i1",
		Report: &sluicev1.KeyReport{Key: qk("acme", "read"), Seq: 1, Want: 70}}); err != nil {
		t.Fatal(err)
	}
	rel, err := client.Release(ctx, &sluicev1.ReleaseRequest{InstanceId: "i1",
		Reports: []*sluicev1.KeyReport{{Key: qk("acme", "read"), Seq: 2, Used: 5, Returned: 65}}})
	if err != nil {
		t.Fatal(err)
	}
	if rel.Returned != 65 {
		t.Fatalf("released %d tokens, want 65", rel.Returned)
	}
	// Another instance can take them at once.
	resp, err := client.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: "i2",
		Report: &sluicev1.KeyReport{Key: qk("acme", "read"), Seq: 1, Want: 95}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Grant.Granted < 95 {
		t.Fatalf("granted %d after release, want 95 (bucket of 100, 5 used)", resp.Grant.Granted)
	}
}

// TestBadInputChangesNothing: every invalid request is refused with
// InvalidArgument and a clear message, and Redis is byte-for-byte the same.
func TestBadInputChangesNothing(t *testing.T) {
	reg := regiontest.Start(t, regiontest.MustConfig(t, oneRegion), "local")
	client := sluicev1.NewLeaseServiceClient(reg.Dial(t))
	ctx := context.Background()
	// Some state to protect.
	if _, err := client.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: "i1",
		Report: &sluicev1.KeyReport{Key: qk("acme", "read"), Seq: 1, Want: 10}}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Check(ctx, &sluicev1.CheckRequest{Key: qk("acme", "export"), Cost: 1}); err != nil {
		t.Fatal(err)
	}
	good := func() *sluicev1.KeyReport {
		return &sluicev1.KeyReport{Key: qk("acme", "read"), Seq: 2, Want: 5}
	}
	acquire := func(mut func(*sluicev1.AcquireRequest)) func() error {
		return func() error {
			req := &sluicev1.AcquireRequest{InstanceId: "i1", Report: good()}
			mut(req)
			_, err := client.Acquire(ctx, req)
			return err
		}
	}
	check := func(key *sluicev1.QuotaKey, cost int64) func() error {
		return func() error {
			_, err := client.Check(ctx, &sluicev1.CheckRequest{Key: key, Cost: cost})
			return err
		}
	}
	sync := func(reports ...*sluicev1.KeyReport) func() error {
		return func() error {
			_, err := client.Sync(ctx, &sluicev1.SyncRequest{InstanceId: "i1", Reports: reports})
			return err
		}
	}
	withKey := func(tenant, class string) func(*sluicev1.AcquireRequest) {
		return func(r *sluicev1.AcquireRequest) { r.Report.Key = qk(tenant, class) }
	}
	cases := []struct {
		name    string
		call    func() error
		message string
	}{
		{"empty tenant", acquire(withKey("", "read")), "tenant is empty"},
		{"10 KB tenant", acquire(withKey(strings.Repeat("a", 10<<10), "read")), "10240 bytes long"},
		{"tenant with {", acquire(withKey("ac{me", "read")), `byte '{'`},
		{"tenant with }", acquire(withKey("acme}", "read")), `byte '}'`},
		{"tenant with newline", acquire(withKey("ac\nme", "read")), `byte '\n'`},
		{"tenant with control", acquire(withKey("ac\x01me", "read")), `byte '\x01'`},
		{"unknown class", acquire(withKey("acme", "delete")), `class "delete" is not configured`},
		{"missing key", acquire(func(r *sluicev1.AcquireRequest) { r.Report.Key = nil }), "report.key is missing"},
		{"missing report", acquire(func(r *sluicev1.AcquireRequest) { r.Report = nil }), "report is missing"},
		{"empty instance", acquire(func(r *sluicev1.AcquireRequest) { r.InstanceId = "" }), "instance_id is empty"},
		{"instance with space", acquire(func(r *sluicev1.AcquireRequest) { r.InstanceId = "a b" }), "instance_id"},
		{"seq 0", acquire(func(r *sluicev1.AcquireRequest) { r.Report.Seq = 0 }), "seq must be at least 1"},
		{"negative want", acquire(func(r *sluicev1.AcquireRequest) { r.Report.Want = -1 }), "want -1 is negative"},
		{"absurd want", acquire(func(r *sluicev1.AcquireRequest) { r.Report.Want = 1 << 40 }), "exceeds the maximum"},
		{"min above want", acquire(func(r *sluicev1.AcquireRequest) { r.Report.Min = 9 }), "min 9 exceeds want 5"},
		{"negative used", acquire(func(r *sluicev1.AcquireRequest) { r.Report.Used = -3 }), "used -3 is negative"},
		{"absurd used total", acquire(func(r *sluicev1.AcquireRequest) { r.Report.Used = 1<<53 + 1 }), "exceeds the maximum"},
		{"lease above seq", acquire(func(r *sluicev1.AcquireRequest) { r.Report.Lease = 3 }), "lease 3 is above its seq 2"},
		{"cost 0", check(qk("acme", "export"), 0), "cost 0 must be at least 1"},
		{"negative cost", check(qk("acme", "export"), -7), "cost -7 must be at least 1"},
		{"absurd cost", check(qk("acme", "export"), 1<<40), "exceeds the maximum"},
		{"cost above burst", check(qk("acme", "export"), 21), "exceeds the burst 20"},
		{"check bad tenant", check(qk("a\tb", "export"), 1), `byte '\t'`},
		// A request above the key's burst could never be admitted: refused
		// before a script creates a bucket or a lease for a fresh key.
		{"acquire cost above burst", acquire(func(r *sluicev1.AcquireRequest) {
			r.Report.Key, r.Report.Want, r.Report.Min = qk("fresh", "read"), 101, 101
		}), "report.min: cost 101 exceeds the burst 100"},
		{"sync cost above burst", sync(&sluicev1.KeyReport{Key: qk("fresh", "read"), Seq: 1, Want: 101, Min: 101}), "reports[0].min: cost 101 exceeds the burst 100"},
		// One report of a batch above its key's burst refuses the batch,
		// named by its index, and the good report before it is not run.
		{"sync second report above burst", sync(good(), &sluicev1.KeyReport{Key: qk("fresh", "read"), Seq: 1, Want: 101, Min: 101}), "reports[1].min: cost 101 exceeds the burst 100"},
		{"sync duplicate key", sync(good(), good()), "repeats key acme/read"},
		{"sync empty report", sync(good(), &sluicev1.KeyReport{}), "reports[1] is empty"},
		{"sync one bad report", sync(good(), &sluicev1.KeyReport{Key: qk("x}", "read"), Seq: 1}), "reports[1].key"},
		{"sync no instance", func() error {
			_, err := client.Sync(ctx, &sluicev1.SyncRequest{Reports: []*sluicev1.KeyReport{good()}})
			return err
		}, "instance_id is empty"},
		{"release bad returned", func() error {
			_, err := client.Release(ctx, &sluicev1.ReleaseRequest{InstanceId: "i1",
				Reports: []*sluicev1.KeyReport{{Key: qk("acme", "read"), Seq: 2, Returned: -1}}})
			return err
		}, "returned -1 is negative"},
	}
	before := dump(t, reg)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			refusedChangingNothing(t, reg, before, tc.call(), tc.message)
		})
	}
}

// refusedChangingNothing fails t unless err is InvalidArgument saying
// message and reg's Redis still reads as before.
func refusedChangingNothing(t *testing.T, reg *regiontest.Region, before string, err error, message string) {
	t.Helper()
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("got %v, want InvalidArgument", err)
	}
	if !strings.Contains(status.Convert(err).Message(), message) {
		t.Fatalf("message %q does not say %q", status.Convert(err).Message(), message)
	}
	if after := dump(t, reg); after != before {
		t.Fatalf("redis changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

func dump(t *testing.T, reg *regiontest.Region) string {
	t.Helper()
	d, err := redistest.Dump(context.Background(), reg.RDB)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestDuplicateSyncIsIdempotent: a retried Sync (same seq) changes nothing
// and repeats the original grant.
func TestDuplicateSyncIsIdempotent(t *testing.T) {
	reg := regiontest.Start(t, regiontest.MustConfig(t, oneRegion), "local")
	client := sluicev1.NewLeaseServiceClient(reg.Dial(t))
	ctx := context.Background()
	req := &sluicev1.SyncRequest{InstanceId: "i1", Reports: []*sluicev1.KeyReport{{Key: qk("acme", "read"), Seq: 1, Want: 30}}}
	first, err := client.Sync(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	before := dump(t, reg)
	again, err := client.Sync(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if again.Grants[0].Granted != first.Grants[0].Granted {
		t.Fatalf("retry granted %d, original %d", again.Grants[0].Granted, first.Grants[0].Granted)
	}
	if again.Grants[0].TtlMs > first.Grants[0].TtlMs {
		t.Fatalf("retry extended the lease: ttl %d > %d", again.Grants[0].TtlMs, first.Grants[0].TtlMs)
	}
	// Only the bucket's refill timestamp and tokens may move (time passed);
	// the lease and the counters must not.
	if leases(before) != leases(dump(t, reg)) {
		t.Fatalf("retry changed the lease:\n%s\n%s", before, dump(t, reg))
	}
}

func leases(d string) string {
	var out []string
	for _, l := range strings.Split(d, "\n") {
		if strings.Contains(l, "}:l ") || strings.Contains(l, "}:x ") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
