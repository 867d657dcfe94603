package etcdflags

import (
	"flag"
	"strings"
	"testing"
)

func TestRegisterAndClientErrors(t *testing.T) {
	var a Access
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	a.Register(fs)
	if err := fs.Parse([]string{"-etcd-ca", "/nonexistent/ca.pem", "-etcd-username", "u", "-etcd-password", "p"}); err != nil {
		t.Fatal(err)
	}
	if a.CA != "/nonexistent/ca.pem" || a.Username != "u" || a.Password != "p" {
		t.Fatalf("flags not bound: %+v", a)
	}
	if _, err := a.Client([]string{"127.0.0.1:1"}); err == nil || !strings.HasPrefix(err.Error(), "etcd: ") {
		t.Fatalf("a CA that cannot be read: %v, want an etcd: error naming it", err)
	}
}
