package allocator_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/pkg/allocator"
)

// leaseRegions is twoRegions with a region lease of two grant validities:
// a region not heard from for 1s + 500ms + 100ms (margin) lapses. Class
// write is on_failure local: its floor is 0.
const leaseRegions = twoRegions + "region_lease: 1s\n"

const testRegionLease = time.Second

// regionDriver reports for one region every epoch like a region leader:
// it echoes the grant it holds and keeps its static lease.
type regionDriver struct {
	name   string
	seq    uint64
	held   *sluicev1.KeyGrant
	heldAt time.Time
	demand int64 // tokens per report window
}

// sync sends one report to api and applies the answer; it returns the
// answer (nil when refused).
func (d *regionDriver) sync(t *testing.T, api sluicev1.AllocatorServiceClient) *sluicev1.RegionGrants {
	t.Helper()
	d.seq++
	kd := demand("acme", d.demand)
	now := time.Now()
	if d.held != nil {
		if left := d.heldAt.Add(time.Duration(d.held.ValidMs) * time.Millisecond).Sub(now); left > 0 {
			kd.HeldRate, kd.HeldBurst, kd.HeldValidMs = d.held.Rate, d.held.Burst, left.Milliseconds()
		}
	}
	resp, err := api.Sync(rpcCtx(t), report(d.name, d.seq, kd))
	if err != nil {
		return nil
	}
	for _, g := range resp.Grants {
		d.held, d.heldAt = g, now
	}
	return resp
}

func regionStatus(t *testing.T, api sluicev1.AllocatorServiceClient, region string) *sluicev1.RegionStatus {
	t.Helper()
	st, err := api.Status(rpcCtx(t), &sluicev1.StatusRequest{})
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	for _, r := range st.Regions {
		if r.Region == region {
			return r
		}
	}
	return nil
}

func readLapsed(t *testing.T, cli *clientv3.Client) []string {
	t.Helper()
	set, err := allocator.ReadLapsed(rpcCtx(t), cli, allocator.LapsedKey("/test"))
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// lapseRegionA runs region b on leader r (b wants twice the limit) until
// silent region a has lapsed and b holds the whole rate. Every time the
// leader's Status shows a lapsed, etcd already holds it in the lapsed set.
func lapseRegionA(t *testing.T, r *replica, cli *clientv3.Client, b *regionDriver) {
	t.Helper()
	tick := time.NewTicker(testEpoch)
	defer tick.Stop()
	// Lapse after region_lease + validity + margin of silence from the
	// start of the term; slack for a loaded machine.
	deadline := time.Now().Add(testRegionLease + testValidity + 10*testEpoch + 2*slack)
	lapsedSeen := false
	for range tick.C {
		if time.Now().After(deadline) {
			t.Fatalf("region a did not lapse, or b did not get its share: a %v, b holds %v", regionStatus(t, r.api, "a"), b.held)
		}
		b.sync(t, r.api)
		full, err := r.api.Status(rpcCtx(t), &sluicev1.StatusRequest{})
		if err != nil {
			t.Fatalf("status: %v", err)
		}
		if !full.Leader || full.Learning {
			// Not leading, or leading a new term (a starved replica's
			// session may lapse and be won again): what a's state may be
			// is counted from that term's start, so the test starts over.
			lapsedSeen = false
			deadline = time.Now().Add(testRegionLease + testValidity + 10*testEpoch + 2*slack)
			continue
		}
		var st *sluicev1.RegionStatus
		for _, rs := range full.Regions {
			if rs.Region == "a" {
				st = rs
			}
		}
		if st == nil {
			t.Fatalf("the leader's status has no region a: %v", full)
		}
		if st.State != "lapsed" {
			if lapsedSeen {
				t.Fatalf("a went from lapsed to %q without reporting", st.State)
			}
			// Nothing is written while no region lapses: the key is
			// absent, or holds a on its way to lapsing.
			resp, err := cli.Get(rpcCtx(t), allocator.LapsedKey("/test"))
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Kvs) > 0 && !strings.Contains(string(resp.Kvs[0].Value), `"a"`) {
				t.Fatalf("the lapsed set was written as %s before a lapsed", resp.Kvs[0].Value)
			}
			continue
		}
		if !lapsedSeen {
			lapsedSeen = true
			if set := readLapsed(t, cli); !slices.Contains(set, "a") {
				t.Fatalf("the leader counts a as lapsed but the durable set is %v", set)
			}
			if st.ReservedFraction != 0 || st.StaticLeaseMs != 0 {
				t.Fatalf("lapsed a's status: %v, want reserved_fraction 0 and no static lease", st)
			}
		}
		if b.held != nil && b.held.Rate > 99 {
			return
		}
	}
}

// TestRegionLapseIsDurableBeforeItCounts: a region silent for longer than
// region_lease + grant validity + margin is written to the durable lapsed
// set, and only then counted at its floor: its share goes to the region
// that wants it, and Status and the metrics say so.
func TestRegionLapseIsDurableBeforeItCounts(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	r := startReplica(t, srv, allocator.StaticConfig{C: mustConfig(t, leaseRegions)}, testTTL)
	waitFor(t, 10*time.Second, "the replica leads", r.IsLeader)
	b := &regionDriver{name: "b", demand: 20} // 200/s against 100/s
	if resp := b.sync(t, r.api); resp == nil || resp.StaticLeaseMs != testRegionLease.Milliseconds() {
		t.Fatalf("b's answer %v: want static_lease_ms %d", resp, testRegionLease.Milliseconds())
	}
	if st := regionStatus(t, r.api, "b"); st.State != "live" || st.ReservedFraction != 1 || st.StaticLeaseMs <= 0 {
		t.Fatalf("b's status %v", st)
	}
	lapseRegionA(t, r, cli, b)
	// b is live only while its last report is younger than the silent
	// period (2 epochs): on a loaded machine the scrape may come later
	// than that after b's last report, and b rightly shows silent (and a
	// starved replica may briefly not lead: no states at all). So b
	// reports again each epoch until a scrape right after its report shows
	// every state wanted; a, which never reports, must never show live.
	wants := []string{
		`sluice_global_region_state{region="a",state="lapsed"} 1`,
		`sluice_global_region_state{region="a",state="live"} 0`,
		`sluice_global_region_state{region="b",state="live"} 1`,
	}
	deadline := time.Now().Add(testRegionLease + slack)
	tick := time.NewTicker(testEpoch) // b reports once per epoch, as a region leader does
	defer tick.Stop()
	for ; ; <-tick.C {
		b.sync(t, r.api)
		m := scrape(t, r.Daemon)
		if strings.Contains(m, `sluice_global_region_state{region="a",state="live"} 1`) {
			t.Fatalf("a shows live without reporting:\n%s", grep(m, "sluice_global_region_state"))
		}
		missing := ""
		for _, want := range wants {
			if !strings.Contains(m, want) {
				missing = want
				break
			}
		}
		if missing == "" {
			return
		}
		if strings.Contains(m, "sluice_global_leader 0") || strings.Contains(m, "sluice_global_learning 1") {
			// A new term (a starved replica's session lapsed): b is
			// live again from its next report to the new term.
			deadline = time.Now().Add(testRegionLease + slack)
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics lack %s after every report of b:\n%s", missing, grep(m, "sluice_global_region_state"))
		}
	}
}

// TestNextLeaderReadsTheLapsedSet: after a leader found a lapsed, the
// next leader confers a no static lease while it learns (the old leader's
// grants gave a's share to b), confers b one, and confers a one once it
// no longer learns; the set then loses a with the next write.
func TestNextLeaderReadsTheLapsedSet(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	src := allocator.StaticConfig{C: mustConfig(t, leaseRegions)}
	// The leadership moves only by first's Stop (it resigns): with the
	// 1 s test session a starved second lost it again ("not leader") and
	// its Status had no regions to read.
	const ttl = 60 * time.Second
	first := startReplica(t, srv, src, ttl)
	waitFor(t, 10*time.Second, "the first replica leads", first.IsLeader)
	second := startReplica(t, srv, src, ttl)
	b := &regionDriver{name: "b", demand: 20}
	lapseRegionA(t, first, cli, b)

	first.Stop()
	waitFor(t, 5*slack, "the second replica leads", second.IsLeader)
	a := &regionDriver{name: "a", demand: 5}
	resp := a.sync(t, second.api)
	st, err := second.api.Status(rpcCtx(t), &sluicev1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !st.Learning {
		t.Skip("the new leader finished learning before a could report (machine too slow)")
	}
	if resp == nil || resp.StaticLeaseMs != 0 {
		t.Fatalf("a, in the durable lapsed set, got %v from a learning leader: want static_lease_ms 0", resp)
	}
	if s := regionStatus(t, second.api, "a"); s == nil || s.State != "returning" {
		t.Fatalf("a's status %v, want state returning", s)
	}
	if resp := b.sync(t, second.api); resp == nil || resp.StaticLeaseMs != testRegionLease.Milliseconds() {
		t.Fatalf("b got %v from the learning leader: want static_lease_ms %d", resp, testRegionLease.Milliseconds())
	}
	waitFor(t, testValidity+slack, "the new leader stops learning", func() bool {
		st, err := second.api.Status(rpcCtx(t), &sluicev1.StatusRequest{})
		return err == nil && !st.Learning
	})
	if resp := a.sync(t, second.api); resp == nil || resp.StaticLeaseMs != testRegionLease.Milliseconds() {
		t.Fatalf("a got %v once the leader learned: want static_lease_ms %d", resp, testRegionLease.Milliseconds())
	}
	if s := regionStatus(t, second.api, "a"); s == nil || s.State != "live" || s.ReservedFraction != 1 {
		t.Fatalf("a's status %v once conferred its lease", s)
	}
	waitFor(t, slack, "the durable set drops a", func() bool { return !slices.Contains(readLapsed(t, cli), "a") })
}

// TestLapsedSetWriteIsFencedOnTheElection: the set is written only while
// the writer's election key exists; a deposed leader's write changes
// nothing. A set that does not parse is an error, never an empty set.
func TestLapsedSetWriteIsFencedOnTheElection(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	key := allocator.LapsedKey("/test")
	leader, resign := allocator.Campaign(t, cli, "/test/election/global")
	won := allocator.Won(leader)
	if err := won(rpcCtx(t), cli, key, []string{"a"}); err != nil {
		t.Fatalf("leader's write: %v", err)
	}
	resign()
	err := won(rpcCtx(t), cli, key, nil)
	if err == nil || !strings.Contains(err.Error(), "no longer the leader") {
		t.Fatalf("deposed leader's write: %v, want refused", err)
	}
	if set := readLapsed(t, cli); !slices.Equal(set, []string{"a"}) {
		t.Fatalf("set %v after the refused write, want [a]", set)
	}
	raw, _ := json.Marshal(map[string]any{"regions": []string{"a b"}})
	for _, bad := range []string{"not json", string(raw)} {
		if _, err := cli.Put(context.Background(), key, bad); err != nil {
			t.Fatal(err)
		}
		if set, err := allocator.ReadLapsed(rpcCtx(t), cli, key); err == nil {
			t.Fatalf("ReadLapsed of %q = %v, want an error", bad, set)
		}
	}
	// A read or a write that etcd does not answer is an error.
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if set, err := allocator.ReadLapsed(done, cli, key); err == nil || !strings.Contains(err.Error(), "read the lapsed set") {
		t.Fatalf("ReadLapsed with its context done = %v, %v; want an error", set, err)
	}
	if err := won(done, cli, key, nil); err == nil || !strings.Contains(err.Error(), "write the lapsed set") {
		t.Fatalf("a write with its context done: %v, want an error", err)
	}
}
