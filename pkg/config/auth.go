package config

import (
	"slices"
	"strconv"
	"strings"
)

// Roles a client certificate identity can hold (see Auth).
const (
	// RoleInstance may call the regional LeaseService (lease clients).
	RoleInstance = "instance"
	// RoleOperator may read the global tier's Status and the daemons'
	// reflection service (sluicectl).
	RoleOperator = "operator"
	// RoleEnvoy may call the regional Envoy rate limit service.
	RoleEnvoy = "envoy"
	// RoleRegionPrefix followed by a region's name may send that region's
	// reports to the global tier (AllocatorService.Sync), and only that
	// region's.
	RoleRegionPrefix = "region:"
)

// MaxIdentityLen bounds an identity pattern under auth.identities.
const MaxIdentityLen = 1024

// Auth says what each client may do when the daemons serve mutual TLS.
type Auth struct {
	// Identities give client certificate identities their roles. A
	// caller's roles are those of every entry that matches one of its
	// certificate's SAN URIs or DNS names. Only read with mutual TLS on
	// (-tls-client-ca): then a call its roles do not allow is refused with
	// PermissionDenied, and a deployment that lists no identities refuses
	// every call but health checks.
	//
	//   - Default: none
	//   - Rule: no two with the same match
	Identities []Identity `yaml:"identities,omitempty"`
}

// Identity gives the certificates whose SAN matches Match its roles.
type Identity struct {
	// Match is a SAN URI or DNS name of client certificates; one ending in
	// * matches every SAN that starts with the rest.
	//
	//   - Required
	//   - Rule: 1-1024 bytes without spaces or control characters; * only
	//     at the end, and not alone
	//   - Example: spiffe://sluice.example/region/us-east
	Match string `yaml:"match"`
	// Roles lists the roles, separated by commas: instance (the regional
	// LeaseService), envoy (the Envoy rate limit service), operator (the
	// global tier's Status, reflection) and region:NAME (region NAME's
	// reports to the global tier, no other region's).
	//
	//   - Required
	//   - Rule: at least one; each instance, envoy, operator or region:NAME
	//     naming a region under regions
	//   - Example: instance, region:us-east
	Roles string `yaml:"roles"`
}

// RolesOf returns the roles of a caller presenting sans (its certificate's
// SAN URIs and DNS names), each once, sorted.
func (a Auth) RolesOf(sans []string) []string {
	var roles []string
	for _, san := range sans {
		for _, id := range a.Identities {
			if MatchIdentity(id.Match, san) {
				roles = append(roles, SplitRoles(id.Roles)...)
			}
		}
	}
	slices.Sort(roles)
	return slices.Compact(roles)
}

// SplitRoles splits a comma-separated role list, trimming spaces and
// dropping empty items.
func SplitRoles(list string) []string {
	var out []string
	for r := range strings.SplitSeq(list, ",") {
		if r = strings.TrimSpace(r); r != "" {
			out = append(out, r)
		}
	}
	return out
}

// MatchIdentity reports whether san matches pattern: equal, or starting
// with pattern's text before a final *.
func MatchIdentity(pattern, san string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
		return prefix != "" && strings.HasPrefix(san, prefix)
	}
	return pattern == san
}

func (c *Config) validateAuth(p *problems) {
	seen := make(map[string]int, len(c.Auth.Identities))
	for i, id := range c.Auth.Identities {
		path := "auth.identities[" + strconv.Itoa(i) + "]"
		m := id.Match
		switch {
		case m == "":
			p.add(path+".match", "is required")
		case m == "*":
			p.add(path+".match", "a lone * would give every certificate of the CA these roles")
		case len(m) > MaxIdentityLen:
			p.add(path+".match", "is %d bytes, more than %d", len(m), MaxIdentityLen)
		case strings.Contains(strings.TrimSuffix(m, "*"), "*"):
			p.add(path+".match", "%q: * may only end a pattern", m)
		default:
			for j, r := range m {
				if r <= ' ' || r == 0x7f {
					p.add(path+".match", "%q has a space or control character at offset %d", m, j)
					break
				}
			}
		}
		if first, dup := seen[m]; dup && m != "" {
			p.add(path+".match", "%q is also auth.identities[%d]'s", m, first)
		} else {
			seen[m] = i
		}
		roles := SplitRoles(id.Roles)
		if len(roles) == 0 {
			p.add(path+".roles", "lists no role (instance, envoy, operator, region:NAME)")
		}
		for _, role := range roles {
			if err := c.checkRole(role); err != "" {
				p.add(path+".roles", "%s", err)
			}
		}
	}
}

// checkRole returns what is wrong with role, or "".
func (c *Config) checkRole(role string) string {
	switch role {
	case RoleInstance, RoleOperator, RoleEnvoy:
		return ""
	}
	if region, ok := strings.CutPrefix(role, RoleRegionPrefix); ok {
		if _, known := c.Regions[region]; !known {
			return "role " + strconv.Quote(role) + " names region " + strconv.Quote(region) + ", which is not under regions"
		}
		return ""
	}
	return "unknown role " + strconv.Quote(role) + " (want instance, envoy, operator or region:NAME)"
}
