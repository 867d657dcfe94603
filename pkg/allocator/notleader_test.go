package allocator

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestNotLeaderAddrParsesOnlyTheRedirect: NotLeaderAddr takes the address
// after "leader=" up to a space, semicolon or comma from a
// FailedPrecondition whose message starts "not leader" ("" when the
// replica did not know the leader), and refuses anything else.
func TestNotLeaderAddrParsesOnlyTheRedirect(t *testing.T) {
	fp := func(msg string) error { return status.Error(codes.FailedPrecondition, msg) }
	for _, c := range []struct {
		name string
		err  error
		addr string
		ok   bool
	}{
		{"the redirect", notLeaderError("h:7500"), "h:7500", true},
		{"the redirect to nobody", notLeaderError(""), "", true},
		{"address then a space", fp("not leader; leader=h:1 since term 3"), "h:1", true},
		{"address then a semicolon", fp("not leader; leader=h:1;x"), "h:1", true},
		{"address then a comma", fp("not leader; leader=h:1,x"), "h:1", true},
		{"nobody then a semicolon", fp("not leader; leader=;stale"), "", true},
		{"the last leader= counts", fp("not leader; leader=old:1 leader=new:2"), "new:2", true},
		{"another code", status.Error(codes.Aborted, "not leader; leader=h:1"), "", false},
		{"not a status", errors.New("not leader; leader=h:1"), "", false},
		{"nil", nil, "", false},
		{"another message", fp("config mismatch; leader=h:1"), "", false},
		{"no leader=", fp("not leader"), "", false},
	} {
		addr, ok := NotLeaderAddr(c.err)
		if addr != c.addr || ok != c.ok {
			t.Errorf("%s: NotLeaderAddr(%v) = %q, %v; want %q, %v", c.name, c.err, addr, ok, c.addr, c.ok)
		}
	}
}
