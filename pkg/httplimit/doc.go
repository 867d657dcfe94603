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
//     they are: the cost exceeds the key's configured burst, or the cap of
//     a region with no global tier, which never grows) is a 429 with no
//     Retry-After, no X-RateLimit-Reset and no t in
//     RateLimit: the middleware never promises a time after which the
//     request still could not be admitted.
//
// Over quota is a response (429), never an error passed to OnError.
//
// # Fields
//
// In a leased, multi-region system the configured limit (the policy) and
// what one caller can get right now differ: each region runs on its share
// of the key's bucket, and the instance decides from tokens it leased. The
// fields say which is which (docs/operations.md, "Rate-limit headers"):
//
//	RateLimit-Policy       "<policy>";q=<Decision.Limit>[;w=<window>]: the
//	                       key's configured burst (the same everywhere and
//	                       on every response) and its refill window
//	X-RateLimit-Limit      Decision.Cap: the most this caller can currently
//	                       expect at once, the key's burst cap in its region
//	                       now (Decision.Limit unless Decision.CapKnown);
//	                       at most q
//	X-RateLimit-Remaining  Decision.Remaining: what this caller can expect
//	                       to spend now without waiting, clamped to
//	                       [0, X-RateLimit-Limit]
//	RateLimit              "<policy>";r=<X-RateLimit-Remaining>;t=<seconds>
//	X-RateLimit-Reset      Date + t, as absolute Unix epoch seconds
//	Retry-After            only on 429: t, at least 1
//	Date                   the middleware's clock (Options.Now), so the
//	                       three time fields can be checked against it
//
// t names one instant for all of them, a whole second of the Date clock at
// or after the moment it stands for: on an admitted request when
// Remaining will be back to X-RateLimit-Limit if nobody spends
// (Decision.ResetIn: the later of the region's bucket full again and the
// tokens missing from the limit refilled; 0 when it already is), on a 429
// when the request can
// be retried (Decision.RetryAfter). So X-RateLimit-Reset - Date = t, and
// on a 429 Retry-After = t: the IETF draft asks that Retry-After not point
// earlier than the end of the window t describes. A client that waits t
// seconds from receiving the response, or until X-RateLimit-Reset by a
// synchronised clock, never arrives before the tokens; rounding to Date's
// second costs it less than a second more than the exact wait.
//
// The IETF fields are in the structured-field form of
// draft-ietf-httpapi-ratelimit-headers-10 (September 2025; the working
// group's later editor's copy keeps the same syntax). The policy name is
// Options.Policy, or the key's class when that is empty, so read and write
// traffic advertise distinct policies. w is present only when
// Options.Window is set; for a token bucket it is the time an empty bucket
// takes to refill to q (see RefillWindow).
//
// # Why Reset is absolute and Retry-After relative
//
// X-RateLimit-Reset is read by clients that plan a batch with their own
// clock, so it is an instant; Retry-After (RFC 9110 §10.2.3) is a delay,
// which survives clock skew between client and server, and it is at least
// 1 because "0" invites an immediate retry loop. Both name the same
// second here.
//
// # Edge cases
//
//   - Remaining is clamped to [0, X-RateLimit-Limit]: a bucket in debt has
//     a negative balance that clients cannot act on.
//   - A zero ResetIn on an admitted request gives t=0 and
//     X-RateLimit-Reset = Date: nothing to wait for, or the limiter did not
//     say.
//   - A negative Limit is reported as 0.
//   - In shadow mode there is no Retry-After, since the request was served.
//   - A "never" denial (Decision.RetryNever) has no Retry-After, no t and
//     no X-RateLimit-Reset; its body says the request cannot be admitted
//     while the limits stay as they are.
//
// Units: costs, limits and remaining counts are whole tokens; every field
// value is whole seconds, rounded up.
//
// Concurrency: the handler returned by Middleware is safe for concurrent use
// when the Limiter and the Options functions are; the middleware itself keeps
// no mutable state.
package httplimit
