// Package quota is Sluice's shared vocabulary: the quota key (tenant, class),
// the limits attached to it, and the Decision every limiter returns.
//
// Invariant: a Key that passed Validate can be embedded in a Redis key inside
// a hash tag ({...}) and in a log line without escaping: its parts contain
// only [A-Za-z0-9._:@-], are 1..MaxTenantLen / MaxClassLen bytes long, and
// never contain '{', '}', '|', whitespace or control characters.
//
// Units: costs and tokens are whole tokens (int64); rates are tokens per
// second (float64); durations are time.Duration.
//
// Over quota is a result (Decision.Allowed == false), never an error. Errors
// from this package always mean bad input and wrap ErrInvalid.
package quota
