package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/grpctest"
)

// campaign enters an etcd election under key as a daemon does, with value
// as its address, and returns once its candidate key exists (it need not
// win). The session ends at test cleanup.
func campaign(t *testing.T, cli *clientv3.Client, key, value string) {
	t.Helper()
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(30))
	if err != nil {
		t.Fatalf("etcd session: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		<-done
		sess.Close()
	})
	go func() {
		defer close(done)
		// A candidate behind the leader blocks here until cleanup.
		_ = concurrency.NewElection(sess, key).Campaign(ctx, value)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := cli.Get(t.Context(), key+"/", clientv3.WithPrefix())
		if err == nil {
			for _, kv := range resp.Kvs {
				if string(kv.Value) == value {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("candidate %s of %s did not appear within 10s (last error %v)", value, key, err)
		}
	}
}

func TestStatusWithoutGlobalAllocatorShowsEtcdLeadersAndExits5(t *testing.T) {
	c := newCluster(t)
	wantCode(t, sluicectl(t, "", c.args("apply", "-f", sample(t), "-yes")...), exitOK)
	election := c.store.ElectionPrefix()
	// Leader values are addresses where nothing listens, so asking the
	// leader fails fast.
	globalLeader, globalStandby := grpctest.RefusedAddr(t), grpctest.RefusedAddr(t)
	campaign(t, c.cli, election+"global", globalLeader)
	campaign(t, c.cli, election+"global", globalStandby)
	campaign(t, c.cli, election+"region/us-east", "10.1.0.7:7400")
	campaign(t, c.cli, election+"region/mars", "10.9.0.1:7400")

	dead := grpctest.RefusedAddr(t)
	r := sluicectl(t, "", c.args("status", "-global-addr", dead)...)
	wantCode(t, r, exitUnreachable)
	wantContains(t, "stdout", r.stdout, "global leader:", globalLeader, "2 candidates")
	wantRow(t, r.stdout, "us-east", "10.1.0.7:7400", "1")
	wantRow(t, r.stdout, "eu-west", "none", "0", "no", "leader:")
	wantRow(t, r.stdout, "mars", "10.9.0.1:7400", "1", "not", "in", "the", "config")
	wantContains(t, "stdout", r.stdout, "global allocator "+dead+": unreachable")
	wantContains(t, "stderr", r.stderr, "cannot get status from the global allocator at "+dead, "check -global-addr")
	// Several addresses, none up: each one's failure is told.
	dead2 := grpctest.RefusedAddr(t)
	r = sluicectl(t, "", c.args("status", "-global-addr", dead+","+dead2)...)
	wantCode(t, r, exitUnreachable)
	wantContains(t, "stderr", r.stderr, "cannot get status from the global allocator at "+dead, "cannot get status from the global allocator at "+dead2)

	// Without -global-addr the global leader found in etcd is asked.
	r = sluicectl(t, "", c.args("status", "-o", "json")...)
	wantCode(t, r, exitUnreachable)
	var rep statusReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("status -o json: %v\n%s", err, r.stdout)
	}
	if rep.GlobalLeader == nil || rep.GlobalLeader.Addr != globalLeader || rep.GlobalLeader.Candidates != 2 {
		t.Fatalf("global leader = %+v, want %s of 2 candidates", rep.GlobalLeader, globalLeader)
	}
	if rep.GlobalAddr != globalLeader || rep.GlobalError == "" || rep.Global != nil {
		t.Fatalf("asked %q (error %q), want the leader %s and an error", rep.GlobalAddr, rep.GlobalError, globalLeader)
	}
	leaders := map[string]string{}
	for _, rl := range rep.RegionLeaders {
		if rl.Leader != nil {
			leaders[rl.Region] = rl.Leader.Addr
		} else {
			leaders[rl.Region] = ""
		}
	}
	if len(leaders) != 4 || leaders["us-east"] != "10.1.0.7:7400" || leaders["eu-west"] != "" || leaders["mars"] != "10.9.0.1:7400" {
		t.Fatalf("region leaders = %v", leaders)
	}
}

func TestStatusWithNoGlobalLeaderAndNoAddressExits5(t *testing.T) {
	c := newCluster(t)
	r := sluicectl(t, "", c.args("status")...)
	wantCode(t, r, exitUnreachable)
	wantContains(t, "stdout", r.stdout, "global leader:", "none")
	wantContains(t, "stderr", r.stderr, "etcd shows no global leader", "-global-addr")
}

// TestStatusWithEtcdUnreachableSaysTheGlobalLeaderIsUnknown: with etcd
// unreachable and no -global-addr, status says the global leader is
// unknown because etcd could not be read, not that etcd shows no global
// leader (it was never read).
func TestStatusWithEtcdUnreachableSaysTheGlobalLeaderIsUnknown(t *testing.T) {
	dead := grpctest.RefusedAddr(t)
	r := sluicectl(t, "", "-etcd-endpoints", dead, "-timeout", "1s", "status")
	wantCode(t, r, exitUnreachable)
	wantContains(t, "stderr", r.stderr, "cannot use etcd at", "the global leader is unknown because etcd could not be read", "-global-addr")
	if strings.Contains(r.stderr, "etcd shows no global leader") {
		t.Errorf("status says etcd shows no global leader though etcd could not be read:\n%s", r.stderr)
	}
}

func TestStatusTextShowsAllocationAndDegradedRegions(t *testing.T) {
	resp := &sluicev1.StatusResponse{
		Leader: false, LeaderAddr: "10.0.0.2:7500", Learning: true, Epoch: 4242,
		ContendedKeys: 7, ConfigRevision: 19,
		Regions: []*sluicev1.RegionStatus{
			{Region: "us-east", LastReportAgeMs: 250, LastSeq: 99},
			{Region: "eu-west", LastReportAgeMs: 12000, Silent: true, LastSeq: 40},
			{Region: "ap-south", LastReportAgeMs: -1, Silent: true},
		},
		Keys: []*sluicev1.KeyStatus{{
			Key:  &sluicev1.QuotaKey{Tenant: "acme", Class: "write"},
			Rate: 800, Burst: 1600, Demand: 1234.567,
			Regions: []*sluicev1.KeyRegionStatus{
				{Region: "us-east", Demand: 1000, Target: 533.333333, GrantedRate: 520, GrantedBurst: 1040, ValidMs: 4200, StaticRate: 400},
				{Region: "eu-west", Demand: 234.567, Target: 266.666667, GrantedRate: 200, GrantedBurst: 400, ValidMs: 0, StaticRate: 200},
			},
		}},
	}
	rep := statusReport{EtcdPrefix: "/sluice", GlobalAddr: "10.0.0.1:7500", Global: newGlobalView(resp, time.Now())}
	var out bytes.Buffer
	if err := writeStatusText(&out, &rep); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	wantContains(t, "status", text,
		"(standby; leader is 10.0.0.2:7500)", "learning:", "yes", "4242", "config revision:", "19",
		"degraded:", "ap-south, eu-west")
	// An allocator that reports no static-lease state: the old states.
	wantRow(t, text, "us-east", "250ms", "ago", "99", "-", "-", "ok")
	wantRow(t, text, "eu-west", "12s", "ago", "40", "-", "-", "DEGRADED", "(silent)")
	wantRow(t, text, "ap-south", "never", "0", "-", "-", "DEGRADED", "(silent)")
	wantRow(t, text, "acme/write", "800", "1600", "all", "1234.57", "800", "720", "1440", "-", "600")

	// The key table is aligned: every cell of a column starts where its
	// header starts.
	lines := strings.Split(text, "\n")
	header := -1
	for i, l := range lines {
		if strings.Contains(l, "DEMAND/S") {
			header = i
		}
	}
	if header < 0 || header+3 >= len(lines) {
		t.Fatalf("no key table:\n%s", text)
	}
	start := strings.Index(lines[header], "TARGET/S")
	for _, row := range lines[header+2 : header+4] {
		if len(row) <= start || row[start-1] != ' ' || row[start] == ' ' {
			t.Fatalf("TARGET/S column misaligned at %d in %q\n%s", start, row, text)
		}
	}
	wantRow(t, text, "us-east", "1000", "533.33", "520", "1040", "4.2s", "400")
	wantRow(t, text, "eu-west", "234.57", "266.67", "200", "400", "expired", "200")

	// JSON carries the same view, degraded regions included.
	back := throughJSON(t, rep)
	if got := back.Global.Degraded; len(got) != 2 || got[0] != "ap-south" || got[1] != "eu-west" {
		t.Fatalf("degraded in JSON = %v", got)
	}
}

// wantRow finds the line whose first field is first and checks that the
// next fields start with cells.
func wantRow(t *testing.T, out, first string, cells ...string) {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || fields[0] != first {
			continue
		}
		if len(fields)-1 >= len(cells) && strings.Join(fields[1:1+len(cells)], " ") == strings.Join(cells, " ") {
			return
		}
	}
	t.Fatalf("no row %q followed by %q in:\n%s", first, strings.Join(cells, " "), out)
}

// TestStatusTextShowsRegionStates: each region's static-lease state, what
// remains of its static lease and what the global tier reserves for it.
func TestStatusTextShowsRegionStates(t *testing.T) {
	now := time.Date(2026, 3, 4, 10, 20, 30, 0, time.UTC)
	resp := &sluicev1.StatusResponse{
		Leader: true, Epoch: 7,
		Regions: []*sluicev1.RegionStatus{
			{Region: "us-east", LastReportAgeMs: 150, LastSeq: 9, State: "live", StaticLeaseMs: 59850, ReservedFraction: 1},
			{Region: "eu-west", LastReportAgeMs: 5000, Silent: true, LastSeq: 8, State: "silent", StaticLeaseMs: 55000, ReservedFraction: 1},
			{Region: "ap-south", LastReportAgeMs: 90000, Silent: true, LastSeq: 7, State: "lapsed", ReservedFraction: 0},
			{Region: "sa-east", LastReportAgeMs: 100, LastSeq: 6, State: "returning", ReservedFraction: 0.25},
			{Region: "af-south", LastReportAgeMs: 100, LastSeq: 5, State: "drained", StaticLeaseMs: 60000, ReservedFraction: 0.5},
			{Region: "me-central", LastReportAgeMs: -1, Silent: true, State: "silent", StaticLeaseMs: 0, ReservedFraction: 1},
		},
	}
	rep := statusReport{EtcdPrefix: "/sluice", GlobalAddr: "10.0.0.1:7500", Global: newGlobalView(resp, now)}
	var out bytes.Buffer
	if err := writeStatusText(&out, &rep); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	clock := func(age time.Duration) string { return now.Add(-age).Local().Format("15:04:05.000") }
	wantContains(t, "status", text, "STATIC LEASE", "RESERVED")
	wantRow(t, text, "us-east", "150ms", "ago", "9", "59.85s", "100%", "live")
	wantRow(t, text, "eu-west", "5s", "ago", "8", "55s", "100%", "SILENT", "since", clock(5*time.Second), "(static", "lease", "still", "counted)")
	// Silent since its last report; the lease lapsed later, at a time the
	// allocator does not report.
	wantRow(t, text, "ap-south", "1m30s", "ago", "7", "none", "0%", "LEASE", "EXPIRED", "(silent", "since", clock(90*time.Second)+";", "lapsed:")
	wantRow(t, text, "sa-east", "100ms", "ago", "6", "none", "25%", "RETURNING")
	wantRow(t, text, "af-south", "100ms", "ago", "5", "1m0s", "50%", "DRAINED")
	wantRow(t, text, "me-central", "never", "0", "none", "100%", "SILENT", "(never", "heard;")

	back := throughJSON(t, rep)
	byName := map[string]regionView{}
	for _, r := range back.Global.Regions {
		byName[r.Region] = r
	}
	if ap := byName["ap-south"]; ap.State != "lapsed" || ap.SilentSince == nil || !ap.SilentSince.Equal(now.Add(-90*time.Second)) || ap.ReservedFraction != 0 {
		t.Fatalf("ap-south in JSON = %+v", ap)
	}
	if us := byName["us-east"]; us.State != "live" || us.SilentSince != nil || us.StaticLeaseMs != 59850 || us.ReservedFraction != 1 {
		t.Fatalf("us-east in JSON = %+v", us)
	}
}

// TestStatusWithTheGlobalLeaderDownSpeaksToTheOperator: etcd still names
// a global leader that no longer runs (its session has not expired yet,
// as during a failover). status exits 5 and says what could not be
// reached and why, that a failover may be under way, and what to do;
// without gRPC's own text (the status code, the transport's dial error),
// which is all it printed.
func TestStatusWithTheGlobalLeaderDownSpeaksToTheOperator(t *testing.T) {
	c := newCluster(t)
	wantCode(t, sluicectl(t, "", c.args("apply", "-f", sample(t), "-yes")...), exitOK)
	gone := grpctest.RefusedAddr(t)
	campaign(t, c.cli, c.store.ElectionPrefix()+"global", gone)
	for _, tc := range []struct {
		name string
		args []string
		next string
	}{
		{"the leader etcd names", nil, "give -global-addr"},
		{"the replica -global-addr names", []string{"-global-addr", gone}, "check -global-addr"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := sluicectl(t, "", c.args(append([]string{"status"}, tc.args...)...)...)
			wantCode(t, r, exitUnreachable)
			wantContains(t, "stderr", r.stderr, "cannot get status from the global allocator at "+gone+": it cannot be reached: connection refused",
				"a global failover may be in progress", "run status again", tc.next)
			for _, raw := range []string{"rpc error", "code = ", "transport:", "desc = "} {
				if strings.Contains(r.stderr, raw) {
					t.Errorf("stderr holds gRPC's text %q:\n%s", raw, r.stderr)
				}
			}
		})
	}
}

// TestSilentSinceIsTheInstantTheAllocatorStored: a silent region's
// "since" is the instant the allocator names for its last report, the
// same however late status asks (it was this machine's clock less the
// report's age, a different millisecond on each call).
func TestSilentSinceIsTheInstantTheAllocatorStored(t *testing.T) {
	last := time.Date(2026, 12, 3, 11, 59, 49, 753_000_000, time.UTC)
	// The allocator answers asked after the last report; the answer
	// reaches status a round trip later.
	for _, c := range []struct{ asked, trip time.Duration }{
		{5*time.Second + 400*time.Microsecond, 700 * time.Microsecond},
		{5*time.Second + 1200*time.Microsecond, 1900 * time.Microsecond},
		{time.Minute, 2600 * time.Microsecond},
	} {
		asked, now := c.asked, last.Add(c.asked+c.trip)
		resp := &sluicev1.StatusResponse{Leader: true, Regions: []*sluicev1.RegionStatus{
			{Region: "eu-west", LastReportAgeMs: asked.Milliseconds(), LastReportUnixMs: last.UnixMilli(), Silent: true, State: "silent", ReservedFraction: 1},
		}}
		v := newGlobalView(resp, now)
		if got := v.Regions[0].SilentSince; got == nil || !got.Equal(last) {
			t.Errorf("asked %v after the last report: silent since %v, want %v", asked, got, last)
		}
		var out bytes.Buffer
		if err := writeStatusText(&out, &statusReport{Global: v}); err != nil {
			t.Fatal(err)
		}
		wantContains(t, "status", out.String(), "SILENT since "+last.Local().Format("15:04:05.000")+" ")
	}
}

// TestStatusReportsARefusedStoredConfig: a tenant key written into etcd
// past sluicectl makes the stored config one the daemons refuse: status
// says so with the reason and exits 1, and lists the regions of the config
// the daemons run rather than calling every region unconfigured.
func TestStatusReportsARefusedStoredConfig(t *testing.T) {
	c := newCluster(t)
	wantCode(t, sluicectl(t, "", c.args("apply", "-f", sample(t), "-yes")...), exitOK)
	campaign(t, c.cli, c.store.ElectionPrefix()+"region/us-east", "10.1.0.7:7400")
	if _, err := c.cli.Put(t.Context(), c.store.TenantKey("t7"), "not json"); err != nil {
		t.Fatal(err)
	}
	r := sluicectl(t, "", c.args("status", "-global-addr", grpctest.RefusedAddr(t))...)
	wantCode(t, r, exitInvalid)
	wantContains(t, "stdout", r.stdout, "config:", "REFUSED")
	wantRow(t, r.stdout, "us-east", "10.1.0.7:7400", "1")
	if strings.Contains(r.stdout, "not in the config") {
		t.Fatalf("status calls configured regions unconfigured:\n%s", r.stdout)
	}
	wantContains(t, "stderr", r.stderr, "refused by the daemons", c.store.TenantKey("t7"), "sluicectl apply")
}

// TestStatusTextOnAShardOutsideTheConfig: a shard the config leaves out
// runs either ahead of a raise of global_shards (step 1 of resharding:
// its replicas start first) or after a lowering; the line says it owns no
// keys and gives both ways on, not only "stop its replicas", which undoes
// the first step of a raise.
func TestStatusTextOnAShardOutsideTheConfig(t *testing.T) {
	resp := &sluicev1.StatusResponse{Leader: true, LeaderAddr: "10.0.0.1:7500", Epoch: 9, ConfigRevision: 19}
	rep := statusReport{EtcdPrefix: "/sluice", GlobalAddr: "10.0.0.1:7500", Global: newGlobalView(resp, time.Now()),
		Shards: []shardView{
			{Shard: 1, Leader: &leaderView{Addr: "10.0.1.1:7500", Candidates: 2}, Global: newGlobalView(resp, time.Now())},
			{Shard: 2, Unconfigured: true, Leader: &leaderView{Addr: "10.0.2.1:7500", Candidates: 2}, Global: newGlobalView(resp, time.Now())},
		}}
	var out bytes.Buffer
	if err := writeStatusText(&out, &rep); err != nil {
		t.Fatal(err)
	}
	wantContains(t, "status", out.String(),
		"NOT IN THE CONFIG, which has 2 shards: owns no keys, its figures are not counted above; raise global_shards to include it, or stop its replicas")
}

// TestStatusTextShowsARegionSilentAtAnotherShard: with several global
// shards, a region that shard 0 hears but shard 1 does not (cut off from
// one shard alone) reads live in shard 0's columns and its STATE names
// shard 1's view, in text and JSON; a region every shard sees alike gets
// no such note. (The table was shard 0's alone, and read live.)
func TestStatusTextShowsARegionSilentAtAnotherShard(t *testing.T) {
	now := time.Date(2026, 3, 4, 10, 20, 30, 0, time.UTC)
	shard0 := &sluicev1.StatusResponse{Leader: true, Epoch: 7, Regions: []*sluicev1.RegionStatus{
		{Region: "us-east", LastReportAgeMs: 150, LastSeq: 9, State: "live", StaticLeaseMs: 59850, ReservedFraction: 1},
		{Region: "eu-west", LastReportAgeMs: 120, LastSeq: 8, State: "live", StaticLeaseMs: 59880, ReservedFraction: 1},
	}}
	shard1 := &sluicev1.StatusResponse{Leader: true, Epoch: 7, Regions: []*sluicev1.RegionStatus{
		{Region: "us-east", LastReportAgeMs: 200, LastSeq: 9, State: "live", StaticLeaseMs: 59800, ReservedFraction: 1},
		{Region: "eu-west", LastReportAgeMs: 7000, Silent: true, LastSeq: 5, State: "silent", StaticLeaseMs: 53000, ReservedFraction: 1},
	}}
	rep := statusReport{EtcdPrefix: "/sluice", GlobalAddr: "10.0.0.1:7500", Global: newGlobalView(shard0, now),
		Shards: []shardView{{Shard: 1, Leader: &leaderView{Addr: "10.0.1.1:7500", Candidates: 1}, Global: newGlobalView(shard1, now)}}}
	noteShardRegions(rep.Global, &rep.Shards[0])
	var out bytes.Buffer
	if err := writeStatusText(&out, &rep); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	since := now.Add(-7 * time.Second).Local().Format("15:04:05.000")
	wantRow(t, text, "eu-west", "120ms", "ago", "8", "59.88s", "100%", "live;", "at", "shard", "1:", "SILENT", "since", since)
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "us-east") && strings.Contains(line, "shard 1") {
			t.Errorf("us-east, which both shards hear, has a note of shard 1: %q", line)
		}
	}
	wantContains(t, "status", text, "the region columns are shard 0's view")
	back := throughJSON(t, rep)
	for _, r := range back.Global.Regions {
		switch r.Region {
		case "eu-west":
			if len(r.OtherShards) != 1 || r.OtherShards[0].Shard != 1 || r.OtherShards[0].State != "silent" || !r.OtherShards[0].Silent {
				t.Errorf("eu-west in JSON: other shards %+v, want shard 1 silent", r.OtherShards)
			}
		case "us-east":
			if len(r.OtherShards) != 0 {
				t.Errorf("us-east in JSON: other shards %+v, want none", r.OtherShards)
			}
		}
	}
}

// throughJSON is rep as status -json writes it, read back.
func throughJSON(t *testing.T, rep statusReport) statusReport {
	t.Helper()
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back statusReport
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	return back
}
