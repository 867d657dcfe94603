package luascripts

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestLeaseRecordsStayListpack: production-shaped leases (a wall-clock seq,
// a random 64-bit incarnation, a long instance id) are written compact,
// within Redis's 64-byte listpack value limit, so a key's bucket hash,
// which holds them, stays a listpack with one lease and with three; the
// records read back exactly.
func TestLeaseRecordsStayListpack(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client()
	sc := New()
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "t0000001", Class: "write"})
	seq := uint64(time.Now().UnixMicro())
	incs := []uint64{18446744073709551615, 10000000000, 7}
	for i, id := range []string{"api-7f9c4d5b8-x2k4q-1.9f3a61c2", "api-7f9c4d5b8-m8t2z-1.04be7d19", "api-7f9c4d5b8-q5w7n-1.c2d81e70"} {
		r := Report{Instance: id, Incarnation: incs[i], Lease: seq, Seq: seq + 3, Used: 0, Want: 20, Min: 1, BuiltUS: 86_400_000_000}
		if lr, err := sc.Sync(ctx, rdb, k, expiryCommon, r); err != nil || lr.Granted != 20 {
			t.Fatalf("lease %s: %+v, %v", id, lr, err)
		}
		if enc := rdb.ObjectEncoding(ctx, k.Bucket).Val(); enc != "listpack" {
			t.Fatalf("%d leases: bucket hash encoded %q, want listpack", i+1, enc)
		}
		rec := leaseRecordOf(ctx, t, rdb, k, id)
		if len(rec) > 64 {
			t.Fatalf("record %q is %d bytes, want at most 64", rec, len(rec))
		}
		l, err := ParseLeaseRecord(rec)
		if err != nil {
			t.Fatal(err)
		}
		if l.Granted != 20 || l.Seq != seq+3 || l.Lease != seq || l.LastGrant != 20 || l.WindowStartUS != 86_400_000_000 ||
			!l.Fingerprint || l.Incarnation != r.incString() || l.ExpiryUS <= 0 {
			t.Fatalf("record of %s reads back as %+v", id, l)
		}
	}
}

func (r Report) incString() string { return r.leaseArgs()[1].(string) }

// TestLeaseRecordForms: numbers a compact record cannot carry (negative
// ones here) are written as text, by the scripts and the Model alike; a
// text record written by older scripts is read, continued and rewritten
// compact.
func TestLeaseRecordForms(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client()
	sc := newVirtual()
	m := NewModel()
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	now := int64(1_800_000_000_000_000)
	sc.setNow(now)
	r := Report{Instance: "i-a", Incarnation: 9, Lease: 1, Seq: 1, Used: -5, Want: 10, Min: 1}
	want := m.Sync(now, k, expiryCommon, r)
	got, err := sc.Sync(ctx, rdb, k, expiryCommon, r)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("sync: lua %+v, %v; model %+v", got, err, want)
	}
	rec := leaseRecordOf(ctx, t, rdb, k, "i-a")
	if ms := m.Snapshot()[k.Bucket][leaseField("i-a")]; rec != ms || len(strings.Fields(rec)) != 14 {
		t.Fatalf("record %q, model %q: want the same fourteen text fields", rec, ms)
	}

	// Numbers below 2^53 are written compact, exactly (the low byte of
	// one within 128 of 2^53 used to be rounded: a wrong byte, or an
	// invalid one failing the script), 2^53 itself as text.
	for _, tc := range []struct {
		seq     uint64
		compact bool
	}{{1<<53 - 129, true}, {1<<53 - 3, true}, {1<<53 - 1, true}, {1 << 53, false}} {
		id := "i-seq-" + itoa(int64(tc.seq))
		r := Report{Instance: id, Incarnation: 9, Lease: 1, Seq: tc.seq, Want: 1, Min: 1}
		want := m.Sync(now, k, expiryCommon, r)
		got, err := sc.Sync(ctx, rdb, k, expiryCommon, r)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("sync seq %d: lua %+v, %v; model %+v", tc.seq, got, err, want)
		}
		rec := leaseRecordOf(ctx, t, rdb, k, id)
		if ms := m.Snapshot()[k.Bucket][leaseField(id)]; rec != ms || (rec[0] == compactMark) != tc.compact {
			t.Fatalf("seq %d: record %q, model %q; want the same, compact %v", tc.seq, rec, ms, tc.compact)
		}
	}

	// Older scripts' text record of a live lease (in their layout: the
	// records in the lease hash): granted 10, used 4, seq 1, expiring in
	// 500ms, fingerprint (used 4) of incarnation 9.
	exp := itoa(now + 500_000)
	old := "10 4 0 1 " + exp + " 10 " + itoa(now) + " 0 0 4 0 0 1 9"
	toOlderLayout(ctx, t, rdb, k)
	if err := rdb.HSet(ctx, k.Leases, "i-b", old).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HIncrBy(ctx, k.Bucket, "out", 6).Err(); err != nil {
		t.Fatal(err)
	}
	lr, err := sc.Sync(ctx, rdb, k, expiryCommon, Report{Instance: "i-b", Incarnation: 9, Lease: 1, Seq: 2, Used: 10, Want: 5, Min: 1})
	if err != nil || lr.Conflict || lr.Duplicate || lr.Granted != 5 {
		t.Fatalf("continuing an older record: %+v, %v", lr, err)
	}
	rec = leaseRecordOf(ctx, t, rdb, k, "i-b")
	l, err := ParseLeaseRecord(rec)
	if err != nil || rec[0] != compactMark || l.Granted != 15 || l.Used != 10 || l.Seq != 2 || l.AppliedUsed != 10 || l.Incarnation != "9" {
		t.Fatalf("rewritten record %q: %+v, %v; want compact, granted 15, used 10, seq 2", rec, l, err)
	}
	// The call moved every record of the older layout into the bucket.
	if rdb.Exists(ctx, k.Leases).Val() != 0 {
		t.Fatal("the older lease hash outlived the call that moved its records")
	}
	b := rdb.HGetAll(ctx, k.Bucket).Val()
	if recs := recordsOf(b); len(recs) != 6 || b["n"] != "6" || b["tk"] != "" || b["t"] == "" {
		t.Fatalf("bucket after the move %v: want six records, n 6, the tokens in t", b)
	}
}
