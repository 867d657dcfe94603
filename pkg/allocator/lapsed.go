package allocator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/hierarchy"
	"github.com/sluicehq/sluice/pkg/quota"
)

// The durable lapsed set: the regions whose static lease a leader found
// lapsed (and so counts, or may have counted, at their floor). It lives in
// one etcd key, written only by the leader in a transaction fenced on its
// election key, before the allocator counts a region at its floor
// (hierarchy.Allocator.LapseDurable), and read by every new leader once it
// has won (hierarchy.Allocator.BecomeLeader): a new leader confers those
// regions no static lease while it learns. Removal is lazy: a region
// leaves the set with the next write after it was conferred a static lease
// again. A shard that owns nothing under the live config lapses no region
// (shard.go: no region reports to it, so its silence says nothing).

// lapsedValue is the JSON of the lapsed-set key.
type lapsedValue struct {
	Regions []string `json:"regions"`
}

// LapsedKey is the etcd key of the durable lapsed set under prefix (""
// means config.DefaultPrefix).
func LapsedKey(prefix string) string {
	if prefix == "" {
		prefix = config.DefaultPrefix
	}
	for len(prefix) > 0 && prefix[len(prefix)-1] == '/' {
		prefix = prefix[:len(prefix)-1]
	}
	return prefix + "/global/lapsed"
}

// ReadLapsed reads the durable lapsed set (nil when the key is absent).
// Content that is not the set is an error: a leader must not start
// without knowing it.
func ReadLapsed(ctx context.Context, cli *clientv3.Client, key string) ([]string, error) {
	resp, err := cli.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("read the lapsed set: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	var v lapsedValue
	if err := json.Unmarshal(resp.Kvs[0].Value, &v); err != nil {
		return nil, fmt.Errorf("read the lapsed set %s: %w", key, err)
	}
	for _, r := range v.Regions {
		if err := quota.ValidateID("region", r); err != nil {
			return nil, fmt.Errorf("read the lapsed set %s: %w", key, err)
		}
	}
	return v.Regions, nil
}

// errNotLeader: the fenced write found this replica's election key gone.
var errNotLeader = errors.New("no longer the leader")

// writeLapsed writes the set, only while the leader's election key (this
// replica's candidacy) still exists with the create revision it won with.
func writeLapsed(ctx context.Context, cli *clientv3.Client, electionKey string, rev int64, key string, regions []string) error {
	data, err := json.Marshal(lapsedValue{Regions: regions})
	if err != nil {
		return err
	}
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(electionKey), "=", rev)).
		Then(clientv3.OpPut(key, string(data))).
		Commit()
	if err != nil {
		return fmt.Errorf("write the lapsed set: %w", err)
	}
	if !resp.Succeeded {
		return errNotLeader
	}
	return nil
}

// lapsePlan is what persisting needs from the Service: the regions pending
// a lapse, and the set to write (what the allocator needs kept plus them).
// write is false when there is nothing to write.
type lapsePlan struct {
	pending []string
	set     []string
	write   bool
}

// planLapses looks at the allocator while leading at now.
func (s *Service) planLapses(now time.Time) lapsePlan {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ok, _ := s.leaderAt(now); !ok {
		return lapsePlan{}
	}
	var pending []string
	if !s.idleLocked() {
		pending = s.alloc.PendingLapses(now)
	}
	set := s.alloc.LapsedSet()
	for _, r := range pending {
		if !slices.Contains(set, r) {
			set = append(set, r)
		}
	}
	// The set written is what the allocator holds lapsed now: a region
	// the store names that it no longer holds (conferred a lease again, or
	// removed from the config) is left out, and a set that would shrink is
	// written even with nothing pending, so that a successor does not keep
	// a region that came back at its floor.
	slices.Sort(set)
	shrink := !slices.Equal(set, s.stored) && len(set) < len(s.stored)
	return lapsePlan{pending: pending, set: set, write: len(pending) > 0 || shrink}
}

// lapsesWritten is called after plan.set was written durably: the pending
// regions are counted at their floor from now on.
func (s *Service) lapsesWritten(now time.Time, plan lapsePlan) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stored, s.storedMoot = plan.set, false
	for _, r := range plan.pending {
		ok, err := s.alloc.LapseDurable(now, r)
		if err != nil {
			continue // the region left the config meanwhile
		}
		if ok {
			s.log.Warn("region's static lease lapsed: the global tier reserves only its floor for it and re-divides the rest",
				"region", r, "silent_for_more_than", s.lapseAfterLocked())
		}
	}
}

// lapseAfterLocked is the silence after which a region lapses. s.mu is held.
func (s *Service) lapseAfterLocked() time.Duration {
	lease := s.alloc.RegionLease()
	return lease + s.timing.validity + time.Duration(hierarchy.LapseMargin(s.timing.epoch, lease))
}

// persistLapses runs while this replica leads (electionKey and rev its
// won candidacy): every half epoch it makes pending lapses durable, then
// tells the allocator. It returns when ctx is done.
func (e *elector) persistLapses(ctx context.Context, electionKey string, rev int64) {
	for {
		timer := time.NewTimer(max(e.svc.epoch()/2, time.Millisecond))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		plan := e.svc.planLapses(time.Now())
		if !plan.write {
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, e.ttl)
		err := writeLapsed(wctx, e.cli, electionKey, rev, e.lapsedKey, plan.set)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				e.log.Warn("lapsed set not written; retrying (the regions stay counted at their static share)", "regions", plan.set, "error", err)
			}
			continue
		}
		e.svc.lapsesWritten(time.Now(), plan)
	}
}
