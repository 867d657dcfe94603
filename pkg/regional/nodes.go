package regional

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/pkg/luascripts"
)

// clusterNodes keeps the script calls of a region on a Redis Cluster apart
// by the master that holds their key, so that one master down or hung
// costs only its own keys (docs/architecture.md, failure table: "one
// master of a Redis Cluster hung" and "down").
//
// Why: every call used to share one batcher, whose pipelines mixed keys of
// every node and ended when the slowest node answered. A hung master held
// each pipeline it had a key in for the whole RedisTimeout, the four
// workers were soon all stuck on such pipelines, and calls for healthy
// masters waited behind them; a Sync with one key on a failed master
// failed as a whole. So:
//   - each master has its own batcher (pipelines of its keys only);
//   - a master that failed a call (an error of the connection or the
//     cluster, or no answer within RedisTimeout) is skipped for
//     RedisTimeout: its keys' calls fail at once, answered
//     rpcerr.RedisNodeFailedStatus, instead of queueing behind a node that
//     does not answer; the first call after that is sent to it again;
//   - a Sync answers the keys of the other masters (SyncRequest.key_failures).
//
// A key's master is go-redis's view of the slot map (refreshed on MOVED
// and periodically), so a failover moves the key's calls to the promoted
// replica's batcher. Masters that left the cluster keep their idle batcher
// (a few goroutines each) until the server closes: a cluster has a handful
// of masters and changes them rarely.
//
// Safe for concurrent use.
type clusterNodes struct {
	cc       *redis.ClusterClient
	scripts  *luascripts.Scripts
	timeout  time.Duration // RedisTimeout: a pipeline's bound, and how long a failed master is skipped
	workers  int
	maxBatch int

	// byAddr maps a master's address to it: read without a lock on every
	// call, replaced whole (under mu) when a master is first seen.
	byAddr atomic.Pointer[map[string]*clusterNode]
	mu     sync.Mutex
	closed bool // guarded by mu
}

// clusterNode is one master's batcher and its recent failure.
type clusterNode struct {
	addr   string
	client *redis.Client // the master's own client, for the readiness ping
	batch  *batcher
	// skipUntil is when a call for the master's keys is sent to it again
	// after it failed one (Unix ns; 0: it answered the last call judged).
	skipUntil atomic.Int64
	// probing is set while the one call let through after skipUntil (the
	// probe) is out: until its verdict the master's other calls fail at
	// once too, so a master that still does not answer holds one call,
	// not all of them.
	probing atomic.Bool
	// leaderSkipUntil is when the region leader sends the master its
	// calls again after one did not answer within the leader's bound
	// (perNode, onNode; Unix ns). The leader's alone: its bound is shorter
	// than RedisTimeout, and a master slow for it is not failed for the
	// instances' calls; the late call's own outcome judges it.
	leaderSkipUntil atomic.Int64
}

// leaderSkipped reports whether the region leader's calls skip nd at now.
func (nd *clusterNode) leaderSkipped(now time.Time) bool {
	return now.UnixNano() < nd.leaderSkipUntil.Load()
}

// nodeFailure is a call failed by its key's master: the error of that
// node, or errNodeSkipped.
type nodeFailure struct {
	node string
	err  error
}

func (e *nodeFailure) Error() string { return fmt.Sprintf("redis node %s: %v", e.node, e.err) }
func (e *nodeFailure) Unwrap() error { return e.err }

// errNodeSkipped fails at once a call for a master that failed a call
// within the last RedisTimeout.
var errNodeSkipped = errors.New("failed a call within the last redis timeout; its keys are not sent to it until then")

func newClusterNodes(cc *redis.ClusterClient, scripts *luascripts.Scripts, workers, maxBatch int, timeout time.Duration) *clusterNodes {
	n := &clusterNodes{cc: cc, scripts: scripts, timeout: timeout, workers: workers, maxBatch: maxBatch}
	n.byAddr.Store(&map[string]*clusterNode{})
	return n
}

// node is the master that holds key, as the client's slot map says.
func (n *clusterNodes) node(ctx context.Context, key string) (*clusterNode, error) {
	c, err := n.cc.MasterForKey(ctx, key)
	if err != nil {
		return nil, err
	}
	addr := c.Options().Addr
	if nd := (*n.byAddr.Load())[addr]; nd != nil {
		return nd, nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, errors.New("regional server closed")
	}
	old := *n.byAddr.Load()
	if nd := old[addr]; nd != nil {
		return nd, nil
	}
	nd := &clusterNode{addr: addr, client: c, batch: newBatcher(n.cc, n.scripts, n.workers, n.maxBatch, n.timeout)}
	next := make(map[string]*clusterNode, len(old)+1)
	maps.Copy(next, old)
	next[addr] = nd
	n.byAddr.Store(&next)
	return nd, nil
}

// skipped reports whether a call at now must fail at once: nd failed a
// call less than RedisTimeout before now, or did earlier and the call let
// through since (the probe) has no verdict yet. Otherwise the call is
// sent, as the probe when nd failed the last call judged.
func (nd *clusterNode) skipped(now time.Time) bool {
	until := nd.skipUntil.Load()
	switch {
	case until == 0:
		return false
	case now.UnixNano() < until:
		return true
	}
	return !nd.probing.CompareAndSwap(false, true)
}

// judge records what the outcome err of a call to nd says of the node and
// returns err, wrapped as the node's failure when it is one. Errors of the
// script itself (a bug, refused input) say nothing of the node.
func (n *clusterNodes) judge(nd *clusterNode, now time.Time, err error) error {
	defer nd.probing.Store(false)
	switch {
	case err == nil:
		nd.skipUntil.Store(0)
		return nil
	case !nodeFailed(err):
		nd.skipUntil.Store(0)
		return err
	}
	nd.skipUntil.Store(now.Add(n.timeout).UnixNano())
	return &nodeFailure{node: nd.addr, err: err}
}

// do runs one script call for key on its master's batcher (batcher.do),
// and judges the node by the call's outcome, which parse reads from the
// queued call. A master skipped after a failure fails the call at once.
// A caller that gave up (ctx) gets its context's error and no verdict.
func (n *clusterNodes) do(ctx context.Context, key string, queue func(context.Context, redis.Pipeliner) *luascripts.Queued, parse func(*luascripts.Queued) error) error {
	nd, err := n.node(ctx, key)
	if err != nil {
		return err
	}
	if nd.skipped(time.Now()) {
		return &nodeFailure{node: nd.addr, err: errNodeSkipped}
	}
	// A caller that gives up before the node answered (an instance's
	// acquire waits less than RedisTimeout) still leaves a verdict, from
	// the call's own outcome once its pipeline ends: otherwise a hung
	// master whose callers all give up first is never skipped, and every
	// call for its keys waits out its caller's deadline, which the
	// instance counts against the whole region.
	q, pending, err := nd.batch.doThen(ctx, queue, func(q *luascripts.Queued) {
		n.judge(nd, time.Now(), q.Cmd.Err())
	})
	if err != nil {
		if !pending {
			nd.probing.Store(false) // not sent, no verdict: the next call probes
		}
		return err
	}
	return n.judge(nd, time.Now(), parse(q))
}

// masters is the masters that hold keys (the client's slot map), each
// once, in no order. It judges none and takes no probe.
func (n *clusterNodes) masters(ctx context.Context, keys []string) []*clusterNode {
	seen := map[*clusterNode]bool{}
	var out []*clusterNode
	for _, k := range keys {
		nd, err := n.node(ctx, k)
		if err != nil || seen[nd] {
			continue
		}
		seen[nd] = true
		out = append(out, nd)
	}
	return out
}

// failedRecently reports whether nd failed a call less than RedisTimeout
// before now (it is skipped), without taking the probe.
func (nd *clusterNode) failedRecently(now time.Time) bool {
	return now.UnixNano() < nd.skipUntil.Load()
}

// split sorts keys by master for a call of many keys (Sync, Release):
// skip[i] is the failure of keys[i] when its master is skipped (nil: send
// it), and nodes[i] its master, for judge. A key whose master is unknown
// (the slot map could not be read) is sent: the call then fails as Redis
// does.
func (n *clusterNodes) split(ctx context.Context, keys []string) (nodes []*clusterNode, skip []error) {
	nodes, skip = make([]*clusterNode, len(keys)), make([]error, len(keys))
	now := time.Now()
	for i, k := range keys {
		nd, err := n.node(ctx, k)
		if err != nil {
			continue
		}
		nodes[i] = nd
		if nd.skipped(now) {
			skip[i] = &nodeFailure{node: nd.addr, err: errNodeSkipped}
		}
	}
	return nodes, skip
}

// known is the masters that have held the key of a call so far.
func (n *clusterNodes) known() []*clusterNode {
	m := *n.byAddr.Load()
	out := make([]*clusterNode, 0, len(m))
	for _, nd := range m {
		out = append(out, nd)
	}
	return out
}

// close stops every master's batcher once its queued calls are done.
func (n *clusterNodes) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
	for _, nd := range *n.byAddr.Load() {
		nd.batch.close()
	}
}

// nodeFailed reports whether err, the outcome of a script call, says its
// node failed: no answer within the bound (the pipeline's deadline, or a
// script that ran past its own: a node that queued it), the connection
// (refused, reset, closed, timed out), or the cluster refusing to serve
// the slot for now (CLUSTERDOWN while it marks the node failed, LOADING,
// TRYAGAIN and MASTERDOWN while it rejoins or fails over).
func nodeFailed(err error) bool {
	if err == nil {
		return false
	}
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, luascripts.ErrTooLate),
		errors.As(err, &ne), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, net.ErrClosed):
		return true
	}
	msg := err.Error()
	for _, p := range []string{"CLUSTERDOWN", "LOADING", "TRYAGAIN", "MASTERDOWN"} {
		if strings.HasPrefix(msg, p) || strings.Contains(msg, ": "+p) {
			return true
		}
	}
	return false
}

// call runs one script call for the Redis key key, batched with other
// callers' (batcher), and parse reads its result; on a Redis Cluster, on
// the batcher of key's master (clusterNodes.do).
func (s *Server) call(ctx context.Context, key string, queue func(context.Context, redis.Pipeliner) *luascripts.Queued, parse func(*luascripts.Queued) error) error {
	if s.nodes != nil {
		return s.nodes.do(ctx, key, queue, parse)
	}
	q, err := s.batch.do(ctx, queue)
	if err != nil {
		return err
	}
	return parse(q)
}

// syncMany runs sync.lua for every item in pipelines (SyncMany). On a
// Redis Cluster the items of a skipped master fail at once, the others'
// pipelines are bounded by RedisTimeout, and each item's outcome judges
// its master (clusterNodes).
func (s *Server) syncMany(ctx context.Context, items []luascripts.SyncItem) []luascripts.SyncResult {
	return manyAcrossNodes(s, ctx, items, func(ctx context.Context, items []luascripts.SyncItem) []luascripts.SyncResult {
		return s.scripts.SyncMany(ctx, s.opts.Redis, items)
	}, func(r *luascripts.SyncResult) *error { return &r.Err })
}

// releaseMany is syncMany for release.lua (ReleaseMany).
func (s *Server) releaseMany(ctx context.Context, items []luascripts.SyncItem) []luascripts.ReleaseResult {
	return manyAcrossNodes(s, ctx, items, func(ctx context.Context, items []luascripts.SyncItem) []luascripts.ReleaseResult {
		return s.scripts.ReleaseMany(ctx, s.opts.Redis, items)
	}, func(r *luascripts.ReleaseResult) *error { return &r.Err })
}

// manyAcrossNodes runs an instance's call of many items through run: on a
// single Redis as one, on a Redis Cluster once per master (acrossNodes),
// each result's error (errp) its master's failure when it is one.
func manyAcrossNodes[R any](s *Server, ctx context.Context, items []luascripts.SyncItem,
	run func(context.Context, []luascripts.SyncItem) []R, errp func(*R) *error) []R {
	if s.nodes == nil {
		return run(ctx, items)
	}
	out := make([]R, len(items))
	s.acrossNodes(ctx, items, func(i int, err error) { *errp(&out[i]) = err }, func(ctx context.Context, idx []int, sent []luascripts.SyncItem) []error {
		res := run(ctx, sent)
		errs := make([]error, len(res))
		for j := range res {
			out[idx[j]], errs[j] = res[j], *errp(&res[j])
		}
		return errs
	})
	return out
}

// acrossNodes is the cluster half of syncMany and releaseMany: fail
// records the failure of the item of a skipped master, and run runs the
// items sent (their indexes idx) and returns their errors, once per
// master, side by side, each bounded by RedisTimeout. The errors judge
// their masters, also when the caller gave up meanwhile; an item's error
// becomes its master's failure (nodeFailure) when it is one. (One
// pipeline of every master's items, go-redis's own split, ended when its
// slowest node did, failing the healthy masters' items with it.)
func (s *Server) acrossNodes(ctx context.Context, items []luascripts.SyncItem, fail func(i int, err error), run func(ctx context.Context, idx []int, sent []luascripts.SyncItem) []error) {
	keys := make([]string, len(items))
	for i, it := range items {
		keys[i] = it.Keys.Bucket
	}
	nodes, skip := s.nodes.split(ctx, keys)
	groups := map[*clusterNode][]int{}
	for i := range items {
		if skip[i] != nil {
			fail(i, skip[i])
			continue
		}
		groups[nodes[i]] = append(groups[nodes[i]], i)
	}
	// Bounded by RedisTimeout, not by the caller's deadline: an instance's
	// Sync may wait less (its default timeout is refresh / 2) and a hung
	// master must still be judged, or it is never skipped and every Sync
	// with one of its keys fails as a whole.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.RedisTimeout)
	defer cancel()
	errs := make([]error, len(items))
	var wg sync.WaitGroup
	for _, idx := range groups {
		wg.Go(func() {
			sent := make([]luascripts.SyncItem, len(idx))
			for j, i := range idx {
				sent[j] = items[i]
			}
			for j, err := range run(rctx, idx, sent) {
				errs[idx[j]] = err
			}
		})
	}
	wg.Wait()
	now := time.Now()
	for nd, idx := range groups {
		if nd == nil {
			continue // master unknown: the call failed as Redis does
		}
		for _, i := range idx {
			if jerr := s.nodes.judge(nd, now, errs[i]); jerr != errs[i] {
				fail(i, jerr)
			}
		}
	}
}

// perNode runs the calls of keys (Redis keys) once per master, side by
// side, for the region leader: run gets the indexes of one master's keys
// and returns their errors and commit, which stores its results. perNode
// waits for each master at most bound: a client's socket reads are bound
// by its ReadTimeout (RedisTimeout), not by a context, so a master that
// does not answer would hold the leader's round for that long, past its
// epoch. A master that has not answered by then fails its keys
// (nodeFailure, context.DeadlineExceeded) and is judged failed; its call
// ends in the background and its late results are dropped (commit never
// called). fail records a key whose master is skipped or failed; a key's
// other errors are run's. commit runs on perNode's goroutine.
func (s *Server) perNode(ctx context.Context, keys []string, bound time.Duration, fail func(i int, err error), run func(ctx context.Context, idx []int) (errs []error, commit func())) {
	nodes, skip := s.nodes.split(ctx, keys)
	groups := map[*clusterNode][]int{}
	now := time.Now()
	for i := range keys {
		if skip[i] == nil && nodes[i] != nil && nodes[i].leaderSkipped(now) {
			skip[i] = &nodeFailure{node: nodes[i].addr, err: errLeaderSkipped}
		}
		if skip[i] != nil {
			fail(i, skip[i])
			continue
		}
		groups[nodes[i]] = append(groups[nodes[i]], i)
	}
	type done struct {
		nd     *clusterNode
		errs   []error
		commit func()
	}
	// The calls run to their own end (RedisTimeout at most, the client's
	// reads): a late one judges its master by its outcome.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.RedisTimeout)
	got := make(chan done, len(groups))
	var late sync.Map // *clusterNode -> true once perNode stopped waiting
	for nd, idx := range groups {
		go func() {
			errs, commit := run(rctx, idx)
			if _, gaveUp := late.Load(nd); gaveUp && nd != nil {
				// Nobody waits: its outcome judges the master alone.
				now := time.Now()
				for _, err := range errs {
					s.nodes.judge(nd, now, err)
				}
				return
			}
			got <- done{nd, errs, commit}
		}()
	}
	timer := time.NewTimer(bound)
	defer timer.Stop()
	finished := map[*clusterNode]bool{}
	judgeGroup := func(nd *clusterNode, errs []error) {
		now := time.Now()
		for j, i := range groups[nd] {
			if nd == nil {
				continue // master unknown: the call failed as Redis does
			}
			if jerr := s.nodes.judge(nd, now, errs[j]); jerr != errs[j] {
				fail(i, jerr)
			}
		}
	}
wait:
	for len(finished) < len(groups) {
		select {
		case d := <-got:
			finished[d.nd] = true
			d.commit()
			judgeGroup(d.nd, d.errs)
		case <-timer.C:
			break wait
		}
	}
	// The masters that did not answer within bound fail their keys here,
	// and the leader skips them for RedisTimeout; their calls go on in the
	// background (cancel runs once the last is done).
	var out sync.WaitGroup
	for nd, idx := range groups {
		if finished[nd] {
			continue
		}
		late.Store(nd, true)
		out.Add(1)
		if nd != nil {
			nd.leaderSkipUntil.Store(time.Now().Add(s.opts.RedisTimeout).UnixNano())
		}
		for _, i := range idx {
			fail(i, &nodeFailure{node: addrOf(nd), err: fmt.Errorf("no answer within the region leader's bound %v: %w", bound, context.DeadlineExceeded)})
		}
	}
	// Drain what is still sent on got (a call that finished between the
	// timer and late.Store), so the goroutines end; then cancel.
	go func() {
		for range len(groups) - len(finished) {
			select {
			case d := <-got:
				now := time.Now()
				for _, err := range d.errs {
					if d.nd != nil {
						s.nodes.judge(d.nd, now, err)
					}
				}
			case <-rctx.Done():
			}
		}
		cancel()
	}()
}

func addrOf(nd *clusterNode) string {
	if nd == nil {
		return ""
	}
	return nd.addr
}

// errLeaderSkipped fails at once a region leader's call for a master that
// did not answer one within the leader's bound less than RedisTimeout ago.
var errLeaderSkipped = errors.New("did not answer the region leader within its bound less than the redis timeout ago; not sent to it until then")

// onNode runs fn, one call for the Redis key key, and returns its value.
// On a Redis Cluster it fails at once with the master's failure when
// key's master is skipped, waits for the answer at most bound (as
// perNode; a late answer is dropped), and the outcome judges the master
// (its failure wrapped as nodeFailure). The region leader's single-key
// calls (its static lease, its confirmed revision) go through it, so that
// a failed master holds none of its rounds for longer than bound.
func onNode[T any](ctx context.Context, s *Server, key string, bound time.Duration, fn func(ctx context.Context) (T, error)) (T, error) {
	if s.nodes == nil {
		return fn(ctx) // one Redis: the caller's deadline alone
	}
	var zero T
	nd, err := s.nodes.node(ctx, key)
	if err != nil {
		return fn(ctx) // master unknown: the call fails as Redis does
	}
	if nd.leaderSkipped(time.Now()) {
		return zero, &nodeFailure{node: nd.addr, err: errLeaderSkipped}
	}
	if nd.skipped(time.Now()) {
		return zero, &nodeFailure{node: nd.addr, err: errNodeSkipped}
	}
	type result struct {
		v   T
		err error
	}
	// The call runs to its own end (RedisTimeout at most): a late one
	// judges its master by its outcome.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.RedisTimeout)
	got := make(chan result, 1)
	go func() {
		defer cancel()
		v, err := fn(rctx)
		got <- result{v, err}
	}()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	select {
	case r := <-got:
		return r.v, s.nodes.judge(nd, time.Now(), r.err)
	case <-timer.C:
		nd.leaderSkipUntil.Store(time.Now().Add(s.opts.RedisTimeout).UnixNano())
		go func() {
			r := <-got
			s.nodes.judge(nd, time.Now(), r.err)
		}()
		return zero, &nodeFailure{node: nd.addr, err: fmt.Errorf("no answer within the region leader's bound %v: %w", bound, context.DeadlineExceeded)}
	}
}

// countErrs is the number of results that failed.
func countErrs(results []luascripts.SyncResult) int {
	n := 0
	for _, r := range results {
		if r.Err != nil {
			n++
		}
	}
	return n
}
