package luascripts

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/*.lua
var luaFS embed.FS

// Common are the per-key settings every script takes, derived by the
// regional service from the config. All fields are required.
type Common struct {
	// StaticRate is the region's static share s_r (tokens/s, >= 0), used
	// whenever no grant from the global tier is valid: 0 on a floor of 0
	// (drained, or off the static lease at partition_share 0) and while a
	// share is awaited.
	StaticRate float64
	// StaticBurst is the region's static burst cap (tokens, >= 0).
	StaticBurst float64
	// LeaseTTL is how long a lease lives after its last grant (> 0, whole
	// milliseconds).
	LeaseTTL time.Duration
	// Reclaim returns an expired lease's unspent tokens to the bucket when
	// true ("reclaim: reported"); they are forfeited when false ("none").
	Reclaim bool
	// RestartWait is how long after the birth of a data set (its born
	// sentinel, Keys.Born) a bucket missing from it starts empty and earns
	// nothing (RestartWait gives the regional service's value; whole
	// milliseconds). The scripts read the sentinel themselves, in the call
	// that creates the bucket, and write it when it is missing: a Redis
	// that restarted empty is dated from the first call that noticed, never
	// from what a caller read before the restart. With it, the scripts also
	// keep the data set's write generation and re-birth a data set that
	// went back in time (see Generations); a bucket last refilled before
	// born + RestartWait is then treated as missing. 0: no restart guard, a
	// missing bucket is full (tests, development).
	RestartWait time.Duration
	// ReapBudget bounds how many expired leases one call reaps (>= 0).
	ReapBudget int
	// DemandWindow is the shortest window over which a lease measures its
	// instance's demand rate (>= 1ms, whole milliseconds); the regional
	// service passes half the instances' refresh, so a window closes at
	// about every Sync and a refill report in between rarely ends one.
	DemandWindow time.Duration
	// MarkEvery is how often at most a script reads the key's demand to
	// mark it into its candidate set (Keys.Cand; whole milliseconds): the
	// regional service passes a quarter epoch. 0: the scripts never mark
	// (a region with no global tier).
	MarkEvery time.Duration
	// DeadlineUS is the latest Redis time (µs) at which a script may still
	// act on these settings: the caller chose the static share (or floor),
	// and a grant, from its clock for a call that runs within its bound on
	// Redis. A script that runs later changes nothing and fails with a
	// *TooLateError (ErrTooLate); the Model answers TooLate the same way.
	// 0: no deadline (tests, tools).
	DeadlineUS int64
	// AwaitingShare says that a StaticBurst of 0 is a share the region
	// awaits, not a floor: every config the region runs that knows the key
	// gives it a share, and the 0 comes only from one that does not know
	// its class (or the region) until the global tier confirms the newer
	// one (regionsync.Chain.Awaiting; never set on a floor, drained or off
	// the static lease). A call that would then create the key's bucket
	// empty holds the key instead: no bucket and no lease are written, so
	// the key is born at its cap once the share arrives, as a key first
	// used then would be; its demand is kept (lib.lua, "Awaited share").
	AwaitingShare bool
	// ShareFill is how long the key's static share, without a floor,
	// takes to refill its burst: the class's burst over its rate, which
	// bounds every region's share (whole milliseconds, rounded up). A
	// key's TTL is twice its refills at the static rate; at a static cap
	// of 0 (a floor, or a share awaited) that bound is the share coming
	// back, and the keys live twice ShareFill after their last write (or
	// the end of a grant in force), at least 2 x LeaseTTL, plus a second
	// (lib.lua, bucket_ttl). 0: not known (tests, tools): 2 x LeaseTTL.
	ShareFill time.Duration
	// RiseUS is the Redis time (µs) from which the region's static share
	// of the key stands above its floor (FloorRate, FloorBurst): the last
	// time the region came back from a floor, its static lease conferred
	// again after it ended or a drain lifted (regionsync). Optional; 0 =
	// none known. The global tier may have counted the region at its
	// floor before it, and given the rest to other regions, so the
	// scripts credit a bucket idle across it at most its floor up to
	// RiseUS (capped at FloorBurst) and the static share only since, and
	// a bucket missing then is born as one idle since long before: full
	// at FloorBurst at RiseUS, refilled at StaticRate since (lib.lua,
	// refill; docs/architecture.md, "Coming back from a floor").
	RiseUS int64
	// FloorRate and FloorBurst are the key's floor (tokens/s and tokens,
	// >= 0; regionsync.FloorOf of the static share): what the region ran
	// on before RiseUS. Read only with RiseUS > 0; the scripts take them
	// at most StaticRate and StaticBurst.
	FloorRate, FloorBurst float64
}

// FillTime is how long rate (tokens/s) takes to refill burst (tokens):
// Common.ShareFill for a key whose class has these limits (every region's
// static share refills its burst within it). 0 for a rate or burst that
// is not positive; at most the largest TTL the scripts set (2^43 ms).
func FillTime(rate, burst float64) time.Duration {
	if !(rate > 0) || !(burst > 0) {
		return 0
	}
	s := burst / rate
	if !(s < maxMS/1000) {
		return maxMS * time.Millisecond
	}
	return time.Duration(math.Ceil(s * 1e9))
}

// fillMS is ShareFill in whole milliseconds, rounded up.
func (c Common) fillMS() int64 {
	ms := c.ShareFill / time.Millisecond
	if c.ShareFill%time.Millisecond > 0 {
		ms++
	}
	return int64(ms)
}

func (c Common) args(extra ...any) []any {
	reclaim := "0"
	if c.Reclaim {
		reclaim = "1"
	}
	a := make([]any, 0, 7+len(extra)+9)
	a = append(a, fmtFloat(c.StaticRate), fmtFloat(c.StaticBurst), c.LeaseTTL.Milliseconds(), reclaim, c.RestartWait.Milliseconds(), c.ReapBudget,
		c.DemandWindow.Milliseconds())
	return append(a, extra...)
}

// Validate checks the settings a script would otherwise trip over.
func (c Common) Validate() error {
	switch {
	case !(c.StaticRate >= 0) || isInf(c.StaticRate):
		return fmt.Errorf("static rate %v must be a non-negative number", c.StaticRate)
	case !(c.StaticBurst >= 0) || isInf(c.StaticBurst):
		return fmt.Errorf("static burst %v must be a non-negative number", c.StaticBurst)
	case c.LeaseTTL < time.Millisecond:
		return fmt.Errorf("lease TTL %v must be at least 1ms", c.LeaseTTL)
	case c.RestartWait < 0:
		return fmt.Errorf("restart wait %v must not be negative", c.RestartWait)
	case c.ReapBudget < 0:
		return fmt.Errorf("reap budget %d must not be negative", c.ReapBudget)
	case c.DemandWindow < time.Millisecond:
		return fmt.Errorf("demand window %v must be at least 1ms", c.DemandWindow)
	case c.MarkEvery < 0:
		return fmt.Errorf("mark interval %v must not be negative", c.MarkEvery)
	case c.DeadlineUS < 0:
		return fmt.Errorf("deadline %d must not be negative", c.DeadlineUS)
	case c.ShareFill < 0:
		return fmt.Errorf("share fill time %v must not be negative", c.ShareFill)
	case c.RiseUS < 0:
		return fmt.Errorf("rise time %d must not be negative", c.RiseUS)
	case !(c.FloorRate >= 0) || isInf(c.FloorRate):
		return fmt.Errorf("floor rate %v must be a non-negative number", c.FloorRate)
	case !(c.FloorBurst >= 0) || isInf(c.FloorBurst):
		return fmt.Errorf("floor burst %v must be a non-negative number", c.FloorBurst)
	}
	return nil
}

// fmtFloat formats a float so Lua's tonumber reads back the same double.
func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'g', 17, 64) }

func isInf(f float64) bool { return f > 1e300 || f < -1e300 }

// checkGrant refuses a grant set_rate must not install: a rate, burst or
// deposit that is negative, NaN or infinite.
func checkGrant(k Keys, rate, burst, deposit float64) error {
	if !(rate >= 0) || !(burst >= 0) || !(deposit >= 0) || isInf(rate) || isInf(burst) || isInf(deposit) {
		return fmt.Errorf("set_rate %s: rate %v, burst %v and deposit %v must be non-negative numbers", k.Bucket, rate, burst, deposit)
	}
	return nil
}

// Report is an instance's report for one key (see the KeyReport message).
// Used, Denied and Returned are the lease's cumulative totals: the scripts
// book what they add to the totals of the last applied report.
type Report struct {
	Instance string
	// Incarnation tells apart processes that report under the same
	// Instance: a report of another incarnation than the lease's is a
	// conflict.
	Incarnation uint64
	// Lease is the instance's lease number on the key: the seq of the
	// lease's first report.
	Lease    uint64
	Seq      uint64
	Used     int64
	Denied   int64
	Returned int64
	Want     int64
	Min      int64
	// BookOnly books the report against a lease the instance already
	// holds and opens none (the key's class is strict now). Want must be 0.
	BookOnly bool
	// BuiltUS is when the instance built the report, in µs on its own
	// monotonic clock (0 = not given: the scripts use Redis time at
	// arrival). The lease's demand windows are measured on it.
	BuiltUS int64
}

func (r Report) leaseArgs() []any {
	return []any{r.Instance, strconv.FormatUint(r.Incarnation, 10), r.Lease, r.Seq, r.Used, r.Denied, r.Returned}
}

func (r Report) releaseArgs() []any { return append(r.leaseArgs(), max(r.BuiltUS, 0)) }

func (r Report) opArgs() []any {
	open := "1"
	if r.BookOnly {
		open = "0"
	}
	return append(r.leaseArgs(), r.Want, r.Min, open, max(r.BuiltUS, 0))
}

// LeaseReply is the answer of acquire and sync.
type LeaseReply struct {
	Granted    int64
	TTL        time.Duration // whole lease validity from the request's send time
	Remaining  int64         // floor of the bucket's tokens
	RetryAfter time.Duration // when nothing was granted; -1ns when the rate is zero
	Rate       float64       // current refill rate (tokens/s)
	Cap        float64       // current burst cap (tokens)
	Live       int64         // live leases on the key
	Reset      time.Duration // until the bucket is full again
	NowUS      int64         // Redis time the script ran at
	Duplicate  bool          // the report was a retry of an applied one, or stale
	Reclaimed  int64         // tokens this call returned from expired leases
	// Returned is the tokens the report gave back (its returned total's
	// growth) that were put back in the bucket: at most what the lease
	// still showed unspent.
	Returned int64
	// Conflict: the report was not the lease's next one nor a retry of an
	// applied one (another process reports under the same instance id).
	// Nothing was granted and the lease was forfeited.
	Conflict bool
	// TooLate: the script ran after its deadline (Common.DeadlineUS) and
	// changed nothing; only NowUS is set.
	TooLate bool
	// Gen is the data set's write generation after the call (0 without
	// the restart guard), Reborn whether the call found the data set gone
	// back in time and re-birthed it (see Generations).
	Gen    int64
	Reborn bool
}

// CheckReply is the answer of check.
type CheckReply struct {
	Allowed    bool
	Remaining  int64
	RetryAfter time.Duration
	Reset      time.Duration
	Rate, Cap  float64
	NowUS      int64
	Reclaimed  int64 // tokens this call returned from expired leases
	TooLate    bool  // see LeaseReply.TooLate
	Gen        int64 // see LeaseReply.Gen
	Reborn     bool  // see LeaseReply.Reborn
}

// ReleaseReply is the answer of release.
type ReleaseReply struct {
	Returned int64
	NowUS    int64
	Conflict bool  // see LeaseReply.Conflict
	TooLate  bool  // see LeaseReply.TooLate
	Gen      int64 // see LeaseReply.Gen
	Reborn   bool  // see LeaseReply.Reborn
}

// ReapReply is the answer of reap.
type ReapReply struct {
	Reaped, Returned, Live int64
	NowUS                  int64
	TooLate                bool  // see LeaseReply.TooLate
	Gen                    int64 // see LeaseReply.Gen
	Reborn                 bool  // see LeaseReply.Reborn
}

// SetRateReply is the answer of set_rate.
type SetRateReply struct {
	Applied     bool
	Tokens      float64
	Outstanding int64
	NowUS       int64
	Reclaimed   int64 // tokens this call returned from expired leases
	// Released is the tokens the grant's lower cap took out of the bucket
	// (0 when it was not applied or did not clip): what the region reports
	// as KeyDemand.released.
	Released float64
	// Deposited is the deposit the call added to the bucket (whole
	// micro-tokens, before the clamp to the cap), 0 when it added none: an
	// install that was not fresh or whose grant had ended (set_rate.lua).
	Deposited float64
	TooLate   bool  // see LeaseReply.TooLate
	Gen       int64 // see LeaseReply.Gen
	Reborn    bool  // see LeaseReply.Reborn
}

// State is the answer of state: what the region leader reports upward.
type State struct {
	Admitted, Denied int64   // cumulative token counters
	Rate, Cap        float64 // current rate and burst cap
	GrantExpiryUS    int64   // 0 when no grant is valid
	Tokens           float64 // bucket tokens
	Outstanding      int64   // unspent tokens in live leases
	NowUS            int64
	// LeaseDemand is the sum of the live leases' demand rates (tokens/s,
	// to a thousandth): what the instances holding the key ask for.
	LeaseDemand float64
	// StrictDemand counts the tokens the strict path decided (admitted
	// or denied; cumulative).
	StrictDemand int64
	// Reclaimed is the tokens this read returned from expired leases.
	Reclaimed int64
	// Released is the tokens leases returned above the cap of the grant
	// in force since the last read, which this read took (state.lua): the
	// region leader reports them once (the burst transfer).
	Released float64
	// TooLate: see LeaseReply.TooLate.
	TooLate bool
	// Gen and Reborn: see LeaseReply.Gen.
	Gen    int64
	Reborn bool
}

// Holding is what the region holds against its burst cap.
func (s State) Holding() float64 { return s.Tokens + float64(s.Outstanding) }

// Scripts runs the embedded scripts. Safe for concurrent use.
type Scripts struct {
	acquire, sync, release, check, reap, setRate, state, born *redis.Script
	// setRateBatch and stateBatch run set_rate and state for many keys
	// of one hash slot in one call (batch.lua).
	setRateBatch, stateBatch *redis.Script

	// virtualNow is the time (µs) scripts built with a virtual clock read
	// from their last ARGV; nil for production scripts, which read TIME.
	virtualNow *atomic.Int64

	// gens is what the calls have seen of each data set's generation.
	gens *Generations
}

// New loads the embedded scripts with Redis TIME as their clock and a
// view of the data sets' generations of their own.
func New() *Scripts { return NewWith(NewGenerations()) }

// NewWith is New sharing g, the view of the data sets' generations, with
// other Scripts of the process (a restart guard's).
func NewWith(g *Generations) *Scripts {
	s := build(embedded, false)
	s.gens = g
	return s
}

// Generations is what these scripts' calls have seen of each data set's
// generation.
func (s *Scripts) Generations() *Generations { return s.gens }

// embedded is the scripts this package ships.
var embedded = mustSub(luaFS, "lua")

// build makes the scripts of fsys (embedded, or in tests another
// version's, to run beside them).
func build(fsys fs.FS, virtual bool) *Scripts {
	mustRead := func(name string) string { return mustRead(fsys, name) }
	clock := mustRead("clock.lua")
	if virtual {
		// The test twin reads now (µs) from the last ARGV instead of TIME:
		// the only difference from production, so the differential test
		// can drive both sides through the same instants.
		// (Each key of a batch carries its own now: nothing to hold.)
		clock = "local KEYS, ARGV = KEYS, ARGV\nlocal function clock() return tonumber(ARGV[#ARGV]) end\n" +
			"local function hold_clock() end\n" +
			"local function argc() return #ARGV - 1 end\nlocal ARGC = argc()\n"
	}
	prelude := clock + "\n" + mustRead("lib.lua") + "\n"
	// A script is the prelude and its body for the key of its KEYS and
	// ARGV; a batch runs the same body once per key (batch.lua).
	s := func(name string) *redis.Script {
		return redis.NewScript(prelude + "begin(KEYS, ARGV)\n" + mustRead(name))
	}
	batch := func(name string) *redis.Script {
		return redis.NewScript(prelude + "local function one()\n" + mustRead(name) + "\nend\n" + mustRead("batch.lua"))
	}
	sc := &Scripts{
		acquire: s("acquire.lua"), sync: s("sync.lua"), release: s("release.lua"),
		check: s("check.lua"), reap: s("reap.lua"), setRate: s("set_rate.lua"), state: s("state.lua"),
		born:         redis.NewScript(clock + "\n" + mustRead("born.lua")),
		setRateBatch: batch("set_rate.lua"), stateBatch: batch("state.lua"),
		gens: NewGenerations(),
	}
	if virtual {
		sc.virtualNow = new(atomic.Int64)
	}
	return sc
}

// args is cm.args, the rise and the floor before it, the share's fill
// time, the share awaited, the generation seen of k's data set, the
// deadline and the candidate arguments of k (the member and the mark
// interval: the last nine, see lib.lua) and, for a virtual clock, the
// current virtual now.
func (s *Scripts) args(k Keys, cm Common, extra ...any) []any {
	awaiting := "0"
	if cm.AwaitingShare {
		awaiting = "1"
	}
	a := append(cm.args(extra...), max(cm.RiseUS, 0), fmtFloat(cm.FloorRate), fmtFloat(cm.FloorBurst), cm.fillMS(), awaiting, s.gens.Seen(k.Born), max(cm.DeadlineUS, 0), k.Member, cm.MarkEvery.Milliseconds())
	if s.virtualNow != nil {
		a = append(a, s.virtualNow.Load())
	}
	return a
}

func mustRead(fsys fs.FS, name string) string {
	b, err := fs.ReadFile(fsys, name)
	if err != nil {
		panic("luascripts: script file missing: " + name) // build-time invariant
	}
	return string(b)
}

func mustSub(fsys fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(fsys, dir)
	if err != nil {
		panic("luascripts: " + err.Error()) // build-time invariant
	}
	return sub
}

// Load preloads every script into the server's script cache (optional:
// EVALSHA falls back to EVAL on NOSCRIPT by itself).
func (s *Scripts) Load(ctx context.Context, c redis.Scripter) error {
	for _, sc := range s.all() {
		if err := sc.Load(ctx, c).Err(); err != nil {
			return fmt.Errorf("load script: %w", err)
		}
	}
	return nil
}

func (s *Scripts) all() []*redis.Script {
	return []*redis.Script{s.acquire, s.sync, s.release, s.check, s.reap, s.setRate, s.state, s.born, s.setRateBatch, s.stateBatch}
}

// Born is a born sentinel after StampBorn: the data set's birth (µs, Redis
// time; 0 = trusted to have started full), whether this call wrote it,
// the data set's generation, and whether the call found the data set gone
// back in time and re-birthed it (Written too).
type Born struct {
	BornUS  int64
	Written bool
	Gen     int64
	Reborn  bool
}

// StampBorn writes each missing sentinel (BornKeys) on the clock of the
// node holding it, as 0 when trustFull (a new deployment whose Redis never
// held leases), else as that node's now, in one pipeline (one round trip
// per node), and returns every sentinel's value afterwards. A sentinel
// holding something other than a time is replaced. A data set whose
// generation is below the one these scripts have seen (or missing while
// one was seen) is re-birthed at that node's now (see Generations).
func (s *Scripts) StampBorn(ctx context.Context, c interface {
	redis.Cmdable
	redis.Scripter
}, keys []string, trustFull bool) ([]Born, error) {
	full := "0"
	if trustFull {
		full = "1"
	}
	qs := RunQueued(ctx, c, func(p redis.Pipeliner) []*Queued {
		out := make([]*Queued, len(keys))
		for i, k := range keys {
			a := []any{full, s.gens.Seen(k)}
			if s.virtualNow != nil {
				a = append(a, s.virtualNow.Load())
			}
			out[i] = queue(ctx, p, s.born, []string{k, GenKey(k)}, a)
		}
		return out
	})
	out := make([]Born, len(qs))
	for i, q := range qs {
		res, err := q.Cmd.Slice()
		if err != nil {
			return nil, fmt.Errorf("stamp %s: %w", keys[i], err)
		}
		p := parser{res: res}
		out[i] = Born{BornUS: p.int(0), Written: p.int(1) == 1, Gen: p.int(2), Reborn: p.int(3) == 1}
		if err := p.err(4); err != nil {
			return nil, fmt.Errorf("stamp %s: %w", keys[i], err)
		}
		s.gens.note(keys[i], out[i].Gen, out[i].Reborn, out[i].BornUS)
	}
	return out, nil
}

// ErrReply means a script answered something the wrapper cannot parse: a
// bug or a foreign key in Redis, never bad user input.
var ErrReply = errors.New("unexpected script reply")

// ErrTooLate means a script ran after its Common.DeadlineUS and changed
// nothing: for the caller, a Redis that did not answer in time. Errors
// that match it are *TooLateError.
var ErrTooLate = errors.New("script ran after its deadline and changed nothing")

// TooLateError is a script's answer when it ran after its deadline.
type TooLateError struct {
	// NowUS is the Redis time the script ran at; DeadlineUS the deadline
	// it was given.
	NowUS, DeadlineUS int64
}

func (e *TooLateError) Error() string {
	return fmt.Sprintf("%v: ran at %d, %dµs after its deadline %d", ErrTooLate, e.NowUS, e.NowUS-e.DeadlineUS, e.DeadlineUS)
}

// Is makes a *TooLateError match ErrTooLate.
func (e *TooLateError) Is(target error) bool { return target == ErrTooLate }

// tooLate converts a script's error reply 'TOOLATE <now> <deadline>'
// (lib.lua, begin) into a *TooLateError; other errors come back as they
// are, and ok is false.
func tooLate(err error) (*TooLateError, bool) {
	var re redis.Error
	if !errors.As(err, &re) {
		return nil, false
	}
	f := strings.Fields(re.Error())
	if len(f) < 3 || f[0] != "TOOLATE" {
		return nil, false
	}
	now, err1 := strconv.ParseInt(f[1], 10, 64)
	dl, err2 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil {
		return nil, false
	}
	return &TooLateError{NowUS: now, DeadlineUS: dl}, true
}

// scriptErr names the script and key in a script call's error; a too-late
// answer becomes a *TooLateError, returned alone too (nil for any other
// error).
func scriptErr(name, key string, err error) (*TooLateError, error) {
	if tl, ok := tooLate(err); ok {
		return tl, fmt.Errorf("%s %s: %w", name, key, tl)
	}
	return nil, fmt.Errorf("%s %s: %w", name, key, err)
}

// late is the answer's TooLate and NowUS fields for a call that failed
// with tl (nil: not too late).
func late(tl *TooLateError) (bool, int64) {
	if tl == nil {
		return false, 0
	}
	return true, tl.NowUS
}

// Acquire runs acquire.lua.
func (s *Scripts) Acquire(ctx context.Context, c redis.Scripter, k Keys, cm Common, r Report) (LeaseReply, error) {
	res, err := s.acquire.Run(ctx, c, k.list(), s.args(k, cm, r.opArgs()...)...).Slice()
	if err != nil {
		tl, err := scriptErr("acquire", k.Bucket, err)
		var lr LeaseReply
		lr.TooLate, lr.NowUS = late(tl)
		return lr, err
	}
	lr, err := parseLease(res)
	return s.noteLease(k, lr, err)
}

// Sync runs sync.lua.
func (s *Scripts) Sync(ctx context.Context, c redis.Scripter, k Keys, cm Common, r Report) (LeaseReply, error) {
	res, err := s.sync.Run(ctx, c, k.list(), s.syncArgs(k, cm, r)...).Slice()
	if err != nil {
		tl, err := scriptErr("sync", k.Bucket, err)
		var lr LeaseReply
		lr.TooLate, lr.NowUS = late(tl)
		return lr, err
	}
	lr, err := parseLease(res)
	return s.noteLease(k, lr, err)
}

func (s *Scripts) syncArgs(k Keys, cm Common, r Report) []any {
	return s.args(k, cm, r.opArgs()...)
}

// SyncItem is one key of a pipelined SyncMany.
type SyncItem struct {
	Keys   Keys
	Common Common
	Report Report
}

// SyncResult is one key's outcome of SyncMany.
type SyncResult struct {
	Reply LeaseReply
	Err   error
}

// SyncMany runs sync.lua for many keys in pipelines (RunQueued: about
// one round trip per node). Keys may live on different cluster slots: each is its own
// script call. A call that met NOSCRIPT (script cache flushed, e.g. by a
// restart) is run again on its own with EVAL fallback; other per-key
// errors are returned per key.
func (s *Scripts) SyncMany(ctx context.Context, c interface {
	redis.Cmdable
	redis.Scripter
}, items []SyncItem) []SyncResult {
	qs := RunQueued(ctx, c, func(p redis.Pipeliner) []*Queued {
		out := make([]*Queued, len(items))
		for i, it := range items {
			out[i] = s.queue(ctx, p, s.sync, it.Keys, s.syncArgs(it.Keys, it.Common, it.Report))
		}
		return out
	})
	out := make([]SyncResult, len(items))
	for i, q := range qs {
		out[i].Reply, out[i].Err = ParseLease(q)
	}
	return out
}

// Release runs release.lua.
func (s *Scripts) Release(ctx context.Context, c redis.Scripter, k Keys, cm Common, r Report) (ReleaseReply, error) {
	res, err := s.release.Run(ctx, c, k.list(), s.args(k, cm, r.releaseArgs()...)...).Slice()
	if err != nil {
		tl, err := scriptErr("release", k.Bucket, err)
		var rr ReleaseReply
		rr.TooLate, rr.NowUS = late(tl)
		return rr, err
	}
	rr, err := parseRelease(res)
	if err == nil {
		s.gens.note(k.Born, rr.Gen, rr.Reborn, rr.NowUS)
	}
	return rr, err
}

func parseRelease(res []any) (ReleaseReply, error) {
	p := parser{res: res}
	rr := ReleaseReply{Returned: p.int(0), NowUS: p.int(1), Conflict: p.int(2) == 1, Gen: p.int(3), Reborn: p.int(4) == 1}
	return rr, p.err(5)
}

// ReleaseMany runs release.lua for many keys in pipelines (about one round
// trip per node), as SyncMany does sync.lua; results are per key.
func (s *Scripts) ReleaseMany(ctx context.Context, c interface {
	redis.Cmdable
	redis.Scripter
}, items []SyncItem) []ReleaseResult {
	qs := RunQueued(ctx, c, func(p redis.Pipeliner) []*Queued {
		out := make([]*Queued, len(items))
		for i, it := range items {
			out[i] = s.queue(ctx, p, s.release, it.Keys, s.args(it.Keys, it.Common, it.Report.releaseArgs()...))
		}
		return out
	})
	out := make([]ReleaseResult, len(items))
	for i, q := range qs {
		res, err := q.Cmd.Slice()
		if err != nil {
			var tl *TooLateError
			tl, out[i].Err = scriptErr("release", items[i].Keys.Bucket, err)
			out[i].Reply.TooLate, out[i].Reply.NowUS = late(tl)
			continue
		}
		out[i].Reply, out[i].Err = parseRelease(res)
		if out[i].Err == nil {
			q.note(out[i].Reply.Gen, out[i].Reply.Reborn, out[i].Reply.NowUS)
		}
	}
	return out
}

// ReleaseResult is one key's outcome of ReleaseMany.
type ReleaseResult struct {
	Reply ReleaseReply
	Err   error
}

// Check runs check.lua.
func (s *Scripts) Check(ctx context.Context, c redis.Scripter, k Keys, cm Common, cost int64) (CheckReply, error) {
	res, err := s.check.Run(ctx, c, k.list(), s.args(k, cm, cost)...).Slice()
	if err != nil {
		tl, err := scriptErr("check", k.Bucket, err)
		var cr CheckReply
		cr.TooLate, cr.NowUS = late(tl)
		return cr, err
	}
	cr, err := parseCheck(res)
	if err == nil {
		s.gens.note(k.Born, cr.Gen, cr.Reborn, cr.NowUS)
	}
	return cr, err
}

func parseCheck(res []any) (CheckReply, error) {
	p := parser{res: res}
	cr := CheckReply{
		Allowed: p.int(0) == 1, Remaining: p.int(1), RetryAfter: p.ms(2), Reset: p.ms(3),
		Rate: p.float(4), Cap: p.float(5), NowUS: p.int(6), Reclaimed: p.int(7), Gen: p.int(8), Reborn: p.int(9) == 1,
	}
	return cr, p.err(10)
}

// Reap runs reap.lua.
func (s *Scripts) Reap(ctx context.Context, c redis.Scripter, k Keys, cm Common) (ReapReply, error) {
	res, err := s.reap.Run(ctx, c, k.list(), s.args(k, cm)...).Slice()
	if err != nil {
		tl, err := scriptErr("reap", k.Bucket, err)
		var rr ReapReply
		rr.TooLate, rr.NowUS = late(tl)
		return rr, err
	}
	p := parser{res: res}
	rr := ReapReply{Reaped: p.int(0), Returned: p.int(1), Live: p.int(2), NowUS: p.int(3), Gen: p.int(4), Reborn: p.int(5) == 1}
	if err := p.err(6); err != nil {
		return rr, err
	}
	s.gens.note(k.Born, rr.Gen, rr.Reborn, rr.NowUS)
	return rr, nil
}

// SetRate runs set_rate.lua: installs a grant valid until expiryUS, issued
// for a report sent at issuedUS (Redis time, µs), and adds deposit tokens
// to the bucket when this is the answer's first install (see set_rate.lua).
func (s *Scripts) SetRate(ctx context.Context, c redis.Scripter, k Keys, cm Common, rate, burst float64, expiryUS, issuedUS int64, deposit float64) (SetRateReply, error) {
	if err := checkGrant(k, rate, burst, deposit); err != nil {
		return SetRateReply{}, err
	}
	q := &Queued{Cmd: s.setRate.Run(ctx, c, k.list(), s.args(k, cm, fmtFloat(rate), fmtFloat(burst), expiryUS, issuedUS, fmtFloat(deposit))...), keys: k.list(),
		gens: s.gens, born: k.Born}
	return ParseSetRate(q)
}

// State runs state.lua.
func (s *Scripts) State(ctx context.Context, c redis.Scripter, k Keys, cm Common) (State, error) {
	res, err := s.state.Run(ctx, c, k.list(), s.args(k, cm)...).Slice()
	if err != nil {
		tl, err := scriptErr("state", k.Bucket, err)
		var st State
		st.TooLate, st.NowUS = late(tl)
		return st, err
	}
	st, err := parseState(res)
	if err == nil {
		s.gens.note(k.Born, st.Gen, st.Reborn, st.NowUS)
	}
	return st, err
}

func parseState(res []any) (State, error) {
	if len(res) == 13 {
		// The older layout's scripts (testdata/older-layout, run by the
		// upgrade tests) reply without released.
		res = append(append(res[:11:11], "0"), res[11:]...)
	}
	p := parser{res: res}
	st := State{
		Admitted: p.int(0), Denied: p.int(1), Rate: p.float(2), Cap: p.float(3),
		GrantExpiryUS: p.int(4), Tokens: p.float(5), Outstanding: p.int(6), NowUS: p.int(7),
		LeaseDemand: float64(p.int(8)) / 1000, StrictDemand: p.int(9), Reclaimed: p.int(10), Released: p.float(11),
		Gen: p.int(12), Reborn: p.int(13) == 1,
	}
	return st, p.err(14)
}

func parseLease(res []any) (LeaseReply, error) {
	p := parser{res: res}
	lr := LeaseReply{
		Granted: p.int(0), TTL: p.ms(1), Remaining: p.int(2), RetryAfter: p.ms(3),
		Rate: p.float(4), Cap: p.float(5), Live: p.int(6), Reset: p.ms(7), NowUS: p.int(8),
		Duplicate: p.int(9) == 1, Reclaimed: p.int(10), Conflict: p.int(11) == 1, Returned: p.int(12),
		Gen: p.int(13), Reborn: p.int(14) == 1,
	}
	return lr, p.err(15)
}

// noteLease records a parsed lease reply's generation of k's data set.
func (s *Scripts) noteLease(k Keys, lr LeaseReply, err error) (LeaseReply, error) {
	if err == nil {
		s.gens.note(k.Born, lr.Gen, lr.Reborn, lr.NowUS)
	}
	return lr, err
}

// parser reads a script's reply array, remembering the first problem.
type parser struct {
	res     []any
	problem error
}

func (p *parser) int(i int) int64 {
	if i >= len(p.res) {
		p.fail(i, "missing")
		return 0
	}
	v, ok := p.res[i].(int64)
	if !ok {
		p.fail(i, fmt.Sprintf("%T, want integer", p.res[i]))
	}
	return v
}

func (p *parser) ms(i int) time.Duration {
	v := p.int(i)
	if v < 0 {
		return -1
	}
	return time.Duration(v) * time.Millisecond
}

func (p *parser) float(i int) float64 {
	if i >= len(p.res) {
		p.fail(i, "missing")
		return 0
	}
	s, ok := p.res[i].(string)
	if !ok {
		p.fail(i, fmt.Sprintf("%T, want string", p.res[i]))
		return 0
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil {
		p.fail(i, err.Error())
	}
	return f
}

func (p *parser) fail(i int, what string) {
	if p.problem == nil {
		p.problem = fmt.Errorf("%w: element %d: %s", ErrReply, i, what)
	}
}

func (p *parser) err(n int) error {
	if p.problem == nil && len(p.res) != n {
		return fmt.Errorf("%w: %d elements, want %d", ErrReply, len(p.res), n)
	}
	return p.problem
}

// Reading is one key's demand between two State reads, as a region leader
// reports it to the global tier.
type Reading struct {
	// Admitted and Denied are the counters' increase (tokens).
	Admitted, Denied int64
	// Window is the Redis time between the reads, in whole milliseconds
	// and at least 1ms.
	Window time.Duration
	// DemandRate is the demand now (tokens/s): the live leases' rates plus
	// the strict path's decisions per second over Window (StrictRate).
	DemandRate float64
	// StrictRate is the strict path's decisions per second over Window:
	// a count, so a reading over a short window is noisy.
	StrictRate float64
}

// Since is the demand between prev, an earlier read of the same key, and
// st. Counters restart at 0 when a bucket expired and came back, so one
// below its earlier value counts from 0.
func (st State) Since(prev State) Reading {
	r := Reading{
		Admitted: increase(st.Admitted, prev.Admitted),
		Denied:   increase(st.Denied, prev.Denied),
		Window:   time.Duration(max(1, (st.NowUS-prev.NowUS)/1000)) * time.Millisecond,
	}
	r.StrictRate = float64(increase(st.StrictDemand, prev.StrictDemand)) / r.Window.Seconds()
	r.DemandRate = st.LeaseDemand + r.StrictRate
	return r
}

func increase(now, before int64) int64 {
	if now < before {
		return now
	}
	return now - before
}

// LeaseRecord is one instance's lease on one key as the scripts store it
// in the bucket hash (field LeaseField(id); see lib.lua). Tokens and times
// are whole numbers.
type LeaseRecord struct {
	Granted, Used, Returned float64 // cumulative tokens
	Seq                     uint64  // last applied report
	ExpiryUS                int64   // Redis time
	LastGrant               float64 // tokens granted by the last report
	// WindowStartUS and WindowDemand are the open demand window: when it
	// opened (0: none yet) and the demand reported in it (tokens).
	WindowStartUS int64
	WindowDemand  float64
	// DemandRate is the rate of the last closed window (tokens/s).
	DemandRate float64
	// AppliedUsed, AppliedDenied and AppliedReturned are the totals of the
	// last applied report; Lease and Incarnation those of its instance.
	// Fingerprint is false for a record older scripts wrote (none of these).
	AppliedUsed, AppliedDenied, AppliedReturned float64
	Lease                                       uint64
	Incarnation                                 string
	Fingerprint                                 bool
}

// Unspent is what the lease still holds by the region's books.
func (l LeaseRecord) Unspent() float64 { return l.Granted - l.Used - l.Returned }

// Continues reports whether l, read later from the same hash field, is
// still the lease was was, not a new record written under the same
// instance id after was was reaped or dropped: the same lease and
// incarnation, and totals and seq that only grew.
func (l LeaseRecord) Continues(was LeaseRecord) bool {
	return l.Lease == was.Lease && l.Incarnation == was.Incarnation &&
		l.Seq >= was.Seq && l.Granted >= was.Granted && l.Used >= was.Used && l.Returned >= was.Returned
}

// ParseLeaseRecord reads a lease record: compact (see lib.lua,
// lease_record), or as text of fourteen fields, or of the first nine or
// six alone as older scripts wrote them.
func ParseLeaseRecord(v string) (LeaseRecord, error) {
	if len(v) > 0 && v[0] == compactMark {
		return parseCompact(v)
	}
	f := strings.Fields(v)
	if len(f) != 14 && len(f) != 9 && len(f) != 6 {
		return LeaseRecord{}, fmt.Errorf("%w: lease record %q has %d fields, want 14, 9 or 6", ErrReply, v, len(f))
	}
	var inc string
	if len(f) == 14 {
		inc, f = f[13], f[:13]
	}
	n := make([]float64, 13)
	for i, s := range f {
		x, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return LeaseRecord{}, fmt.Errorf("%w: lease record %q: field %d: %v", ErrReply, v, i+1, err)
		}
		n[i] = x
	}
	return LeaseRecord{
		Granted: n[0], Used: n[1], Returned: n[2], Seq: uint64(n[3]), ExpiryUS: int64(n[4]), LastGrant: n[5],
		WindowStartUS: int64(n[6]), WindowDemand: n[7], DemandRate: n[8] / 1000,
		AppliedUsed: n[9], AppliedDenied: n[10], AppliedReturned: n[11], Lease: uint64(n[12]),
		Incarnation: inc, Fingerprint: inc != "",
	}, nil
}
