package luascripts

import (
	"context"
	"errors"
	"net"
	"reflect"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/quota"
)

// writeConn is a connection that reports each write it completed: a
// command written to a paused Redis waits in the kernel for it.
type writeConn struct {
	net.Conn
	wrote chan struct{}
}

func (c *writeConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	select {
	case c.wrote <- struct{}{}:
	default:
	}
	return n, err
}

// deadlineCommon is a key's settings for the deadline tests: a bucket of
// 100 at 10/s, leases of 10s.
func deadlineCommon() Common {
	return Common{StaticRate: 10, StaticBurst: 100, LeaseTTL: 10 * time.Second, Reclaim: true, ReapBudget: 8,
		DemandWindow: 300 * time.Millisecond, MarkEvery: 250 * time.Millisecond}
}

// TestScriptsQueuedInAPausedRedisPastTheirDeadlineChangeNothing: every
// script sent to a Redis paused (SIGSTOP) with a deadline that passes
// before Redis resumes runs on resume and changes nothing (bucket, leases,
// their TTLs, the candidate set, byte for byte) and answers too late with
// the Redis time it ran at. The same calls with a deadline after the
// resume act (the control: the calls would change the state).
func TestScriptsQueuedInAPausedRedisPastTheirDeadlineChangeNothing(t *testing.T) {
	// A lease out and a bucket with tokens left: every call below would
	// write (refill, book, grant, reap, mark).
	srv, rdb, sc, k, c := leaseOut(t)
	ctx := context.Background()

	// One connection, made before the pause: the calls are written to the
	// paused server at once.
	wrote := make(chan struct{}, 1)
	queued := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 1, MaxRetries: -1, ReadTimeout: -1, WriteTimeout: -1,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &writeConn{Conn: conn, wrote: wrote}, nil
		}})
	t.Cleanup(func() { _ = queued.Close() })

	// send sends every script (and a batched state read) with deadline dl
	// to the paused server in one pipeline, resumes it once they were
	// written, and returns each call's error and the Redis time it ran at
	// when answered too late (-1 when it acted).
	send := func(dl int64) ([]error, []int64) {
		t.Helper()
		if err := queued.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-wrote:
		default:
		}
		cd := c
		cd.DeadlineUS = dl
		srv.Pause()
		done := make(chan []*Queued, 1)
		go func() {
			var qs []*Queued
			_, _ = queued.Pipelined(ctx, func(p redis.Pipeliner) error {
				next := Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 2, Used: 10, Want: 30, Min: 1}
				other := Report{Instance: "i-b", Incarnation: 1, Lease: 1, Seq: 1, Want: 20, Min: 1}
				qs = []*Queued{
					sc.QueueAcquire(ctx, p, k, cd, other),
					queue(ctx, p, sc.sync, k.list(), sc.syncArgs(k, cd, next)),
					sc.QueueCheck(ctx, p, k, cd, 5),
					queue(ctx, p, sc.reap, k.list(), sc.args(k, cd)),
					queue(ctx, p, sc.setRate, k.list(), sc.args(k, cd, fmtFloat(50), fmtFloat(200), dl+60e6, 1)),
					queue(ctx, p, sc.state, k.list(), sc.args(k, cd)),
					queue(ctx, p, sc.release, k.list(), sc.args(k, cd, next.releaseArgs()...)),
					queue(ctx, p, sc.stateBatch, k.list(), append([]any{len(sc.args(k, cd))}, sc.args(k, cd)...)),
				}
				return nil
			})
			done <- qs
		}()
		<-wrote // the calls wait in the paused server's socket
		srv.Resume()
		qs := <-done
		errs := make([]error, len(qs))
		nows := make([]int64, len(qs))
		for i, q := range qs {
			res, err := q.Cmd.Slice()
			if err == nil && i == len(qs)-1 {
				// The batch: its one key's entry.
				if e, ok := res[0].(error); ok {
					err = e
				} else {
					res = res[0].([]any)
				}
			}
			if err != nil {
				tl, err := scriptErr("call", k.Bucket, err)
				errs[i] = err
				if tl != nil {
					nows[i] = tl.NowUS
				}
				continue
			}
			nows[i] = -1 // acted
		}
		return errs, nows
	}

	redisNow := func() int64 {
		t.Helper()
		tm, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMicro()
	}

	// Past its deadline on resume: nothing changes. The deadline is the
	// last Redis time read before the pause (a bound of 0): whenever the
	// stopped server runs the calls, it is past it.
	before, err := redistest.Snapshot(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	dl := redisNow()
	errs, nows := send(dl)
	for i, err := range errs {
		var tl *TooLateError
		if !errors.As(err, &tl) || !errors.Is(err, ErrTooLate) {
			t.Fatalf("call %d with deadline %d: error %v, want too late", i, dl, err)
		}
		if tl.DeadlineUS != dl || nows[i] <= dl {
			t.Fatalf("call %d: answered %+v for deadline %d", i, tl, dl)
		}
	}
	after, err := redistest.Snapshot(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	if err := redistest.Unchanged(before, after); err != nil {
		t.Fatalf("calls past their deadline changed the state: %v", err)
	}

	// The control: the same calls with a deadline after the resume act.
	errs, nows = send(redisNow() + 3600e6)
	for i, err := range errs {
		if err != nil || nows[i] != -1 {
			t.Fatalf("call %d within its deadline: error %v", i, err)
		}
	}
	after, err = redistest.Snapshot(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	if redistest.Unchanged(before, after) == nil {
		t.Fatal("calls within their deadline changed nothing: the test cannot tell")
	}
}

// TestModelPastItsDeadlineChangesNothing: the Model, exactly at the
// deadline, still acts; a microsecond past it (or past a deadline of 1µs,
// the earliest) every operation changes nothing and answers TooLate with
// its now, as the scripts do.
func TestModelPastItsDeadlineChangesNothing(t *testing.T) {
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	const t0 = int64(1_700_000_000_000_000)
	ops := []struct {
		name string
		run  func(m *Model, now int64, c Common) (any, bool)
	}{
		{"acquire", func(m *Model, now int64, c Common) (any, bool) {
			r := m.Acquire(now, k, c, Report{Instance: "i-b", Incarnation: 1, Lease: 1, Seq: 1, Want: 20, Min: 1})
			return r, r.TooLate
		}},
		{"sync", func(m *Model, now int64, c Common) (any, bool) {
			r := m.Sync(now, k, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 2, Used: 10, Want: 30, Min: 1})
			return r, r.TooLate
		}},
		{"release", func(m *Model, now int64, c Common) (any, bool) {
			r := m.Release(now, k, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 2, Used: 10})
			return r, r.TooLate
		}},
		{"check", func(m *Model, now int64, c Common) (any, bool) {
			r := m.Check(now, k, c, 5)
			return r, r.TooLate
		}},
		{"reap", func(m *Model, now int64, c Common) (any, bool) {
			r := m.Reap(now, k, c)
			return r, r.TooLate
		}},
		{"set_rate", func(m *Model, now int64, c Common) (any, bool) {
			r := m.SetRate(now, k, c, 50, 200, now+60e6, 1, 0)
			return r, r.TooLate
		}},
		{"state", func(m *Model, now int64, c Common) (any, bool) {
			r := m.State(now, k, c)
			return r, r.TooLate
		}},
	}
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			for _, tc := range []struct {
				name string
				at   int64 // µs after the deadline
				late bool
			}{
				{"at the deadline", 0, false},
				{"past the deadline", 1, true},
				// 1µs is the earliest deadline (0 is none).
				{"past the earliest deadline", t0 + 2_000_000 - 1, true},
			} {
				m := NewModel()
				c := deadlineCommon()
				if lr := m.Acquire(t0, k, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: 30, Min: 1}); lr.Granted != 30 {
					t.Fatalf("acquire: %+v", lr)
				}
				before, refilled := m.Snapshot(), m.refilled
				now := t0 + 2_000_000
				c.DeadlineUS = now - tc.at
				got, late := op.run(m, now, c)
				if late != tc.late {
					t.Fatalf("%s: answered %+v, too late %v, want %v", tc.name, got, late, tc.late)
				}
				unchanged := reflect.DeepEqual(before, m.Snapshot()) && m.refilled == refilled
				if tc.late {
					if !unchanged {
						t.Fatalf("%s: changed the state", tc.name)
					}
					if v := reflect.ValueOf(got); v.FieldByName("NowUS").Int() != now || !v.FieldByName("TooLate").Bool() ||
						!reflect.DeepEqual(zeroBut(got), got) {
						t.Fatalf("%s: answered %+v, want only TooLate and NowUS %d", tc.name, got, now)
					}
				} else if unchanged {
					t.Fatalf("%s: changed nothing: the test cannot tell", tc.name)
				}
			}
		})
	}
}

// zeroBut is r with every field zero but TooLate and NowUS.
func zeroBut(r any) any {
	v := reflect.ValueOf(r)
	z := reflect.New(v.Type()).Elem()
	z.FieldByName("TooLate").Set(v.FieldByName("TooLate"))
	z.FieldByName("NowUS").Set(v.FieldByName("NowUS"))
	return z.Interface()
}

// leaseOut is a fresh redis-server with the scripts loaded and key
// acme/read holding a lease of 30 tokens for instance i-a (seq 1) under
// deadlineCommon's settings, which it returns.
func leaseOut(t *testing.T) (*redistest.Server, *redis.Client, *Scripts, Keys, Common) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	sc := New()
	if err := sc.Load(ctx, rdb); err != nil {
		t.Fatal(err)
	}
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	c := deadlineCommon()
	first := Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: 30, Min: 1}
	if lr, err := sc.Acquire(ctx, rdb, k, c, first); err != nil || lr.Granted != 30 {
		t.Fatalf("acquire: %+v, %v", lr, err)
	}
	return srv, rdb, sc, k, c
}
