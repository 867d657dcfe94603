package config

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
)

const (
	// DiffWholeTenants is the most tenants (old and new together) that
	// Diff shows inside the line diff of the whole rendering.
	DiffWholeTenants = 2000
	// DiffTenantLines is the most tenant changes Diff lists one per line;
	// the rest are counted.
	DiffTenantLines = 1000
)

func tenantCount(c *Config) int {
	if c == nil {
		return 0
	}
	return len(c.Tenants)
}

// TenantChange is one tenant that differs between two configs.
type TenantChange struct {
	// Name is the tenant id.
	Name string
	// Old and New are the tenant before and after; nil when absent.
	Old, New *Tenant
}

// TenantChanges lists the tenants that differ from old to new, in name
// order. Time is linear in the two configs (plus sorting the names).
func TenantChanges(old, new map[string]Tenant) []TenantChange {
	var out []TenantChange
	for name, n := range new {
		o, ok := old[name]
		switch {
		case !ok:
			out = append(out, TenantChange{Name: name, New: &n})
		case !TenantEqual(o, n):
			out = append(out, TenantChange{Name: name, Old: &o, New: &n})
		}
	}
	for name, o := range old {
		if _, ok := new[name]; !ok {
			out = append(out, TenantChange{Name: name, Old: &o})
		}
	}
	slices.SortFunc(out, func(a, b TenantChange) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// diffTenantsApart is the line diff of everything but the tenants, then
// one line per changed tenant.
func diffTenantsApart(old, new *Config) string {
	strip := func(c *Config) *Config {
		if c == nil {
			return nil
		}
		base := *c
		base.Tenants = nil
		return &base
	}
	var oldT, newT map[string]Tenant
	if old != nil {
		oldT = old.Tenants
	}
	if new != nil {
		newT = new.Tenants
	}
	changes := TenantChanges(oldT, newT)
	base := diffLines(strip(old), strip(new))
	if len(changes) == 0 {
		return base
	}
	var out strings.Builder
	if base == "" {
		out.WriteString("--- current\n+++ proposed\n")
	} else {
		out.WriteString(base)
	}
	writeTenantChanges(&out, changes, len(oldT), len(newT))
	return out.String()
}

// DiffTenants is Diff's form for tenant changes alone (before and after
// are the numbers of tenants listed, or -1 when not known), for a change
// that touches only tenants: it needs neither whole config.
func DiffTenants(changes []TenantChange, before, after int) string {
	if len(changes) == 0 {
		return ""
	}
	var out strings.Builder
	out.WriteString("--- current\n+++ proposed\n")
	writeTenantChanges(&out, changes, before, after)
	return out.String()
}

func writeTenantChanges(out *strings.Builder, changes []TenantChange, before, after int) {
	added, changed, removed := 0, 0, 0
	for _, ch := range changes {
		switch {
		case ch.Old == nil:
			added++
		case ch.New == nil:
			removed++
		default:
			changed++
		}
	}
	if before >= 0 && after >= 0 {
		fmt.Fprintf(out, "@@ tenants: %d added, %d changed, %d removed (%d listed before, %d after) @@\n",
			added, changed, removed, before, after)
	} else {
		fmt.Fprintf(out, "@@ tenants: %d added, %d changed, %d removed @@\n", added, changed, removed)
	}
	var block bytes.Buffer
	lines := func(op byte, name string, t Tenant) {
		block.Reset()
		if err := renderTenant(&block, name, t); err != nil {
			fmt.Fprintf(out, "%c  # %s: cannot render: %v\n", op, name, err)
			return
		}
		for line := range bytes.Lines(block.Bytes()) {
			out.WriteByte(op)
			out.Write(line)
		}
	}
	for i, ch := range changes {
		if i == DiffTenantLines {
			fmt.Fprintf(out, "# and %d more tenant changes not shown\n", len(changes)-i)
			break
		}
		if ch.Old != nil {
			lines('-', ch.Name, *ch.Old)
		}
		if ch.New != nil {
			lines('+', ch.Name, *ch.New)
		}
	}
}
