package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/pkg/allocator"
	"github.com/sluicehq/sluice/pkg/tlsconfig"
)

// tlsGlobal starts a global allocator replica over mutual TLS with the
// certificates sluicectl certs wrote to dir, listening on (and so
// advertising in etcd) listen, and waits until it leads when wantLeader.
func tlsGlobal(t *testing.T, srv *etcdtest.Server, dir, listen string, wantLeader bool) *allocator.Daemon {
	t.Helper()
	f := func(name string) string { return filepath.Join(dir, name) }
	serverTLS, err := tlsconfig.Server(f("global.crt"), f("global.key"), f("ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := allocator.StartDaemon(context.Background(), allocator.DaemonOptions{
		GRPCAddr: listen, HTTPAddr: "off", Etcd: srv.Client(t),
		Config: allocator.StaticConfig{C: tlsConfig(t, dir)}, ServerTLS: serverTLS,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	if wantLeader {
		// The replica campaigns at once; an election on a fresh etcd is
		// bounded by etcd's own request timeouts.
		deadline := time.Now().Add(30 * time.Second)
		for !d.IsLeader() {
			if time.Now().After(deadline) {
				t.Fatal("the replica never led")
			}
			time.Sleep(10 * time.Millisecond) // polling with a deadline
		}
	}
	return d
}

// writeCerts runs sluicectl certs into a new directory.
func writeCerts(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	var out, errb bytes.Buffer
	if code := run(t.Context(), []string{"certs", "-dir", dir, "-regions", "local", "-domain", "sluice.test"}, nil, &out, &errb); code != exitOK {
		t.Fatalf("certs: exit %d: %s", code, errb.String())
	}
	return dir
}

// TestStatusVerifiesTheGlobalLeaderByGlobalTLSName: a global leader
// advertising an address its certificate does not carry (an IP, as
// -advertise=$(POD_IP):7500 makes it) cannot be verified by the address
// etcd names; -global-tls-name, or its environment variable, names what
// the certificate must carry instead, as cmd/regional's flag does.
func TestStatusVerifiesTheGlobalLeaderByGlobalTLSName(t *testing.T) {
	dir := writeCerts(t)
	srv := etcdtest.Start(t)
	// global.crt carries 127.0.0.1, ::1, localhost and the Service names,
	// not 127.0.0.2.
	d := tlsGlobal(t, srv, dir, "127.0.0.2:0", true)
	if !strings.HasPrefix(d.Advertise(), "127.0.0.2:") {
		t.Fatalf("the replica advertises %q, want 127.0.0.2", d.Advertise())
	}
	base := append(tlsFlags(dir, "operator"), "-etcd-endpoints", strings.Join(srv.Endpoints(), ","))
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		code int
		out  []string
		err  []string
	}{
		{"without a name the leader's IP is checked against its certificate", []string{"status"}, nil,
			exitUnreachable, []string{"global allocator " + d.Advertise() + ": unreachable"},
			[]string{"certificate is valid for", "not 127.0.0.2", "-global-tls-name"}},
		{"a name the certificate carries", []string{"-global-tls-name", "localhost", "status"}, nil,
			exitOK, []string{"global allocator:  " + d.Advertise() + "  (leader)"}, nil},
		{"the Service name, from the environment", []string{"status"},
			map[string]string{"SLUICE_GLOBAL_TLS_NAME": "sluice-global.sluice-us-east.svc"},
			exitOK, []string{"global allocator:  " + d.Advertise() + "  (leader)"}, nil},
		{"a name the certificate lacks", []string{"-global-tls-name", "elsewhere.example", "status"}, nil,
			exitUnreachable, nil, []string{"not elsewhere.example"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &app{getenv: func(k string) string { return tc.env[k] }}
			r := runApp(t, a, append(append([]string{}, base...), tc.args...)...)
			wantCode(t, r, tc.code)
			wantContains(t, "stdout", r.stdout, tc.out...)
			wantContains(t, "stderr", r.stderr, tc.err...)
		})
	}
}

// TestStatusAtAStandbyAsksTheLeaderItNames: a standby holds no
// allocation, so status pointed at one asks the leader it names, once, and
// says so; when that leader cannot be asked (here its advertised IP is not
// in its certificate and no -global-tls-name is given) status shows the
// standby's answer marked as such and exits exitUnreachable, not 0.
func TestStatusAtAStandbyAsksTheLeaderItNames(t *testing.T) {
	dir := writeCerts(t)
	srv := etcdtest.Start(t)
	leader := tlsGlobal(t, srv, dir, "127.0.0.2:0", true)
	standby := tlsGlobal(t, srv, dir, "127.0.0.1:0", false)
	at := append(tlsFlags(dir, "operator"), "-global-addr", standby.GRPCAddr())

	// Once the standby has seen the election, status at it follows to the
	// leader (bounded by the session TTL in which a standby learns it).
	deadline := time.Now().Add(30 * time.Second)
	var r result
	for {
		r = sluicectl(t, "", append(append([]string{}, at...), "-global-tls-name", "localhost", "status")...)
		if r.code == exitOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status at the standby never reached the leader:\n%s", r)
		}
		time.Sleep(50 * time.Millisecond) // polling with a deadline
	}
	if standby.IsLeader() {
		t.Fatal("the second replica leads")
	}
	wantContains(t, "stdout", r.stdout,
		"global allocator:  "+leader.Advertise()+"  (leader; asked "+standby.GRPCAddr()+", a standby, which named it)")
	r = sluicectl(t, "", append(append([]string{}, at...), "-global-tls-name", "localhost", "status", "-o", "json")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, `"global_addr": "`+leader.Advertise()+`"`, `"asked_standby": "`+standby.GRPCAddr()+`"`,
		`"answered_by_leader": true`)

	r = sluicectl(t, "", append(append([]string{}, at...), "status")...)
	wantCode(t, r, exitUnreachable)
	wantContains(t, "stdout", r.stdout, "(standby; leader is "+leader.Advertise()+")", "STANDBY'S FIGURES")
	wantContains(t, "stderr", r.stderr, "is a standby", "the leader it names, "+leader.Advertise()+", could not be asked",
		"certificate is valid for", "-global-tls-name")
}
