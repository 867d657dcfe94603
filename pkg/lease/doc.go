// Package lease is the instance side of Sluice's lease protocol: the
// library application processes embed to decide Allow(key, cost) from
// tokens leased from their region, without a round trip per request.
//
// It has three layers. Table is the pure state machine of the keys: it
// never reads the clock and never does I/O, every time-dependent method
// takes now, and it builds and consumes protobuf messages without sending
// them. Core holds every other decision, as clock-free steps over a Table
// and a Breaker: a request's rounds past the hot path (acquire, wait for a
// refill in flight, strict check, give up, on_failure fallback), the owner
// loop's periodic Sync round, refills and next wake-up, and what each RPC
// outcome does to the table and the breaker. Client is only a pump of Core
// over gRPC and the real clock (plus metrics, logs and instance identity);
// the simulator (sim/world) pumps the same Core on virtual time.
//
// # State of one key
//
// A key (tenant, class) is created on first use and holds:
//
//   - pool: tokens held (an atomic word shared with the hot path);
//   - lease: hasLease and deadline = send time of the request whose grant
//     last extended it + the grant's ttl (DESIGN invariant 4: measured on
//     this instance's clock from the moment it sent the request);
//   - pending: the last report sent and not yet acknowledged;
//   - counters: tokens admitted (derived: credited − drained − pool),
//     denied, asked of the fallback and strict paths;
//   - what the region said: mode, on_failure, shadow, tier, limit, region
//     rate and burst, live instances, reset time; negUntil (retry_after);
//   - sizing: demand EWMA, target batch, low-water mark (see sizing.go).
//
// Transitions (the Table methods):
//
//	Allow      pool ≥ cost and lease valid → spend (CAS), allowed;
//	           crossing the low-water mark → ActRefill.
//	           Otherwise: negUntil in the future → denied with RetryAfter
//	           when the region named a wait for a need (tokens beyond the
//	           pool) no smaller than this request's, less the time the
//	           region's rate refills the difference (once that has passed,
//	           the key asks the region: ActAcquire); when it answered
//	           "never" (-1) for a need no larger than this request's, with
//	           RetryAfter until negUntil (the key asks again then) for a
//	           cost within the key's configured burst (other leases come
//	           back, grants raise the region's cap, and a region on its
//	           floor gets its rate back), unless the region is unleased
//	           and the cost above its cap, else with RetryNever;
//	           strict → ActCheck; else ActAcquire (a need
//	           the last negative answer was not about asks the region).
//	PrepareAcquire / PrepareSync / PrepareRefill / PrepareFalls
//	           build a report and mark the key in flight (one report per
//	           key at a time): the pending report if there is one, verbatim;
//	           else a new one with the next seq, used/denied since the last
//	           report, returned = tokens taken out of the pool (already
//	           removed before the report exists), want/min from sizing.
//	Apply      acknowledges: pending cleared, granted tokens credited,
//	           deadline = max(deadline, SentAt + ttl), region facts learned,
//	           negUntil set when nothing was granted; giveBack set when the
//	           region counts more live instances than before and the pool
//	           is above their batch cap (the owner, told by
//	           Core.GiveBackDue, runs PrepareRefill, whose report returns
//	           the excess at once).
//	Failed     no answer: the report stays pending and is resent unchanged.
//	Reject     the region refused the report as invalid: key forgotten.
//	Expire     at deadline − guard, sets checkClock; at the deadline,
//	           empties the pool (those tokens are returned in the next
//	           report) and ends the lease.
//	Fallback   region unreachable: the class's on_failure policy decides
//	           (local token bucket at region rate ÷ live instances, or
//	           FallbackLimit for a key the region never answered, at most
//	           the live config's static share of the key in this region
//	           when TableOptions.StaticShare names it; open or closed);
//	           the key is degraded until the region answers it,
//	           and the table (Degraded) until the region answers any call:
//	           a degraded key forgotten as idle does not end it.
//	           The policy (and shadow) is the live config's when
//	           TableOptions.Policies names the class, read at each
//	           decision, so a change applies at once, also to keys
//	           already degraded; else the region's last answer for the
//	           key; else TableOptions.Classes; else local.
//	           The local bucket is first charged with the tokens the key
//	           admitted through the region (lease and strict paths) since
//	           it last was, down to empty and never below.
//	PrepareSync also forgets keys idle for IdleTimeout (their final
//	           reports go out with Release); PrepareRelease forgets all.
//
// # Invariants
//
//   - No token is spent at or after its lease's deadline (DESIGN invariant
//     4). Table.Allow compares now with the deadline on every call. The
//     Client's lock-free hot path compares one monotonic clock reading
//     with the deadline too, and serves a key only while checkClock is
//     unset; the owner loop sets checkClock half a TTL before the deadline
//     (Expire returns when to run next), after which every decision on the
//     key goes through Table.Allow. Before each blocking background RPC
//     the owner sets checkClock for every key whose guard time falls
//     within the RPC's timeout (ExpireFor), so a region that stops
//     answering cannot keep the owner away from a deadline. The hot path's
//     own reading is what holds when the owner is late: a process resumed
//     after a pause longer than the TTL (SIGSTOP, a frozen VM) serves
//     requests before the owner's overdue wake-up, and spent the expired
//     pool, which the region may have reclaimed and handed to a peer.
//   - A report is resent unchanged (same seq, same numbers) until it is
//     acknowledged, and newer usage waits for the next seq (DESIGN
//     invariant 5); seqs come from one counter per Table, so they rise per
//     key even across forgetting a key. Numbers that can never be
//     delivered (a refused report, a final report after a lost reply) are
//     dropped, which only under-counts.
//   - Tokens returned are taken out of the pool before the report carrying
//     them is built, so they are never both spent and returned.
//   - A grant received for a lease whose deadline already passed, or after
//     Drain, is not credited: it is returned in the next report.
//   - The local on_failure bucket counts what the region admitted: an
//     instance's lease and strict admissions of a key and its degraded
//     ones, together, stay within the local bound (region burst ÷ live +
//     region rate ÷ live · t) over any window, across switches between
//     the region and degraded mode, as long as the region gave the
//     instance no more than that share. The hot path never touches the
//     bucket: Fallback books the spent total's growth late, which leaves
//     the bucket no fuller than booking each token when spent. What the
//     region gave beyond the share empties the bucket without a debt, so
//     degraded mode then admits at the local rate.
//   - Over quota is a Decision, never an error; errors mean invalid input
//     (wrapping quota.ErrInvalid) or ErrClosed, and change nothing.
//
// # Units
//
// Tokens are whole int64 tokens; rates tokens per second; durations
// time.Duration (milliseconds on the wire). A key's pool holds at most
// 2^31−1 tokens; anything granted above that is returned.
//
// # Hot path
//
// Client.Allow on a key with tokens is a lock-free map read (the key's
// 64-bit hash in the published index, then the key its entry holds
// compared), one atomic load of the key's published info and one
// compare-and-swap that both
// spends the tokens and counts the admission, after one monotonic clock
// reading compared with the lease's deadline (time.Since; about 30 ns, the
// price of invariant 4 when the owner loop is late); no lock, no
// allocation, no Prometheus call (metrics are folded from the per-key
// atomics at scrape time, and one decision in 1024 is timed).
//
// # Dialing the region
//
// NewClient takes the caller's grpc.ClientConn. Dial it with
// grpc.WithConnectParams(ConnectParams()): gRPC's default reconnect
// backoff grows to 120 s, so after a regional outage of a minute the
// connection may try again only tens of seconds after the region is back,
// and the client decides with on_failure (degraded) all that while.
// ConnectParams caps the wait at MaxReconnectDelay, the scale of the
// breaker's cooldown, and gives up an attempt left unanswered (made while
// the path was cut) after ConnectTimeout rather than gRPC's 20 s. And with grpc.WithDefaultServiceConfig(ServiceConfig):
// round_robin over every replica the target resolves to, and an Acquire,
// Sync or Release cut by its replica's stop sent once more to another,
// rather than decided with on_failure.
package lease
