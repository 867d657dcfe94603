// Package live plays a scenario against the real daemons in one process:
// an embedded etcd, a Redis per region (a redis-server child process, or an
// embedded Redis with a warning when none is installed), the regional
// daemons with their region leaders, two global allocator daemons (leader
// and standby) and one lease client per instance, all talking gRPC on
// loopback. The same traffic plan, fault schedule and oracle as virtual mode
// judge the run.
//
// # Time scale
//
// Scale s plays s scenario seconds per wall second: the Sluice config's
// durations are divided by s and its rates multiplied by s, arrival rates
// likewise, and every observation is stamped (wall elapsed) × s, so the
// oracle sees the scenario's own units. The etcd session TTL cannot go
// below one whole second, so elections take relatively longer at large s.
//
// # What is observed
//
// Every decision of every lease client goes to the oracle as it returns;
// the grants each region's buckets apply are read from Redis (HMGET of the
// bucket hash's gr, gb, ge, gs) every epoch/8 and reported when they
// change. A grant is therefore seen up to that late, which never hides an
// oversubscription: capacity only moves to a recipient a report after the
// donor installed its smaller grant.
//
// # Faults
//
// Instance crashes (the client's connection is cut, nothing released),
// graceful stops (Client.Close), global leader loss (the leading daemon is
// stopped; it resigns, so the standby takes over at once, faster than a
// crash would allow), partitions, latency and loss between a region and
// the global tier (injected in the region leader's GlobalTier), and Redis
// restarts (the process is killed and restarted empty on the same port).
// Region leader loss and etcd outages need more replicas or a proxy in
// front of etcd; live mode skips them and says so in the fault list.
//
// Not safe for concurrent use: Run owns everything it starts and stops it
// before returning.
package live
