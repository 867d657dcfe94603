package luascripts

import "github.com/sluicehq/sluice/pkg/quota"

// DefaultPrefix starts every Redis key Sluice writes.
const DefaultPrefix = "sl:"

// Keys are the three Redis keys of one quota key. They share the hash tag
// {tenant|class}; the tenant and class of a validated quota.Key never
// contain '{', '}' or '|', so the tag is unambiguous.
type Keys struct {
	Bucket, Leases, Expiry string
}

// KeysFor names the Redis keys of k under prefix. k must be valid.
func KeysFor(prefix string, k quota.Key) Keys {
	tag := prefix + "{" + k.Tenant + "|" + k.Class + "}:"
	return Keys{Bucket: tag + "b", Leases: tag + "l", Expiry: tag + "x"}
}

func (k Keys) list() []string { return []string{k.Bucket, k.Leases, k.Expiry} }
