package luascripts

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestEveryCallPastItsDeadlineAnswersTooLate: through every way the Go
// side runs a script (one call, a pipeline of many, a queued call parsed
// later), a call whose deadline is 1µs of Redis time (any time Redis
// reads is past it) changes nothing and answers an error matching
// ErrTooLate, a *TooLateError with its deadline and the Redis time it ran
// at, and a reply with only TooLate and that time set. A deadline of 0
// is none: the same calls act.
func TestEveryCallPastItsDeadlineAnswersTooLate(t *testing.T) {
	// A lease out and a bucket with tokens left: every call below would
	// write.
	_, rdb, sc, k, base := leaseOut(t)
	ctx := context.Background()
	next := Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 2, Used: 10, Want: 30, Min: 1}
	other := Report{Instance: "i-b", Incarnation: 1, Lease: 1, Seq: 1, Want: 20, Min: 1}

	calls := []struct {
		name string
		run  func(c Common) (any, error)
	}{
		{"Acquire", func(c Common) (any, error) { return sc.Acquire(ctx, rdb, k, c, other) }},
		{"Sync", func(c Common) (any, error) { return sc.Sync(ctx, rdb, k, c, next) }},
		{"SyncMany", func(c Common) (any, error) {
			r := sc.SyncMany(ctx, rdb, []SyncItem{{Keys: k, Common: c, Report: next}})[0]
			return r.Reply, r.Err
		}},
		{"Release", func(c Common) (any, error) { return sc.Release(ctx, rdb, k, c, next) }},
		{"ReleaseMany", func(c Common) (any, error) {
			r := sc.ReleaseMany(ctx, rdb, []SyncItem{{Keys: k, Common: c, Report: next}})[0]
			return r.Reply, r.Err
		}},
		{"Check", func(c Common) (any, error) { return sc.Check(ctx, rdb, k, c, 5) }},
		{"QueueCheck", func(c Common) (any, error) {
			q := RunQueued(ctx, rdb, func(p redis.Pipeliner) []*Queued { return []*Queued{sc.QueueCheck(ctx, p, k, c, 5)} })[0]
			return ParseCheck(q)
		}},
		{"QueueAcquire", func(c Common) (any, error) {
			q := RunQueued(ctx, rdb, func(p redis.Pipeliner) []*Queued { return []*Queued{sc.QueueAcquire(ctx, p, k, c, other)} })[0]
			return ParseLease(q)
		}},
		{"Reap", func(c Common) (any, error) { return sc.Reap(ctx, rdb, k, c) }},
		{"SetRate", func(c Common) (any, error) {
			return sc.SetRate(ctx, rdb, k, c, 50, 200, 4_000_000_000_000_000, 1, 0)
		}},
		{"SetRateMany", func(c Common) (any, error) {
			r := sc.SetRateMany(ctx, rdb, []SetRateItem{{Keys: k, Common: c, Rate: 50, Burst: 200,
				ExpiryUS: 4_000_000_000_000_000, IssuedUS: 1}})[0]
			return r.Reply, r.Err
		}},
		{"State", func(c Common) (any, error) { return sc.State(ctx, rdb, k, c) }},
		{"StateMany", func(c Common) (any, error) {
			r := sc.StateMany(ctx, rdb, []KeyCommon{{Keys: k, Common: c}})[0]
			return r.State, r.Err
		}},
	}

	redisNow := func() int64 {
		t.Helper()
		tm, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMicro()
	}
	before, err := redistest.Snapshot(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	late := base
	late.DeadlineUS = 1
	for _, call := range calls {
		from := redisNow()
		got, err := call.run(late)
		var tl *TooLateError
		if !errors.As(err, &tl) || !errors.Is(err, ErrTooLate) {
			t.Fatalf("%s past its deadline: %+v, error %v, want too late", call.name, got, err)
		}
		if tl.DeadlineUS != 1 || tl.NowUS < from {
			t.Fatalf("%s: too late %+v, want deadline 1 and a Redis time from %d on", call.name, tl, from)
		}
		v := reflect.ValueOf(got)
		if !v.FieldByName("TooLate").Bool() || v.FieldByName("NowUS").Int() != tl.NowUS || !reflect.DeepEqual(zeroBut(got), got) {
			t.Fatalf("%s: answered %+v, want only TooLate and NowUS %d", call.name, got, tl.NowUS)
		}
	}
	after, err := redistest.Snapshot(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	if err := redistest.Unchanged(before, after); err != nil {
		t.Fatalf("calls past their deadline changed the state: %v", err)
	}

	// No deadline: every call acts.
	for _, call := range calls {
		got, err := call.run(base)
		if err != nil || reflect.ValueOf(got).FieldByName("TooLate").Bool() {
			t.Fatalf("%s with no deadline: %+v, error %v", call.name, got, err)
		}
	}
	after, err = redistest.Snapshot(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	if redistest.Unchanged(before, after) == nil {
		t.Fatal("calls with no deadline changed nothing: the test cannot tell")
	}
}

// TestCommonRefusesANegativeDeadline: a deadline is a Redis time or 0
// (none); a negative one is refused.
func TestCommonRefusesANegativeDeadline(t *testing.T) {
	for _, tc := range []struct {
		dl int64
		ok bool
	}{{-1, false}, {0, true}, {1, true}} {
		c := deadlineCommon()
		c.DeadlineUS = tc.dl
		if err := c.Validate(); (err == nil) != tc.ok {
			t.Errorf("deadline %d: Validate() = %v, want ok %v", tc.dl, err, tc.ok)
		}
	}
}

// replyErr is an error reply as Redis sends it (go-redis's redis.Error).
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

// TestOnlyAWellFormedTooLateReplyIsTooLate: a script's error is too late
// only when it is a Redis error reply 'TOOLATE <now> <deadline>' with both
// times decimal (wrapped too); every other error, a reply naming other
// numbers included, comes back as it is.
func TestOnlyAWellFormedTooLateReplyIsTooLate(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want *TooLateError
	}{
		{"too late", replyErr("TOOLATE 1700000000000009 1700000000000000"), &TooLateError{NowUS: 1700000000000009, DeadlineUS: 1700000000000000}},
		{"wrapped", fmt.Errorf("pipeline: %w", replyErr("TOOLATE 99 9")), &TooLateError{NowUS: 99, DeadlineUS: 9}},
		{"the largest times", replyErr("TOOLATE 9223372036854775807 9223372036854775806"), &TooLateError{NowUS: 9223372036854775807, DeadlineUS: 9223372036854775806}},
		{"another reply with two numbers", replyErr("ERR 5 3"), nil},
		{"no deadline", replyErr("TOOLATE 5"), nil},
		{"a bare word", replyErr("TOOLATE"), nil},
		{"a short reply", replyErr("ERR"), nil},
		{"a time out of range", replyErr("TOOLATE 9223372036854775808 1"), nil},
		{"a deadline not decimal", replyErr("TOOLATE 5 x"), nil},
		{"a time not decimal", replyErr("TOOLATE x 5"), nil},
		{"not a reply", errors.New("TOOLATE 5 3"), nil},
		{"no answer", context.Canceled, nil},
	} {
		tl, err := scriptErr("check", "sl:{t}:b", tc.err)
		if !reflect.DeepEqual(tl, tc.want) {
			t.Errorf("%s: too late %+v, want %+v", tc.name, tl, tc.want)
		}
		if !errors.Is(err, tc.err) && tc.want == nil {
			t.Errorf("%s: error %v does not wrap %v", tc.name, err, tc.err)
		}
		if errors.Is(err, ErrTooLate) != (tc.want != nil) {
			t.Errorf("%s: error %v matches ErrTooLate %v, want %v", tc.name, err, errors.Is(err, ErrTooLate), tc.want != nil)
		}
		var got *TooLateError
		if errors.As(err, &got) != (tc.want != nil) || (tc.want != nil && *got != *tc.want) {
			t.Errorf("%s: error %v as a *TooLateError %+v, want %+v", tc.name, err, got, tc.want)
		}
		if isTL, now := late(tl); isTL != (tc.want != nil) || (tc.want != nil && now != tc.want.NowUS) || (tc.want == nil && now != 0) {
			t.Errorf("%s: late() = %v, %d", tc.name, isTL, now)
		}
	}
}
