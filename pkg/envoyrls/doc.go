// Package envoyrls serves Envoy's rate-limit service
// (envoy.service.ratelimit.v3.RateLimitService) from the regional process,
// so an Envoy fleet is limited by the same quotas as instances that embed
// the lease client.
//
// # Invariant
//
// Every decision comes from tokens the regional process leases from its own
// region, through a Limiter (a *lease.Client dialled over loopback gRPC to
// the daemon's own LeaseService, see DialLoopback). Envoy's per-request
// call therefore costs no Redis round trip while the lease holds tokens
// (except for classes in mode: strict, each of whose decisions is one
// Check on the region, by design), and everything Envoy admits is charged
// to the same regional bucket as every other instance: Envoy traffic and
// embedded-client traffic on one quota key together stay within b + r·t
// (DESIGN invariant 1).
//
// A request is validated completely before the Limiter is called: a request
// with any invalid part is refused with codes.InvalidArgument and charges
// nothing, not even for its valid descriptors (DESIGN invariant 6). Only a
// malformed request is invalid (see Errors): every value an entry can
// carry, and every cost, is answered, because Envoy lets a refused request
// through (failure_mode_deny: false) uncharged on all its descriptors.
//
// # Mapping descriptors to quota keys
//
// The config's envoy.descriptors list maps descriptors to (tenant, class).
// A request's domain selects the mappings whose domain equals it; for each
// descriptor the mappings are tried in config order and the first that
// matches wins. A descriptor matches a mapping when it has an entry whose
// key is the mapping's tenant_key (its value is the tenant, see Tenants)
// and either an entry whose key is class_key whose value names a class of
// the config (the class) or the mapping has a fixed class. Other entries
// are ignored.
//
// Example Sluice config:
//
//	envoy:
//	  descriptors:
//	    - {domain: sluice, tenant_key: tenant, class_key: class}
//	    - {domain: sluice-export, tenant_key: tenant, class: export}
//
// and the Envoy HTTP filter and route actions that produce matching
// descriptors (the tenant from a request header, the class fixed per route):
//
//	http_filters:
//	- name: envoy.filters.http.ratelimit
//	  typed_config:
//	    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
//	    domain: sluice
//	    failure_mode_deny: false
//	    rate_limit_service:
//	      transport_api_version: V3
//	      grpc_service: {envoy_grpc: {cluster_name: sluice_regional}}
//	...
//	routes:
//	- match: {prefix: /api/reports/}
//	  route:
//	    cluster: app
//	    rate_limits:
//	    - actions:
//	      - request_headers: {header_name: x-tenant-id, descriptor_key: tenant}
//	      - generic_key: {descriptor_key: class, descriptor_value: read}
//
// The first action gives the entry (tenant, <header value>), the second
// (class, read). Envoy sends no descriptor at all when the header is
// missing, so such requests are not limited by this rule.
//
// A descriptor no envoy.descriptors mapping matches goes to its domain's
// tree under envoy.domains, the shape of an envoyproxy/ratelimit config
// (sluicectl import envoy-ratelimit writes it from one):
//
//	envoy:
//	  domains:
//	    - domain: messaging
//	      descriptors:
//	        - key: message_type
//	          value: marketing
//	          descriptors:
//	            - {key: to_number, class: marketing}   # any number, one bucket each
//	        - {key: to_number, class: per_number}
//	        - {key: to_number, value: "911", unlimited: true}
//
// A descriptor of n entries walks n levels, one entry each: the node with
// the entry's key and exactly its value, else the first node whose value
// is a wildcard pattern the value matches (each * any run of bytes,
// anywhere: "/api/*", "/api/*/action", as in envoyproxy/ratelimit),
// else the node with the key and no
// value; no other branch is tried. The node the last entry reaches
// decides: its class is charged as the key (tenant, class), where the
// tenant is made of the values of the entries matched by nodes without an
// exact value (see Tenants; a pattern with share_threshold counts as
// exact), so each distinct value has its own bucket, as in
// envoyproxy/ratelimit. Resolve does this mapping as a pure function, for
// other front ends.
//
// A descriptor that matches no mapping and no tree node with a class, or
// any descriptor of a domain nothing names, is answered OK with no
// current_limit and counted in sluice_envoy_unmatched_descriptors_total:
// Envoy may send descriptors meant for other limits, and refusing them
// would fail the whole request. A descriptor a node with unlimited: true
// decides is answered OK with limit_remaining 2^32-1 and no current_limit,
// charges nothing and is counted in
// sluice_envoy_unlimited_descriptors_total.
//
// # Tenants
//
// Envoy sends any value a header, a path or an address holds: "/v1/orders",
// "a+b@x.com", "Zoë", "2001:db8::1", "", 200 bytes. A tenant holds only
// letters, digits and . _ : @ -, at most 128 bytes. Every value, and every
// tuple of values a tree path collects, still gets a valid tenant of its
// own (TreeTenant, MappingTenant); no two distinct ones share a bucket:
//
//   - a tree path that names every value: "_" (config.EnvoyTenantShared),
//     one bucket for all;
//   - values made of letters, digits and . _ @ - only (no ':'), the first
//     not empty, at most 128 bytes joined, and not the single value "_":
//     the values joined by ":" ("10.0.0.8", "billing:u-1234"), the plain
//     form;
//   - any other tuple: its digest, ':' and 32 hex digits of SHA-256 over
//     the values, each prefixed by its length as a uvarint ("/v1/orders"
//     is ":f617defe5354411b6a43152194a48108"). A plain form never starts
//     with ':', so no value can take another's digest; two digests
//     collide with probability about 2^-128;
//   - an envoy.descriptors mapping's tenant value: the value itself when
//     it is a valid tenant (':' allowed, there is one value) and not of a
//     digest's form, else its digest (the one the tree gives it).
//
// The tier of a tenant listed under tenants applies to the tenant as
// computed: a listed tenant is matched by values whose plain form it is;
// a value given its digest gets the default tier unless the digest itself
// is listed.
//
// Upgrading from a version that joined every value with ":" changes the
// tenant, so the bucket (a fresh one, full, once), of tree values that
// contain ':' (IPv6 addresses, "org:team"; they ran two tuples together:
// ("p:q", "r") and ("p", "q:r") were one bucket), of a first value that is
// empty (":x" was both ("", "x") and (":x")), and of the single value "_"
// (it was the shared bucket of the path naming every value); and of a
// mapping's tenant value of a digest's form. A listed tenant reached
// through such a value no longer gets its tier. Every other value that was
// decided keeps its bucket; the values that were refused (InvalidArgument,
// so passed unlimited by Envoy) are decided now.
//
// # Cost
//
// A descriptor costs the request's hits_addend tokens, 0 (unset) meaning 1;
// a descriptor's own hits_addend, when set, overrides it. A descriptor's
// own hits_addend of 0 needs no token: it is answered OK as an unmatched
// descriptor (Sluice has no query that charges nothing, so no bucket is
// asked or shown). A cost above the key's burst or above
// quota.MaxCost can never be admitted: the descriptor is OVER_LIMIT
// without asking the limiter, charges nothing, and is answered in the
// never form (limit_remaining 0, no duration_until_reset, no
// x-ratelimit-reset or retry-after), as envoyproxy/ratelimit answers a
// hit count above the limit OVER_LIMIT (Target.Never). Its
// x-ratelimit-limit starts with the key's cap in this region as the
// limiter last learned it from the region (lease.Client.Cap), as every
// other answer on the key does; for a key the limiter does not hold
// (never answered, or forgotten as idle) the live config's static share of
// it in this region (lease.Options.StaticShare, LiveStaticShare), and the
// configured burst only for a limiter given none. Each matched
// descriptor is charged separately, even when two name the same key. When
// one descriptor is over limit, tokens already taken for the others stay
// spent (Envoy's own service behaves the same); this only ever
// under-admits.
//
// # Answers
//
// overall_code is OVER_LIMIT when any descriptor is over limit, else OK.
// Statuses has one entry per descriptor, in request order:
//
//   - code: OK or OVER_LIMIT. A decision with Allowed and WouldDeny (shadow
//     mode) is OK and counted as result "shadow_denied". When the config
//     puts the class or tenant in shadow mode, or the envoy.domains node
//     that decided the descriptor says shadow_mode, a denial from any
//     source (also a degraded, on_failure: closed one) is answered OK
//     likewise; tokens it was allowed are charged as usual.
//   - current_limit: the key's configured rate, expressed exactly per
//     SECOND, MINUTE, HOUR or DAY. When one unit's refill is exactly the
//     burst, that unit with the burst as its count: an envoy ratelimit
//     limit of 60 per minute, imported as rate 1/s with burst 60, is 60 per
//     MINUTE, as its config said and as Envoy's x-ratelimit headers then
//     tell clients (it was 1 per SECOND). Otherwise the shortest unit in
//     which the rate is a whole number of tokens (10/s burst 20 → 10 per
//     SECOND, 6/m → 6 per MINUTE, 0.5/s → 30 per MINUTE); a rate that is
//     whole in none is rounded in the longest unit whose count fits in 32
//     bits. The rate, not the burst, because it is the number operators
//     write and the long-run admission rate Envoy dashboards should show.
//     name is the class, on every limit: envoyproxy/ratelimit's is the
//     rate_limit's name as configured, empty when it has none. Envoy's
//     own x-ratelimit-limit (enable_x_ratelimit_headers) appends
//     name="<class>" from it, where envoyproxy/ratelimit's unnamed limits
//     gave no name (an imported class is "<domain>.<name>", or the
//     domain and the descriptor's path).
//   - limit_remaining: what this caller can expect to spend now after the
//     decision (Decision.Remaining): the tokens this process holds for the
//     key plus what the region's bucket held at its last answer, at most
//     the region's cap for the key and below the cost when over limit.
//   - duration_until_reset: time until limit_remaining is back to the cap
//     if nobody spends (Decision.ResetIn: the later of the region's bucket
//     full again, as last reported, and the tokens missing from the cap
//     refilled at the region's rate), and never before the retry delay of
//     an over-limit descriptor. Unset on an over-limit descriptor that no
//     wait can cure (Decision.RetryNever: the cost exceeds the key's
//     configured burst, or the cap of a region with no global tier,
//     which never grows), so Envoy is promised no time after which it
//     would still be refused. A cost within the burst but above the
//     current cap of a region with a global tier is over limit with a
//     time: the region's cap grows when the global tier grants it more,
//     and a region on its floor at a rate of 0 (its static lease lapsed,
//     or drained) gets its rate back.
//
// # Response headers
//
// With Options.Headers (default true) the response asks Envoy to add the
// x-ratelimit fields in the draft-03 form Envoy's own x-ratelimit headers
// use, and the IETF draft's RateLimit and RateLimit-Policy structured
// fields, with the meanings pkg/httplimit gives them (docs/operations.md,
// "Rate-limit headers"): the policy is the key's configured limit, the
// rest is what this caller can currently expect in its region.
//
//	x-ratelimit-limit      "<cap>, <burst>;w=<window>": the key's burst cap
//	                       in this region now (Decision.Cap, at most the
//	                       burst; the burst while not known), then the
//	                       policy: the configured burst
//	                       and the seconds an empty bucket takes to refill
//	                       it (burst / rate, rounded up)
//	x-ratelimit-remaining  limit_remaining: what this caller can expect to
//	                       spend now, at most the cap
//	ratelimit-policy       "<class>";q=<burst>;w=<window>
//	ratelimit              "<class>";r=<remaining>;t=<t>
//	x-ratelimit-reset      t, in seconds (relative, as Envoy's service
//	                       writes it; pkg/httplimit's is absolute)
//	retry-after            only on OVER_LIMIT: t
//
// t is one number of whole seconds, rounded up: on OVER_LIMIT the longest
// retry delay of the over-limit descriptors, at least 1 (the IETF draft
// asks that Retry-After not point earlier than t); otherwise the shown
// descriptor's duration_until_reset. When any over-limit descriptor is a
// RetryNever denial (no wait would admit the request) no time is promised:
// there is no t, x-ratelimit-reset or retry-after.
//
// They describe one descriptor, the one closest to exhaustion: an
// over-limit one if any, else the one with the fewest tokens remaining
// (the first on ties). A descriptor in shadow mode limits nobody, so it
// is described only when every matched descriptor is in shadow mode. Envoy adds response_headers_to_add to the response
// whether it is rate limited or not. When Envoy's filter is configured with
// enable_x_ratelimit_headers: DRAFT_VERSION_03 it writes the x-ratelimit
// fields itself; set Options.Headers to false then, to avoid duplicates.
//
// # Errors
//
// A request Sluice cannot decide is answered with a gRPC error, never with
// a made-up verdict: Envoy then applies its failure_mode_deny setting
// (false, the default: the request passes; true: it is refused).
//
//   - codes.InvalidArgument, for a malformed request, one Envoy does not
//     send or sends only when its route config asks for what Sluice cannot
//     do: empty domain; no descriptors; a descriptor with no entries; for
//     a matched descriptor, a tenant or class entry of an envoy.descriptors
//     mapping given twice with different values, is_negative_hits (Sluice
//     does not refund), or a per-descriptor limit override (limits come
//     from the Sluice config). The message names the descriptor index and
//     the offending field. No entry value and no cost is refused: a
//     tenant value gets a tenant (see Tenants), a class_key value naming
//     no class matches no mapping, a cost above the burst is OVER_LIMIT
//     and a cost of 0 is OK (see Cost).
//   - codes.Unavailable: no Limiter attached yet, no config, or the Limiter
//     failed (closed during shutdown).
//   - codes.Canceled / DeadlineExceeded: Envoy gave up on the call.
//
// Over limit is an answer (OVER_LIMIT), never an error.
//
// # Metrics
//
// Metrics never carry a tenant (cardinality); labels are class, tier and
// result only:
//
//	sluice_envoy_decisions_total{class,tier,result}       result: ok, over_limit, shadow_denied
//	sluice_envoy_degraded_decisions_total{class,tier}     decisions from the class's on_failure policy
//	sluice_envoy_unmatched_descriptors_total              descriptors no mapping or tree matched
//	sluice_envoy_unlimited_descriptors_total              descriptors an unlimited node decided
//	sluice_envoy_request_duration_seconds{result}         per ShouldRateLimit call; result: ok,
//	                                                      over_limit, invalid_argument, error
//
// # Serving
//
// Register serves a Service on any gRPC server. RegisterEncoded, on a
// server built with ServerOptions (cmd/agent's, and cmd/regional's, whose
// daemon serves the Service given as DaemonOptions.Envoy so), answers the
// same bytes but writes them itself from the decisions, with the parts
// every answer about one limit shares (current_limit, x-ratelimit-limit,
// ratelimit-policy, and the reset and retry-after headers of the first
// two minutes) encoded once, into a buffer gRPC gives back once it has
// sent it, instead of a message for gRPC to walk and encode. It reads the
// requests of the shape Envoy sends (a domain, descriptors of entries,
// hits_addend) itself too, into the message proto.Unmarshal would make of
// them, held in a block reused from call to call, with one allocation for
// the request's strings instead of a dozen allocations; any other request
// is read by proto.Unmarshal, and one it refuses only because a string
// (the domain, an entry's key or value) is not UTF-8 is read with that
// string's bytes: a header value is whatever bytes the client sent, Envoy
// passes them on, and such a value is a tenant of its own (a digest)
// like any other, where an error before the handler (Internal) let the
// request through Envoy unlimited. Only RegisterEncoded reads so;
// Register's server decodes with gRPC's codec. The server's unary interceptors
// (cmd/regional's authorization and bounds) still see every request as a
// message and may refuse it, but must not keep it past the call (its
// strings they may); the answer passes them in wire form.
//
// # Units
//
// Costs, limits and remaining counts are whole tokens; rates tokens per
// second; durations time.Duration (protobuf Duration on the wire); header
// values whole seconds.
package envoyrls
