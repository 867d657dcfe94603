package configstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluicehq/sluice/pkg/config"
)

// ErrConflict is wrapped by Store.Apply when the config in etcd is not at
// the expected revision: someone else changed it since it was read.
var ErrConflict = errors.New("config changed concurrently")

// ErrApplyInProgress is wrapped (with ErrConflict) when another apply is
// writing its tenants in batches, or one was interrupted: its marker key
// exists. ApplyOptions.Takeover finishes it instead.
var ErrApplyInProgress = errors.New("another apply is in progress or was interrupted")

// ErrInterrupted is wrapped when a batched apply stopped before its
// commit (cancelled, or etcd failed): the daemons keep the config they
// run, and the next apply with ApplyOptions.Takeover finishes the job.
var ErrInterrupted = errors.New("apply interrupted before its commit")

// Limits of what one etcd request may carry; etcd refuses requests over
// --max-request-bytes (1.5 MiB by default) and transactions of more than
// --max-txn-ops operations (128 by default).
const (
	// MaxDocumentBytes bounds the config document (everything but the
	// tenants) stored in the config key.
	MaxDocumentBytes = 1 << 20
	// MaxTenantBytes bounds one stored tenant.
	MaxTenantBytes = 64 << 10
	// TxnOps is the most operations one write transaction carries.
	TxnOps = 120
	// txnBytes bounds the keys and values of one write transaction.
	txnBytes = 1 << 20
	// readPage is how many keys one range read returns. etcd counts every
	// key to the end of the range for each page (RangeResponse.Count), so
	// reading n keys costs n²/(2·readPage) index steps: large pages keep
	// that well below the reading itself.
	readPage = 20000
)

// Store keeps the config in etcd under <prefix>/config:
//
//   - <prefix>/config holds the config document without its tenants. Every
//     change of the config ends by writing it, in the same transaction as
//     the change or its last part, so its mod revision is the config's
//     revision and the one key every write is fenced on.
//   - <prefix>/config/tenants/<id> holds one tenant (config.MarshalTenant's
//     JSON), so a million tenants need no single value larger than etcd
//     accepts, and a change of one tenant writes two keys.
//   - <prefix>/config/applying exists while an apply too large for one
//     transaction writes its tenants in batches: no other writer commits
//     meanwhile, and readers keep the config committed before it.
//
// A document written before tenants had keys of their own (tenants inside
// the document) still loads; the next write moves them to their keys.
// Leader election keys live beside it under <prefix>/election/. Safe for
// concurrent use.
type Store struct {
	cli    *clientv3.Client
	prefix string
	key    string
	// requestTimeout bounds each etcd request when > 0.
	requestTimeout time.Duration
}

// SetRequestTimeout bounds each etcd request the store makes by d (0: only
// the caller's context): reading or writing a million tenants takes many
// requests, so a bound on the whole would have to guess their number. Call
// it before the Store is shared.
func (s *Store) SetRequestTimeout(d time.Duration) { s.requestTimeout = d }

func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.requestTimeout > 0 {
		return context.WithTimeout(ctx, s.requestTimeout)
	}
	return context.WithCancel(ctx)
}

func (s *Store) get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	rctx, cancel := s.bound(ctx)
	defer cancel()
	return s.cli.Get(rctx, key, opts...)
}

// timedTxn is a transaction bounded like every request of the store.
type timedTxn struct {
	t      clientv3.Txn
	cancel context.CancelFunc
}

func (s *Store) txn(ctx context.Context) timedTxn {
	rctx, cancel := s.bound(ctx)
	return timedTxn{t: s.cli.Txn(rctx), cancel: cancel}
}

func (x timedTxn) If(cs ...clientv3.Cmp) timedTxn   { x.t = x.t.If(cs...); return x }
func (x timedTxn) Then(ops ...clientv3.Op) timedTxn { x.t = x.t.Then(ops...); return x }

func (x timedTxn) Commit() (*clientv3.TxnResponse, error) {
	defer x.cancel()
	return x.t.Commit()
}

// NewStore uses cli under prefix ("" means DefaultPrefix; a trailing slash
// is ignored).
func NewStore(cli *clientv3.Client, prefix string) *Store {
	prefix = strings.TrimRight(prefix, "/")
	if prefix == "" {
		prefix = config.DefaultPrefix
	}
	return &Store{cli: cli, prefix: prefix, key: prefix + "/config"}
}

// Key is the etcd key holding the config document; its mod revision is
// the config's revision.
func (s *Store) Key() string { return s.key }

// TenantPrefix is the prefix of the tenant keys.
func (s *Store) TenantPrefix() string { return s.key + "/tenants/" }

// TenantKey is the etcd key of one tenant.
func (s *Store) TenantKey(id string) string { return s.TenantPrefix() + id }

// ApplyingKey is the marker of a batched apply in progress.
func (s *Store) ApplyingKey() string { return s.key + "/applying" }

// Prefix is the etcd key prefix, without a trailing slash.
func (s *Store) Prefix() string { return s.prefix }

// ElectionPrefix is where leader election keys live.
func (s *Store) ElectionPrefix() string { return s.prefix + "/election/" }

// rangeEnd ends the key range [Key, rangeEnd) that holds the document, the
// marker and every tenant (and keys between them that classify ignores).
func (s *Store) rangeEnd() string { return clientv3.GetPrefixRangeEnd(s.key + "/") }

// keyKind is what one key of the config range is.
type keyKind int

const (
	kindOther keyKind = iota
	kindDocument
	kindApplying
	kindTenant
)

func (s *Store) classify(key string) (keyKind, string) {
	switch {
	case key == s.key:
		return kindDocument, ""
	case key == s.ApplyingKey():
		return kindApplying, ""
	case strings.HasPrefix(key, s.TenantPrefix()):
		return kindTenant, key[len(s.TenantPrefix()):]
	}
	return kindOther, ""
}

// Marker is what the applying key holds.
type Marker struct {
	// Started is when the apply began.
	Started time.Time `json:"started"`
	// From is the config revision the apply started from.
	From int64 `json:"from_revision"`
	// Tenants is how many tenants the applied config lists.
	Tenants int `json:"tenants"`
	// Revision is the marker's mod revision (not stored in the value).
	Revision int64 `json:"-"`
	// Created is the revision at which the marker was first written; the
	// committed config is the one at Created-1.
	Created int64 `json:"-"`
}

func (m *Marker) String() string {
	return fmt.Sprintf("started %s from revision %d, %d tenants (marker %s at revision %d)",
		m.Started.UTC().Format(time.RFC3339), m.From, m.Tenants, "applying", m.Revision)
}

func parseMarker(kv *mvccpb.KeyValue) *Marker {
	m := &Marker{}
	_ = json.Unmarshal(kv.Value, m) // an unreadable marker still blocks
	m.Revision, m.Created = kv.ModRevision, kv.CreateRevision
	return m
}

// raw is the config range as stored at one revision.
type raw struct {
	rev      int64 // store revision read at
	doc      *mvccpb.KeyValue
	applying *Marker
	tenants  map[string][]byte
	// stray are the tenant keys written after the document (mod revision
	// above the document's), id to mod revision: written outside an apply
	// (by hand, past sluicectl), since every apply writes the document in
	// the transaction of its last tenant writes or after them.
	stray map[string]int64
}

// scan reads the config range at rev (0: the latest) in pages, calling fn
// for every key, and returns the revision read at.
func (s *Store) scan(ctx context.Context, rev int64, fn func(*mvccpb.KeyValue)) (int64, error) {
	from, end := s.key, s.rangeEnd()
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(readPage)}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := s.get(ctx, from, opts...)
		if err != nil {
			return 0, fmt.Errorf("config: read %s: %w", s.key, err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			fn(kv)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return rev, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

func (s *Store) readRaw(ctx context.Context, rev int64) (*raw, error) {
	r := &raw{tenants: map[string][]byte{}}
	got, err := s.scan(ctx, rev, func(kv *mvccpb.KeyValue) {
		kind, id := s.classify(string(kv.Key))
		switch kind {
		case kindDocument:
			r.doc = kv
		case kindApplying:
			r.applying = parseMarker(kv)
		case kindTenant:
			r.tenants[id] = kv.Value
			// The document sorts before every tenant key, so it is read.
			if r.doc != nil && kv.ModRevision > r.doc.ModRevision {
				if r.stray == nil {
					r.stray = map[string]int64{}
				}
				r.stray[id] = kv.ModRevision
			}
		}
	})
	r.rev = got
	return r, err
}

// strayError explains tenant keys written outside an apply, with why
// those that do not parse fail, naming at most five.
func (s *Store) strayError(docRev int64, stray map[string]int64, bad func(id string) error) error {
	ids := slices.Sorted(maps.Keys(stray))
	var errs []error
	for _, id := range ids[:min(len(ids), 5)] {
		e := fmt.Errorf("tenant key %s written at revision %d, after the config document (revision %d), outside an apply: no daemon runs it until an apply commits it (sluicectl apply)",
			s.TenantKey(id), stray[id], docRev)
		if b := bad(id); b != nil {
			e = fmt.Errorf("%w; it does not parse: %w", e, b)
		}
		errs = append(errs, e)
	}
	if len(ids) > 5 {
		errs = append(errs, fmt.Errorf("and %d more tenant keys written outside an apply", len(ids)-5))
	}
	return fmt.Errorf("%w: %w", config.ErrInvalidConfig, errors.Join(errs...))
}

// readCommitted reads the committed config range: the latest, or while a
// batched apply is in progress, the range as it was before it began.
func (s *Store) readCommitted(ctx context.Context) (*raw, error) {
	r, err := s.readRaw(ctx, 0)
	if err != nil || r.applying == nil {
		return r, err
	}
	before, err := s.readRaw(ctx, r.applying.Created-1)
	if err != nil {
		return nil, fmt.Errorf("config: an apply is in progress (%v) and the config committed before it cannot be read: %w: %w",
			r.applying, ErrApplyInProgress, err)
	}
	before.applying = r.applying
	return before, nil
}

// assemble parses a document and its tenants into one config, validated.
// Tenants under their keys win over tenants in the document.
// keyOf names a tenant's key in errors.
func assemble(ctx context.Context, doc []byte, tenants map[string][]byte, keyOf func(id string) string) (*config.Config, error) {
	c, err := parseDocument(ctx, doc)
	if err != nil {
		return nil, err
	}
	var bad []error
	all := c.Tenants
	if len(tenants) > 0 {
		if all == nil {
			all = make(map[string]config.Tenant, len(tenants))
		}
		for id, v := range tenants {
			t, err := config.ParseTenant(v)
			if err != nil {
				bad = append(bad, fmt.Errorf("tenant key %s: %w", keyOf(id), err))
				continue
			}
			all[id] = t
		}
	}
	if len(bad) > 0 {
		return nil, errors.Join(bad...)
	}
	c.Tenants = all
	if err := c.ValidateContext(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// parseDocument parses the stored document (bounded by MaxDocumentBytes
// only when written; a larger legacy document still loads).
func parseDocument(ctx context.Context, doc []byte) (*config.Config, error) {
	return config.ParseContext(ctx, doc)
}

// Get reads the committed config and its revision (the document key's mod
// revision): the one the daemons run. An absent document is (nil, 0, nil).
// Content that fails Parse or validation is an error wrapping
// ErrInvalidConfig, returned with its revision so it can be overwritten
// with Apply. Reading a million tenants takes seconds; ctx bounds it.
func (s *Store) Get(ctx context.Context) (*config.Config, int64, error) {
	r, err := s.readCommitted(ctx)
	if err != nil {
		return nil, 0, err
	}
	if r.doc == nil {
		return nil, 0, nil
	}
	c, err := assemble(ctx, r.doc.Value, r.tenants, s.TenantKey)
	if err == nil && len(r.stray) > 0 {
		// What the running daemons run is the config of the document's
		// revision, without these keys: a starting daemon must not run
		// something else.
		err = s.strayError(r.doc.ModRevision, r.stray, func(id string) error {
			_, err := config.ParseTenant(r.tenants[id])
			return err
		})
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, 0, err
		}
		return nil, r.doc.ModRevision, fmt.Errorf("config: %s at revision %d: %w", s.key, r.doc.ModRevision, err)
	}
	return c, r.doc.ModRevision, nil
}

// MaxHistorySteps bounds how many earlier config revisions LastValid
// reads back through etcd's history.
const MaxHistorySteps = 10

// ErrNoValidHistory is wrapped by LastValid when no valid config was found
// in the revisions of etcd's history it read.
var ErrNoValidHistory = errors.New("no valid config in etcd's history")

// LastValid is the newest config committed at or before the document
// revision from that passes validation, read back from etcd's history
// (WithRev): the committed range at from itself (without tenant keys
// written outside an apply after it), then each earlier revision that
// wrote the document, at most MaxHistorySteps of them, stopping where
// etcd compacted its history. It returns the config and its revision, or
// an error wrapping ErrNoValidHistory naming how far it read; etcd
// failing is another error.
func (s *Store) LastValid(ctx context.Context, from int64) (*config.Config, int64, error) {
	rev := from
	for step := 0; step < MaxHistorySteps && rev > 0; step++ {
		r, err := s.readRaw(ctx, rev)
		if errors.Is(err, rpctypes.ErrCompacted) {
			return nil, 0, fmt.Errorf("%w: revisions before %d are compacted", ErrNoValidHistory, rev+1)
		}
		if err != nil {
			return nil, 0, err
		}
		if r.doc == nil {
			return nil, 0, fmt.Errorf("%w: %s did not exist at revision %d", ErrNoValidHistory, s.key, rev)
		}
		if (r.applying != nil || len(r.stray) > 0) && r.doc.ModRevision < rev {
			// Writes after the document's: its own revision holds exactly
			// what it committed.
			rev = r.doc.ModRevision
			continue
		}
		if c, err := assemble(ctx, r.doc.Value, r.tenants, s.TenantKey); err == nil {
			return c, r.doc.ModRevision, nil
		} else if ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
		rev = r.doc.ModRevision - 1
	}
	return nil, 0, fmt.Errorf("%w: read %d config revisions back from revision %d", ErrNoValidHistory, MaxHistorySteps, from)
}

// ErrHistoryGone is wrapped by At when etcd no longer holds the config
// of the revision asked for: compacted, with no later revision read at
// which it was still the committed config, unchanged.
var ErrHistoryGone = errors.New("the config of that revision is gone from etcd's history")

// At is the config that revision rev committed (rev a revision that wrote
// the document: a config's revision, as Get and a Watcher hand out),
// validated as Get validates it. It reads the config range at rev. When
// etcd compacted rev it reads back from the latest revision, at most
// MaxHistorySteps steps, through the revision just before each later
// commit of a config (before its batched apply began, for one), to the
// newest at which rev's config was still the committed one: the same
// document and no tenant key written since. Not found so is an error
// wrapping ErrHistoryGone; rev not a revision that wrote the document
// (or later than etcd's) is another error, as is etcd failing. A config
// changed since only by tenant keys deleted by hand, past the Store, is
// read without them.
func (s *Store) At(ctx context.Context, rev int64) (*config.Config, error) {
	if rev <= 0 {
		return nil, fmt.Errorf("config: revision %d is no config revision", rev)
	}
	r, err := s.readRaw(ctx, rev)
	if errors.Is(err, rpctypes.ErrCompacted) {
		return s.atAfterCompaction(ctx, rev)
	}
	if err != nil {
		return nil, err
	}
	return s.committedAt(ctx, r, rev)
}

// RevisionsBetween is the revisions that committed a config after
// revision from and before revision until, oldest first, at most max of
// them (the newest): read back from until-1 through the revision just
// before each commit (before its batched apply began, for one). A
// revision compacted on the way is an error wrapping ErrHistoryGone.
func (s *Store) RevisionsBetween(ctx context.Context, from, until int64, max int) ([]int64, error) {
	var revs []int64
	at := until - 1
	for at > from && len(revs) < max {
		f, err := s.fenceAt(ctx, at)
		if errors.Is(err, rpctypes.ErrCompacted) {
			return nil, fmt.Errorf("config: %w: revision %d is compacted", ErrHistoryGone, at)
		}
		if err != nil {
			return nil, err
		}
		if f.applying != nil {
			at = f.applying.Created - 1
			continue
		}
		d := docRev(f)
		if d <= from {
			break
		}
		revs = append(revs, d)
		at = d - 1
	}
	slices.Reverse(revs)
	return revs, nil
}

// committedAt is rev's config from r, the range read at a revision at or
// after rev whose document is rev's.
func (s *Store) committedAt(ctx context.Context, r *raw, rev int64) (*config.Config, error) {
	switch {
	case r.doc == nil:
		return nil, fmt.Errorf("config: %s did not exist at revision %d", s.key, r.rev)
	case r.doc.ModRevision != rev:
		return nil, fmt.Errorf("config: revision %d did not write %s (at revision %d it is at %d)", rev, s.key, r.rev, r.doc.ModRevision)
	case len(r.stray) > 0:
		return nil, fmt.Errorf("config: %w: tenant keys were written after revision %d, and it is compacted", ErrHistoryGone, rev)
	}
	c, err := assemble(ctx, r.doc.Value, r.tenants, s.TenantKey)
	if err != nil {
		return nil, fmt.Errorf("config: %s at revision %d: %w", s.key, rev, err)
	}
	return c, nil
}

// atAfterCompaction finds rev's config at a later revision (At).
func (s *Store) atAfterCompaction(ctx context.Context, rev int64) (*config.Config, error) {
	at := int64(0) // the latest
	for range MaxHistorySteps {
		f, err := s.fenceAt(ctx, at)
		if errors.Is(err, rpctypes.ErrCompacted) {
			break
		}
		if err != nil {
			return nil, err
		}
		at = f.rev
		d := docRev(f)
		switch {
		case f.applying != nil:
			at = f.applying.Created - 1 // the range committed before it
			continue
		case d > rev:
			at = d - 1 // the range before that commit
			continue
		case d < rev:
			return nil, fmt.Errorf("config: revision %d did not write %s (at revision %d it is at %d)", rev, s.key, at, d)
		}
		r, err := s.readRaw(ctx, at)
		if errors.Is(err, rpctypes.ErrCompacted) {
			break
		}
		if err != nil {
			return nil, err
		}
		return s.committedAt(ctx, r, rev)
	}
	return nil, fmt.Errorf("config: %w: revision %d is compacted and no later revision read holds its config unchanged", ErrHistoryGone, rev)
}

// fenceAt reads the document's and the marker's revisions at revision at
// (0: the latest).
func (s *Store) fenceAt(ctx context.Context, at int64) (*raw, error) {
	var opts []clientv3.OpOption
	if at > 0 {
		opts = append(opts, clientv3.WithRev(at))
	}
	resp, err := s.txn(ctx).Then(
		clientv3.OpGet(s.key, append([]clientv3.OpOption{clientv3.WithKeysOnly()}, opts...)...),
		clientv3.OpGet(s.ApplyingKey(), opts...),
	).Commit()
	if err != nil {
		return nil, err
	}
	r := &raw{rev: resp.Header.Revision}
	if at > 0 {
		r.rev = at
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		r.doc = kvs[0]
	}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		r.applying = parseMarker(kvs[0])
	}
	return r, nil
}

// Revision is the config revision: the document key's mod revision (0:
// none).
func (s *Store) Revision(ctx context.Context) (int64, error) {
	fence, err := s.readFence(ctx)
	if err != nil {
		return 0, fmt.Errorf("config: read %s: %w", s.key, err)
	}
	return docRev(fence), nil
}

// Applying is the marker of a batched apply in progress or interrupted, or
// nil.
func (s *Store) Applying(ctx context.Context) (*Marker, error) {
	resp, err := s.get(ctx, s.ApplyingKey())
	if err != nil {
		return nil, fmt.Errorf("config: read %s: %w", s.ApplyingKey(), err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	return parseMarker(resp.Kvs[0]), nil
}

// ApplyOptions tune Store.ApplyWith.
type ApplyOptions struct {
	// Takeover finishes an apply that was interrupted (or is still running
	// elsewhere, which then fails): its marker is replaced by this apply's,
	// which writes every tenant that differs from what etcd holds.
	Takeover bool
	// Progress, when set, is called after each batch with the tenant
	// writes done and to do.
	Progress func(done, total int)
}

// Apply is ApplyWith without options.
func (s *Store) Apply(ctx context.Context, cfg *config.Config, expectRev int64) (int64, error) {
	return s.ApplyWith(ctx, cfg, expectRev, ApplyOptions{})
}

// ApplyWith validates cfg and, only if it is valid, writes it: the
// document and every tenant that differs from etcd, fenced on the
// document's mod revision being expectRev (0: no config yet). It returns
// the new config revision. A lost race is an error wrapping ErrConflict; an
// invalid config wraps ErrInvalidConfig; neither writes anything.
//
// A change of at most TxnOps-1 tenants is one transaction. A larger one
// first writes the applying marker (fenced on expectRev), then the tenants
// in transactions of at most TxnOps operations, each fenced on the marker,
// then the document and the marker's removal in one last transaction: the
// commit, before which no reader sees any of it. An apply stopped before
// its commit returns an error wrapping ErrInterrupted and leaves the
// marker: the daemons keep their config and other writers are refused
// until an apply with Takeover finishes the job.
func (s *Store) ApplyWith(ctx context.Context, cfg *config.Config, expectRev int64, opts ApplyOptions) (int64, error) {
	if expectRev < 0 {
		return 0, fmt.Errorf("config: expected revision %d is negative", expectRev)
	}
	if cfg == nil {
		return 0, fmt.Errorf("%w: no config given", config.ErrInvalidConfig)
	}
	if err := cfg.ValidateContext(ctx); err != nil {
		return 0, err
	}
	doc, err := renderDocument(cfg)
	if err != nil {
		return 0, err
	}
	want, err := renderTenants(ctx, cfg.Tenants)
	if err != nil {
		return 0, err
	}
	current, err := s.readRaw(ctx, 0)
	if err != nil {
		return 0, err
	}
	if err := s.checkFence(current, expectRev, opts.Takeover); err != nil {
		return 0, err
	}
	ops, size := s.tenantOps(current.tenants, want)
	if current.applying == nil && len(ops) < TxnOps && size+len(doc) < txnBytes {
		return s.commitSmall(ctx, current, expectRev, doc, ops)
	}
	return s.commitBatched(ctx, current, expectRev, doc, want, opts)
}

// CheckDocument refuses a valid cfg whose document (everything but its
// tenants) cannot be stored, as ApplyWith would: one rendering over
// MaxDocumentBytes (a *config.LimitError), or one that does not parse
// back. It lets an offline check or a dry run refuse what a write would.
func CheckDocument(cfg *config.Config) error {
	_, err := renderDocument(cfg)
	return err
}

// renderDocument is cfg without its tenants, as stored in the document key.
func renderDocument(cfg *config.Config) ([]byte, error) {
	base := *cfg
	base.Tenants = nil
	data, err := base.Marshal()
	if err != nil {
		return nil, err
	}
	if len(data) > MaxDocumentBytes {
		return nil, &config.LimitError{Limit: "configstore.MaxDocumentBytes", Max: MaxDocumentBytes, Got: int64(len(data)),
			What: "bytes of config without its tenants"}
	}
	// What is stored is what watchers will parse: check it parses too.
	if _, err := config.Parse(data); err != nil {
		return nil, fmt.Errorf("config: rendering does not parse back: %w", err)
	}
	return data, nil
}

func renderTenants(ctx context.Context, tenants map[string]config.Tenant) (map[string][]byte, error) {
	out := make(map[string][]byte, len(tenants))
	i := 0
	for id, t := range tenants {
		if i++; i%1024 == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		v, err := config.MarshalTenant(t)
		if err != nil {
			return nil, fmt.Errorf("%w: tenants.%s: %v", config.ErrInvalidConfig, id, err)
		}
		if len(v) > MaxTenantBytes {
			return nil, fmt.Errorf("tenants.%s: %w", id, &config.LimitError{Limit: "configstore.MaxTenantBytes",
				Max: MaxTenantBytes, Got: int64(len(v)), What: "bytes of one stored tenant"})
		}
		out[id] = v
	}
	return out, nil
}

// checkFence refuses a write whose expected revision is stale, or that
// would cross another apply's marker.
func (s *Store) checkFence(current *raw, expectRev int64, takeover bool) error {
	if current.applying != nil && !takeover {
		return fmt.Errorf("%w: %w: %v; the daemons run the config committed before it; finish it with a takeover (sluicectl apply -takeover)",
			ErrConflict, ErrApplyInProgress, current.applying)
	}
	if rev := docRev(current); rev != expectRev {
		return fmt.Errorf("%w: %s is at revision %d, expected %d; read it again and retry",
			ErrConflict, s.key, rev, expectRev)
	}
	return nil
}

func docRev(r *raw) int64 {
	if r.doc == nil {
		return 0
	}
	return r.doc.ModRevision
}

// tenantOps are the writes that turn the stored tenants into want, in key
// order, and their size in bytes.
func (s *Store) tenantOps(have, want map[string][]byte) ([]clientv3.Op, int) {
	var ids []string
	for id, v := range want {
		if old, ok := have[id]; !ok || !bytes.Equal(old, v) {
			ids = append(ids, id)
		}
	}
	for id := range have {
		if _, ok := want[id]; !ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	ops := make([]clientv3.Op, 0, len(ids))
	size := 0
	for _, id := range ids {
		key := s.TenantKey(id)
		if v, ok := want[id]; ok {
			ops = append(ops, clientv3.OpPut(key, string(v)))
			size += len(key) + len(v)
		} else {
			ops = append(ops, clientv3.OpDelete(key))
			size += len(key)
		}
	}
	return ops, size
}

// markerCmp holds while the marker is as read: absent, or at its revision.
func (s *Store) markerCmp(m *Marker) clientv3.Cmp {
	if m == nil {
		return clientv3.Compare(clientv3.CreateRevision(s.ApplyingKey()), "=", 0)
	}
	return clientv3.Compare(clientv3.ModRevision(s.ApplyingKey()), "=", m.Revision)
}

// commitSmall writes the tenant ops and the document in one transaction.
func (s *Store) commitSmall(ctx context.Context, current *raw, expectRev int64, doc []byte, ops []clientv3.Op) (int64, error) {
	then := append(ops, clientv3.OpPut(s.key, string(doc)))
	resp, err := s.txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(s.key), "=", expectRev), s.markerCmp(current.applying)).
		Then(then...).
		Commit()
	if err != nil {
		return 0, fmt.Errorf("config: write %s: %w", s.key, err)
	}
	if !resp.Succeeded {
		return 0, s.conflict(ctx, expectRev)
	}
	return resp.Header.Revision, nil
}

// conflict explains a failed fence.
func (s *Store) conflict(ctx context.Context, expectRev int64) error {
	current, err := s.readFence(ctx)
	if err != nil {
		return fmt.Errorf("%w: %s changed; expected revision %d", ErrConflict, s.key, expectRev)
	}
	if current.applying != nil {
		return fmt.Errorf("%w: %w: %v", ErrConflict, ErrApplyInProgress, current.applying)
	}
	return fmt.Errorf("%w: %s is at revision %d, expected %d; read it again and retry",
		ErrConflict, s.key, docRev(current), expectRev)
}

// readFence reads the document's and the marker's revisions only.
func (s *Store) readFence(ctx context.Context) (*raw, error) { return s.fenceAt(ctx, 0) }

// commitBatched writes a change too large for one transaction: marker,
// batches fenced on it, then the commit.
func (s *Store) commitBatched(ctx context.Context, current *raw, expectRev int64, doc []byte,
	want map[string][]byte, opts ApplyOptions) (int64, error) {
	marker, err := json.Marshal(Marker{Started: time.Now(), From: expectRev, Tenants: len(want)})
	if err != nil {
		return 0, err
	}
	resp, err := s.txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(s.key), "=", expectRev), s.markerCmp(current.applying)).
		Then(clientv3.OpPut(s.ApplyingKey(), string(marker))).
		Commit()
	if err != nil {
		return 0, fmt.Errorf("config: write %s: %w", s.ApplyingKey(), err)
	}
	if !resp.Succeeded {
		return 0, s.conflict(ctx, expectRev)
	}
	mine := &Marker{Revision: resp.Header.Revision}
	interrupted := func(done, total int, err error) error {
		return fmt.Errorf("%w after %d of %d tenant writes (marker %s at revision %d): %w; the daemons keep the config of revision %d and other writers are refused until an apply with takeover finishes it",
			ErrInterrupted, done, total, s.ApplyingKey(), mine.Revision, err, expectRev)
	}
	// Under the marker nobody else commits; what an apply taken over wrote
	// before the marker moved is read here.
	now, err := s.readRaw(ctx, 0)
	if err != nil {
		return 0, interrupted(0, 0, err)
	}
	ops, _ := s.tenantOps(now.tenants, want)
	var batches [][]clientv3.Op
	for start := 0; start < len(ops); {
		end, size := start, 0
		for end < len(ops) && end-start < TxnOps && size < txnBytes/2 {
			size += len(ops[end].KeyBytes()) + len(ops[end].ValueBytes())
			end++
		}
		batches = append(batches, ops[start:end])
		start = end
	}
	if err := s.writeBatches(ctx, mine, batches, len(ops), opts.Progress); err != nil {
		if errors.Is(err, ErrConflict) {
			return 0, err
		}
		return 0, interrupted(err.(*batchError).done, len(ops), err.(*batchError).err)
	}
	resp, err = s.txn(ctx).
		If(s.markerCmp(mine), clientv3.Compare(clientv3.ModRevision(s.key), "=", expectRev)).
		Then(clientv3.OpPut(s.key, string(doc)), clientv3.OpDelete(s.ApplyingKey())).
		Commit()
	if err != nil {
		return 0, interrupted(len(ops), len(ops), err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("%w: another writer took over this apply (marker %s moved from revision %d) before its commit",
			ErrConflict, s.ApplyingKey(), mine.Revision)
	}
	return resp.Header.Revision, nil
}

// TenantView is one tenant as committed, with the config document it is
// checked against, read together.
type TenantView struct {
	// Config is the committed document's config. Its Tenants are only those
	// the document itself lists (a config written before tenants had keys).
	Config *config.Config
	// Tenant is the tenant, nil when not listed.
	Tenant *config.Tenant
	// Revision is the config revision read.
	Revision int64
}

// Tenant reads one tenant and the config document at one revision,
// without reading any other tenant. An absent document is a nil Config.
func (s *Store) Tenant(ctx context.Context, id string) (*TenantView, error) {
	resp, err := s.txn(ctx).Then(
		clientv3.OpGet(s.key),
		clientv3.OpGet(s.ApplyingKey()),
		clientv3.OpGet(s.TenantKey(id)),
	).Commit()
	if err != nil {
		return nil, fmt.Errorf("config: read %s: %w", s.key, err)
	}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		// Tenants under the marker may not be committed: read the committed
		// snapshot instead.
		m := parseMarker(kvs[0])
		return s.tenantAt(ctx, id, m.Created-1)
	}
	return s.tenantFrom(ctx, resp.Responses[0].GetResponseRange().Kvs, resp.Responses[2].GetResponseRange().Kvs, id)
}

func (s *Store) tenantAt(ctx context.Context, id string, rev int64) (*TenantView, error) {
	resp, err := s.txn(ctx).Then(
		clientv3.OpGet(s.key, clientv3.WithRev(rev)),
		clientv3.OpGet(s.TenantKey(id), clientv3.WithRev(rev)),
	).Commit()
	if err != nil {
		return nil, fmt.Errorf("config: read %s at revision %d: %w", s.key, rev, err)
	}
	return s.tenantFrom(ctx, resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs, id)
}

func (s *Store) tenantFrom(ctx context.Context, docKvs, tenantKvs []*mvccpb.KeyValue, id string) (*TenantView, error) {
	if len(docKvs) == 0 {
		return &TenantView{}, nil
	}
	doc := docKvs[0]
	c, err := parseDocument(ctx, doc.Value)
	if err != nil {
		return &TenantView{Revision: doc.ModRevision}, fmt.Errorf("config: %s at revision %d: %w", s.key, doc.ModRevision, err)
	}
	v := &TenantView{Config: c, Revision: doc.ModRevision}
	if len(tenantKvs) > 0 {
		t, err := config.ParseTenant(tenantKvs[0].Value)
		if err != nil {
			return v, fmt.Errorf("config: %s at revision %d: %w", s.TenantKey(id), tenantKvs[0].ModRevision, err)
		}
		v.Tenant = &t
	} else if t, ok := c.Tenants[id]; ok {
		v.Tenant = &t
	}
	return v, nil
}

// SetTenants writes tenant changes (a nil Tenant deletes it) fenced on the
// config revision expectRev, checking each changed tenant against the
// committed document only (config.TenantProblems): one transaction,
// whatever the number of other tenants. More than TxnOps-1 changes, or a
// document that still lists tenants itself, goes through ApplyWith with
// the whole config (the latter moves them to their keys).
func (s *Store) SetTenants(ctx context.Context, changes map[string]*config.Tenant, expectRev int64) (int64, error) {
	fence, err := s.readFence(ctx)
	if err != nil {
		return 0, fmt.Errorf("config: read %s: %w", s.key, err)
	}
	if err := s.checkFence(fence, expectRev, false); err != nil {
		return 0, err
	}
	if fence.doc == nil {
		return 0, fmt.Errorf("%w: no config in etcd at %s to add tenants to", config.ErrInvalidConfig, s.key)
	}
	resp, err := s.get(ctx, s.key, clientv3.WithRev(expectRev))
	if err != nil {
		return 0, fmt.Errorf("config: read %s: %w", s.key, err)
	}
	if len(resp.Kvs) == 0 {
		return 0, fmt.Errorf("%w: %s at revision %d is gone", ErrConflict, s.key, expectRev)
	}
	doc := resp.Kvs[0].Value
	c, err := parseDocument(ctx, doc)
	if err != nil {
		return 0, fmt.Errorf("config: %s at revision %d: %w", s.key, expectRev, err)
	}
	if len(c.Tenants) > 0 || len(changes) >= TxnOps {
		full, rev, err := s.Get(ctx)
		if err != nil {
			return 0, err
		}
		if rev != expectRev {
			return 0, fmt.Errorf("%w: %s is at revision %d, expected %d", ErrConflict, s.key, rev, expectRev)
		}
		if full.Tenants == nil {
			full.Tenants = map[string]config.Tenant{}
		}
		for id, t := range changes {
			if t == nil {
				delete(full.Tenants, id)
			} else {
				full.Tenants[id] = *t
			}
		}
		return s.Apply(ctx, full, expectRev)
	}
	var problems []error
	ops := []clientv3.Op{}
	for _, id := range slices.Sorted(maps.Keys(changes)) {
		t := changes[id]
		if t == nil {
			ops = append(ops, clientv3.OpDelete(s.TenantKey(id)))
			continue
		}
		if err := c.TenantProblems(id, *t); err != nil {
			problems = append(problems, err)
			continue
		}
		v, err := config.MarshalTenant(*t)
		if err != nil {
			problems = append(problems, fmt.Errorf("%w: tenants.%s: %v", config.ErrInvalidConfig, id, err))
			continue
		}
		ops = append(ops, clientv3.OpPut(s.TenantKey(id), string(v)))
	}
	if len(problems) > 0 {
		return 0, errors.Join(problems...)
	}
	return s.commitSmall(ctx, fence, expectRev, doc, ops)
}

// TenantEntry is one stored tenant as listed.
type TenantEntry struct {
	ID     string
	Tenant config.Tenant
	// Err is set when the stored value does not parse.
	Err error
}

// ListTenants calls fn for each committed tenant whose id starts with
// prefix, in id order, reading limit ids at a time from etcd (never the
// whole set at once), until fn returns false. It returns the config
// revision read. Tenants listed inside a legacy document come first.
func (s *Store) ListTenants(ctx context.Context, prefix string, fn func(TenantEntry) bool) (int64, error) {
	fence, err := s.readFence(ctx)
	if err != nil {
		return 0, fmt.Errorf("config: read %s: %w", s.key, err)
	}
	rev := fence.rev
	if fence.applying != nil {
		rev = fence.applying.Created - 1
	}
	docResp, err := s.get(ctx, s.key, clientv3.WithRev(rev))
	if err != nil {
		return 0, fmt.Errorf("config: read %s: %w", s.key, err)
	}
	if len(docResp.Kvs) == 0 {
		return 0, nil
	}
	configRev := docResp.Kvs[0].ModRevision
	if c, err := parseDocument(ctx, docResp.Kvs[0].Value); err == nil {
		for _, id := range slices.Sorted(maps.Keys(c.Tenants)) {
			if strings.HasPrefix(id, prefix) && !fn(TenantEntry{ID: id, Tenant: c.Tenants[id]}) {
				return configRev, nil
			}
		}
	}
	from := s.TenantKey(prefix)
	end := clientv3.GetPrefixRangeEnd(from)
	for {
		resp, err := s.get(ctx, from, clientv3.WithRange(end), clientv3.WithRev(rev), clientv3.WithLimit(readPage))
		if err != nil {
			return configRev, fmt.Errorf("config: read %s: %w", s.TenantPrefix(), err)
		}
		for _, kv := range resp.Kvs {
			id := string(kv.Key[len(s.TenantPrefix()):])
			t, err := config.ParseTenant(kv.Value)
			if !fn(TenantEntry{ID: id, Tenant: t, Err: err}) {
				return configRev, nil
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return configRev, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// batchesInFlight is how many batch transactions are sent at once: etcd
// commits concurrent proposals with one disk sync, so a large apply is not
// one sync per batch.
const batchesInFlight = 8

// batchError is a batch that failed for a reason other than a moved
// marker, with the tenant writes acknowledged before it.
type batchError struct {
	done int
	err  error
}

func (e *batchError) Error() string { return e.err.Error() }

// writeBatches sends the batches, each fenced on the marker, at most
// batchesInFlight at once. A moved marker is an error wrapping
// ErrConflict; anything else is a *batchError.
func (s *Store) writeBatches(ctx context.Context, mine *Marker, batches [][]clientv3.Op, total int, progress func(done, total int)) error {
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu    sync.Mutex // guards done, first and progress calls
		done  int
		first error
		wg    sync.WaitGroup
	)
	next := make(chan []clientv3.Op)
	fail := func(err error) {
		mu.Lock()
		if first == nil {
			first = err
		}
		mu.Unlock()
		cancel()
	}
	for range min(batchesInFlight, len(batches)) {
		wg.Go(func() {
			for batch := range next {
				resp, err := s.writeBatch(bctx, mine, batch)
				switch {
				case err != nil:
					mu.Lock()
					d := done
					mu.Unlock()
					fail(&batchError{done: d, err: err})
				case !resp.Succeeded:
					mu.Lock()
					d := done
					mu.Unlock()
					fail(fmt.Errorf("%w: another writer took over this apply (marker %s moved from revision %d) after %d of %d tenant writes",
						ErrConflict, s.ApplyingKey(), mine.Revision, d, total))
				default:
					mu.Lock()
					done += len(batch)
					if progress != nil {
						progress(done, total)
					}
					mu.Unlock()
				}
			}
		})
	}
feed:
	for _, b := range batches {
		select {
		case next <- b:
		case <-bctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = &batchError{done: done, err: ctx.Err()}
	}
	return first
}

// batchAttempts is how many times a batch is sent when etcd fails it (a
// request timed out on an overloaded etcd): the batch's writes are
// idempotent and fenced on the marker, so sending it again is safe.
const batchAttempts = 5

func (s *Store) writeBatch(ctx context.Context, mine *Marker, batch []clientv3.Op) (*clientv3.TxnResponse, error) {
	wait := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		resp, err := s.txn(ctx).If(s.markerCmp(mine)).Then(batch...).Commit()
		if err == nil || ctx.Err() != nil || attempt == batchAttempts {
			return resp, err
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, err
		case <-timer.C:
		}
		wait *= 2
	}
}
