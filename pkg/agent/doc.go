// Package agent is the local Sluice agent (cmd/agent): a process beside
// an application (a sidecar) or on each node (a DaemonSet) that embeds
// the lease client and answers, on localhost and from the tokens it holds
// in memory,
//
//   - Envoy's rate limit service (envoy.service.ratelimit.v3
//     RateLimitService/ShouldRateLimit) on its gRPC listener, with the
//     same descriptor mapping, answer and headers as the regional
//     service's own endpoint (pkg/envoyrls), and the same request bounds
//     (envoyrls.GuardRule through pkg/rpcguard, with the regional
//     service's message and stream bounds): a request beyond them is
//     refused before any lease work, and
//   - a small HTTP/JSON API, POST /v1/allow, for services in any language.
//
// # Invariant
//
// Every decision comes from a lease.Client of the region's LeaseService:
// the agent is one more instance of its region. While a key's lease holds
// tokens, a decision is made in memory, with no RPC to the region (a
// class in mode: strict is the exception: each of its decisions is one
// Check on the region, by design). What the agent admits on a key is
// charged to the same regional bucket as every other instance, so the
// agent's traffic and everyone else's on that key together stay within
// b + r·t (DESIGN invariant 1). A request with any invalid part is refused
// before the lease client is called and changes nothing (DESIGN invariant
// 6). Stop stops answering first, then releases the unspent tokens to the
// region.
//
// # POST /v1/allow
//
// Request body (one JSON object; field names are exact, case included,
// and each is given at most once; unknown fields are refused):
//
//	{"tenant": "acme", "class": "read", "cost": 1}
//
// tenant and class are required; cost is optional, default 1, a whole
// number of tokens from 1 to the key's burst: any JSON number whose value
// is a whole number, however written (1, 1.0 and 1e0 alike, as clients
// that write every number as a float send), not a string. The answer to
// a decided request is 200 whatever the verdict; over quota is a result,
// not an error:
//
//	{"allowed": false, "would_deny": true, "limit": 100, "cap": 50,
//	 "remaining": 0, "reset_ms": 1000, "retry_after_ms": 20,
//	 "retry_never": false, "degraded": false}
//
//	allowed         proceed or not (always true for a key in shadow mode)
//	would_deny      the real verdict was a denial (differs from !allowed in
//	                shadow mode only)
//	limit           the key's configured burst: the policy
//	cap             the most this caller can currently expect to spend at
//	                once (the key's cap in this region now), at most limit
//	remaining       tokens this caller can expect to spend now after this
//	                decision, at most cap
//	reset_ms        until remaining is back to cap if nobody spends (0:
//	                unknown); on a denial never before retry_after_ms, as
//	                the RLS's duration_until_reset and the HTTP
//	                middleware's reset (a client is never told the window
//	                ends before it may retry); 0 with retry_never
//	retry_after_ms  on a denial, when to retry (at least 1); 0 when
//	                allowed or retry_never
//	retry_never     a denial no wait cures while the config stays as it
//	                is: a cost above the cap of a region with no global
//	                tier (regional -unleased), which never grows (a cost
//	                above the key's burst is a 400 instead); a cost within
//	                the burst that the region's bucket cannot hold now
//	                (tokens out in other instances' leases, a region cap
//	                below the cost, which grants raise, or a rate of 0 on
//	                the region's floor while its static lease lapsed or it
//	                is drained) is a denial with retry_after_ms
//	degraded        decided by the class's on_failure policy because the
//	                region could not be reached (the policy of the config
//	                the agent holds now, a reload during the outage
//	                included; local runs a key the region never answered
//	                within the static share of Options.Region, -region)
//
// Errors are JSON too, {"error": "...", "field": "..."}: 400 for a bad
// request (the message and field name the part at fault: a body that is
// not one JSON object, an unknown field ("TENANT" among them), a field
// given twice, a field holding an array or an object (however deeply
// nested: the field is named, not the nesting), tenant or class missing
// or malformed, an unconfigured
// class, a cost that is not a whole number in range or exceeds the key's
// burst), 405 for a method other than POST, 408 for a body that did not
// arrive in full within Options.RequestReadTimeout (default 10s; counted
// abandoned), 413 for a body over 64 KiB (a Content-Length over it is
// refused at once, on the headers, without reading the body or waiting for
// it, and the connection is closed after the answer), 503 while no config
// is loaded or the lease client is closed.
//
// A 200 with allowed false was chosen over a 429 so that a caller tells a
// denial (a result, with its retry time) from a failure of the agent (an
// error status) by the status code alone.
package agent
