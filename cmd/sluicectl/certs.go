package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/tlsconfig"
)

// certsCmd writes a CA and the certificates of a deployment's mutual TLS,
// each with the SANs auth.identities gives roles, and the auth section
// that gives them.
func (a *app) certsCmd(fset *flag.FlagSet) func(context.Context, []string) error {
	dir := fset.String("dir", "", "directory to write the certificates into (created; an existing ca.crt and ca.key there sign the new certificates)")
	domain := fset.String("domain", "sluice.example", "trust domain of the SAN URIs (spiffe://DOMAIN/...)")
	regions := fset.String("regions", "us-east,eu-west,ap-south", "regions, comma separated: one regional certificate each")
	names := fset.String("server-names", "", "more DNS names for every server certificate, comma separated (localhost, 127.0.0.1 and the deploy/regions Service names are always in)")
	validity := fset.Duration("validity", 365*24*time.Hour, "how long the certificates are valid")
	return func(ctx context.Context, args []string) error {
		if err := noPositional(args); err != nil {
			return err
		}
		if *dir == "" {
			return exitf(exitUsage, "certs needs -dir DIR")
		}
		if *validity <= 0 {
			return exitf(exitUsage, "-validity %v must be positive", *validity)
		}
		var rs []string
		for _, r := range strings.Split(*regions, ",") {
			if r = strings.TrimSpace(r); r == "" {
				continue
			}
			if err := quota.ValidateID("region", r); err != nil {
				return exitf(exitUsage, "-regions: %v", err)
			}
			rs = append(rs, r)
		}
		if len(rs) == 0 {
			return exitf(exitUsage, "-regions names no region")
		}
		if strings.ContainsAny(*domain, "/ ") || *domain == "" {
			return exitf(exitUsage, "-domain %q must be a host name", *domain)
		}
		leaves, auth := deploymentLeaves(*domain, rs, splitList(*names))
		if err := os.MkdirAll(*dir, 0o755); err != nil {
			return err
		}
		now := time.Now()
		ca, err := tlsconfig.LoadCA(filepath.Join(*dir, "ca.crt"), filepath.Join(*dir, "ca.key"))
		switch {
		case err == nil:
			fmt.Fprintf(a.stdout, "signing with the existing CA in %s\n", *dir)
		case errors.Is(err, fs.ErrNotExist):
			if ca, err = tlsconfig.NewCA("Sluice CA ("+*domain+")", now, *validity); err != nil {
				return err
			}
			if err := ca.WriteCA(*dir); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "wrote ca.crt, ca.key (keep ca.key offline)\n")
		default:
			return err
		}
		for _, l := range leaves {
			if err := ca.WriteLeaf(*dir, l, now, *validity); err != nil {
				return err
			}
			sans := append(append([]string{}, l.URIs...), l.DNSNames...)
			fmt.Fprintf(a.stdout, "wrote %s.crt, %s.key  %s\n", l.Name, l.Name, strings.Join(sans, " "))
		}
		if err := os.WriteFile(filepath.Join(*dir, "auth.yaml"), []byte(auth), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "wrote auth.yaml: add its auth section to the config (sluicectl apply) so these certificates get their roles\n")
		return nil
	}
}

// deploymentLeaves are the certificates of a deployment and the config's
// auth section giving them their roles.
func deploymentLeaves(domain string, regions, extra []string) ([]tlsconfig.Leaf, string) {
	uri := func(path string) string { return "spiffe://" + domain + "/" + path }
	local := append([]string{"localhost"}, extra...)
	ips := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	leaves := []tlsconfig.Leaf{{
		Name: "global", URIs: []string{uri("global")}, IPs: ips, Server: true,
		DNSNames: append([]string{"sluice-global.sluice-us-east.svc", "sluice-global.sluice-us-east.svc.clusterset.local"}, local...),
	}}
	var b strings.Builder
	b.WriteString("# Roles of the certificates written by sluicectl certs (docs/operations.md,\n# Authentication and roles).\nauth:\n  identities:\n")
	for _, r := range regions {
		// A regional replica presents its certificate to the global tier
		// as its region's leader, and to its own LeaseService as the
		// Envoy endpoint's lease client. Clients reach it by both of
		// deploy/regions' Services: Envoy by sluice-regional, instances
		// and agents by the headless one, which balances over replicas.
		ns := "sluice-" + r + ".svc"
		leaves = append(leaves, tlsconfig.Leaf{
			Name: "regional-" + r, URIs: []string{uri("region/" + r)}, IPs: ips, Server: true, Client: true,
			DNSNames: append([]string{"sluice-regional." + ns, "sluice-regional-headless." + ns}, local...),
		})
		fmt.Fprintf(&b, "    - {match: %q, roles: \"%s, %s%s\"}\n", uri("region/"+r), config.RoleInstance, config.RoleRegionPrefix, r)
	}
	for _, role := range []string{config.RoleInstance, config.RoleEnvoy, config.RoleOperator} {
		leaves = append(leaves, tlsconfig.Leaf{Name: role, URIs: []string{uri(role)}, Client: true})
		fmt.Fprintf(&b, "    - {match: %q, roles: %s}\n", uri(role), role)
	}
	return leaves, b.String()
}

func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}
