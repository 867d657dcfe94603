package envoyrls

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
)

// DigestLen is the length of a digest tenant: ':' and 32 lowercase hex
// digits.
const DigestLen = 1 + 32

// TreeTenant is the tenant of a descriptor an envoy.domains tree decides,
// from the values of its entries matched by nodes without an exact value,
// in order. Every tuple of values has a valid tenant of its own (distinct
// tuples give distinct tenants; two digests collide with probability
// about 2^-128):
//
//   - no values: "_" (config.EnvoyTenantShared), the shared bucket of a
//     path that names every value;
//   - values made only of the bytes a tenant allows except ':' (letters,
//     digits and . _ @ -), the first not empty, joining to at most
//     quota.MaxTenantLen bytes, and not the single value "_": the values
//     joined by ":" (the plain form; a join never starts with ':', and
//     splitting it at ':' gives the values back);
//   - any other tuple: its digest (Digest), ':' and 32 hex digits.
//
// Tenants listed under the config's tenants match the plain form only:
// a tuple given its digest gets the default tier.
func TreeTenant(values ...string) string {
	if len(values) == 0 {
		return config.EnvoyTenantShared
	}
	if plainTuple(values) {
		if len(values) == 1 {
			return values[0]
		}
		return strings.Join(values, ":")
	}
	return Digest(values...)
}

// plainTuple says whether values are joined as they are (see TreeTenant).
func plainTuple(values []string) bool {
	if values[0] == "" || (len(values) == 1 && values[0] == config.EnvoyTenantShared) {
		return false
	}
	n := len(values) - 1 // the separators
	for _, v := range values {
		n += len(v)
		if n > quota.MaxTenantLen {
			return false
		}
		for i := 0; i < len(v); i++ {
			if !plainByte(v[i]) {
				return false
			}
		}
	}
	return true
}

// plainByte is a byte a tenant allows, except ':'.
func plainByte(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	case c == '.', c == '_', c == '@', c == '-':
		return true
	}
	return false
}

// MappingTenant is the tenant of a descriptor an envoy.descriptors mapping
// decides, from its tenant_key entry's value: the value itself when it is
// a valid tenant (quota.Key's rules) and not of a digest's form (':'
// followed by 32 lowercase hex digits), otherwise Digest(value), the
// digest TreeTenant gives the same single value. Distinct values give
// distinct tenants.
func MappingTenant(value string) string {
	if quota.ValidateID("tenant", value) == nil && !IsDigest(value) {
		return value
	}
	return Digest(value)
}

// Digest is ':' followed by the first 16 bytes, in lowercase hex, of
// SHA-256 over the values, each preceded by its length as a uvarint (so
// that no two tuples are hashed from the same bytes).
func Digest(values ...string) string {
	var scratch [256]byte
	b := scratch[:0]
	for _, v := range values {
		b = binary.AppendUvarint(b, uint64(len(v)))
		b = append(b, v...)
	}
	sum := sha256.Sum256(b)
	var out [DigestLen]byte
	out[0] = ':'
	hex.Encode(out[1:], sum[:(DigestLen-1)/2])
	return string(out[:])
}

// IsDigest says whether tenant has a digest's form: ':' followed by 32
// lowercase hex digits.
func IsDigest(tenant string) bool {
	if len(tenant) != DigestLen || tenant[0] != ':' {
		return false
	}
	for i := 1; i < len(tenant); i++ {
		if c := tenant[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
