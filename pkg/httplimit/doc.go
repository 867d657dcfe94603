// Package httplimit is Sluice's net/http middleware: it charges every request
// to a quota key, asks a Limiter for one Decision, and either passes the
// request on or answers 429 Too Many Requests.
//
// # Contract
//
// For each request the middleware
//
//  1. maps the request to a quota.Key with Options.Key and validates it. A
//     failure is the client's problem (no tenant header, a tenant id with
//     forbidden bytes): the answer is 400 and the limiter is not called, so a
//     malformed request never creates or touches a bucket;
//  2. computes the cost with Options.Cost (default 1 token) and validates it
//     against 1..quota.MaxCost; a bad cost is also a 400 without a limiter call;
//  3. calls Limiter.Allow once. An error means no decision exists: it goes to
//     Options.OnError, whose default answers 400 for errors wrapping
//     quota.ErrInvalid (the limiter refused the input, e.g. an unconfigured
//     class) and 503 for anything else. No rate-limit fields are written
//     then, because there are no numbers to report;
//  4. writes the rate-limit fields below on every decision, allowed or not;
//  5. passes the request on when Decision.Allowed is true — including shadow
//     mode, where WouldDeny is also true and the fields show the real,
//     exhausted numbers — and otherwise answers 429 with Retry-After and a
//     short text body, without calling the next handler. A denial with
//     Decision.RetryNever (no wait can cure it while the limits stay as
//     they are, e.g. the cost exceeds what the region's bucket can ever
//     hold) is a 429 with no Retry-After and no t in RateLimit: the
//     middleware never promises a time after which the request still
//     could not be admitted.
//
// Over quota is a response (429), never an error passed to OnError.
//
// # Fields
//
// Legacy fields, kept because most clients in the wild read them:
//
//	X-RateLimit-Limit      Decision.Limit (the key's burst), in tokens
//	X-RateLimit-Remaining  Decision.Remaining clamped to >= 0, in tokens
//	X-RateLimit-Reset      Decision.ResetAt as absolute Unix epoch seconds,
//	                       rounded up
//	Retry-After            only on 429: Decision.RetryAfter in whole
//	                       seconds, rounded up, at least 1; absent when
//	                       Decision.RetryNever
//
// IETF fields, in the structured-field form of
// draft-ietf-httpapi-ratelimit-headers-10 (September 2025; the working
// group's later editor's copy keeps the same syntax):
//
//	RateLimit-Policy: "<policy>";q=<limit>;w=<window seconds>
//	RateLimit:        "<policy>";r=<remaining>;t=<seconds>
//
// The policy name is Options.Policy, or the key's class when that is empty,
// so read and write traffic advertise distinct policies. w is present only
// when Options.Window is set; for a token bucket it is the time an empty
// bucket takes to refill to the limit (see RefillWindow). t is the seconds
// until ResetAt on an allowed request; on a 429 it equals Retry-After,
// because the draft asks that Retry-After never point earlier than t and a
// token bucket has enough tokens for the retried request well before it is
// full again. On a 429 with Decision.RetryNever, t is left out (the draft
// makes it optional), like Retry-After.
//
// # Why Reset is absolute and Retry-After relative
//
// The two answer different questions and have different readers.
// X-RateLimit-Reset says when the bucket will be full again; clients compare
// it with their own clock to plan a batch, so it is an instant, and it is
// rounded up because a client that wakes at the announced second must not
// arrive before the tokens do. Retry-After (RFC 9110 §10.2.3) says how long
// this client must wait before retrying this request; as delay-seconds it
// survives clock skew between client and server, and it is at least 1
// because "0" invites an immediate retry loop against a bucket that refills
// in, say, 100 ms. Mixing them up — an absolute time in Retry-After, or a
// delay in Reset — makes clients retry decades late or at once.
//
// # Edge cases
//
//   - Remaining is clamped at 0: a bucket in debt (tokens reserved ahead by
//     a queued job) has a negative balance that clients cannot act on.
//   - A zero or past ResetAt reports the current second and t=0: the bucket
//     is already full, or the limiter did not say.
//   - A negative Limit is reported as 0.
//   - In shadow mode there is no Retry-After, since the request was served.
//   - A "never" denial (Decision.RetryNever) has no Retry-After and no t;
//     its body says the request cannot be admitted while the limits stay
//     as they are. X-RateLimit-Reset is still written.
//
// Units: costs, limits and remaining counts are whole tokens; every field
// value is whole seconds, rounded up.
//
// Concurrency: the handler returned by Middleware is safe for concurrent use
// when the Limiter and the Options functions are; the middleware itself keeps
// no mutable state.
package httplimit
