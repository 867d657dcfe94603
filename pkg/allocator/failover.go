package allocator

import (
	"time"

	"github.com/sluicehq/sluice/pkg/config"
)

// EtcdLeaseScan is how often etcd looks for expired leases (its lessor
// scans every 500ms): a lease's keys vanish up to this long after its TTL
// ran out.
const EtcdLeaseScan = 500 * time.Millisecond

// FailoverBound is the shortest region_lease that keeps every region on
// its static shares when the global leader dies without resigning (SIGKILL,
// a lost machine), with a standby or without one. Shorter, every region
// runs each key on its floor (partition_share of its static share) for a
// part of the failover: the region cannot tell a dead leader from a live
// one it is cut off from while the dead leader's election key stays, and a
// live one lapses it on time (docs/architecture.md, "The static lease:
// the region's side", Global tier down). The sum, with P the epoch:
//
//   - 2P: the last report the dead leader answered may have been sent two
//     epochs before the crash (regions report every epoch and abandon a
//     report after one; the one in flight dies with the leader). The
//     region's lease ends region_lease after that send.
//   - sessionTTL + EtcdLeaseScan: etcd drops the dead leader's election
//     key one TTL after its last refresh, at its next expiry scan.
//   - 2P: then a standby wins at once and the region's next round reaches
//     it (the round under way may wait out its epoch on the dead address,
//     the next one starts within an epoch and is answered within its
//     epoch), conferring a static lease; without a standby, the region's
//     read of the empty election after a failed sync, which extends its
//     lease, comes as late.
//   - P + P/4: the region's replicas hand their scripts the floor one
//     epoch before the lease ends (regionsync.StaticMargin) and read the
//     stored lease every quarter epoch.
//
// Round trips (a report, an etcd read) come on top; on a healthy network
// they are milliseconds. etcd may also hold a lease past its TTL across an
// etcd leader election.
func FailoverBound(sessionTTL, epoch time.Duration) time.Duration {
	return sessionTTL + EtcdLeaseScan + 5*epoch + epoch/4
}

// RegionLeaseBelowFailover says whether cfg's region_lease is shorter than
// FailoverBound for a global tier of the given session TTL, and the bound.
func RegionLeaseBelowFailover(cfg *config.Config, sessionTTL time.Duration) (below bool, bound time.Duration) {
	bound = FailoverBound(sessionTTL, time.Duration(cfg.Epoch))
	return time.Duration(cfg.RegionLease) < bound, bound
}

// checkFailoverLocked logs, for every config the replica loads, whether its
// region_lease covers this replica's failover (FailoverBound): at ERROR
// while it does not (sluice_global_region_lease_below_failover is 1 then),
// at INFO when a config brings it back. Refusing the config or the start
// would take the global tier down over a setting that costs availability
// only, never a limit. s.mu is held.
func (s *Service) checkFailoverLocked(cfg *config.Config) {
	if s.sessionTTL <= 0 {
		return
	}
	below, bound := RegionLeaseBelowFailover(cfg, s.sessionTTL)
	was := s.leaseBelowFailover.Swap(below)
	switch {
	case below:
		s.log.Error("region_lease is shorter than the global tier's failover: a global leader that dies without resigning puts every region on its floor until a leader answers (raise region_lease, or lower -session-ttl)",
			"region_lease", time.Duration(cfg.RegionLease), "failover_bound", bound,
			"session_ttl", s.sessionTTL, "epoch", time.Duration(cfg.Epoch))
	case was:
		s.log.Info("region_lease covers the global tier's failover again",
			"region_lease", time.Duration(cfg.RegionLease), "failover_bound", bound)
	}
}
