package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/tlsconfig"
)

// TestCertsServeARegionWithRoles writes a deployment's certificates with
// sluicectl certs, adds the auth section it wrote to a config and serves a
// regional service with them over mutual TLS: the instance certificate
// takes a lease, the Envoy and operator certificates are refused the
// LeaseService with PermissionDenied, and the regional certificate (its
// own Envoy endpoint's lease client) takes one too.
func TestCertsServeARegionWithRoles(t *testing.T) {
	addr, dir := tlsRegion(t)
	f := func(name string) string { return filepath.Join(dir, name) }
	acquire := func(who string) error {
		tc, err := tlsconfig.Client(f("ca.crt"), f(who+".crt"), f(who+".key"), "")
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = sluicev1.NewLeaseServiceClient(conn).Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: who,
			Report: &sluicev1.KeyReport{Key: &sluicev1.QuotaKey{Tenant: "acme", Class: "read"}, Seq: 1, Want: 1}})
		return err
	}
	for _, who := range []string{"instance", "regional-local"} {
		if err := acquire(who); err != nil {
			t.Errorf("%s certificate: %v", who, err)
		}
	}
	for _, who := range []string{"envoy", "operator"} {
		if err := acquire(who); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `needs role "instance"`) {
			t.Errorf("%s certificate: %v, want PermissionDenied", who, err)
		}
	}
}

// TestCertsCarryTheServiceNamesClientsDial checks each server certificate
// sluicectl certs writes against every Service of deploy/regions that
// clients dial by name: instances and agents dial the regional replicas
// through the headless Service (docs/operations.md), Envoy through the
// ClusterIP one, and TLS verifies the name dialed.
func TestCertsCarryTheServiceNamesClientsDial(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	if code := run(t.Context(), []string{"certs", "-dir", dir, "-regions", "us-east,eu-west"}, nil, &out, &errb); code != exitOK {
		t.Fatalf("certs: exit %d: %s", code, errb.String())
	}
	regional := serviceNames(t, "../../deploy/regions/base/regional-service.yaml")
	global := serviceNames(t, "../../deploy/regions/base/global/global-service.yaml")
	if len(regional) < 2 || len(global) < 1 {
		t.Fatalf("Services: regional %q, global %q", regional, global)
	}
	for _, c := range []struct {
		file, namespace string
		services        []string
	}{
		{"regional-us-east.crt", "sluice-us-east", regional},
		{"regional-eu-west.crt", "sluice-eu-west", regional},
		{"global.crt", "sluice-us-east", global},
	} {
		cert := readCert(t, filepath.Join(dir, c.file))
		for _, svc := range c.services {
			name := svc + "." + c.namespace + ".svc"
			if err := cert.VerifyHostname(name); err != nil {
				t.Errorf("%s: %v", c.file, err)
			}
		}
	}
}

// serviceNames are the names of the Services a manifest file defines.
func serviceNames(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var names []string
	dec := yaml.NewDecoder(f)
	for {
		var doc struct {
			Kind     string `yaml:"kind"`
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
		}
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			return names
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if doc.Kind == "Service" {
			names = append(names, doc.Metadata.Name)
		}
	}
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return cert
}
