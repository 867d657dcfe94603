package main

import (
	"context"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestCheckWhoseRedisFailsSaysTheServiceAnswered: a check the regional
// service answers with its Redis's failure (here the key's bucket holds a
// value of another type, so the script fails in Redis) exits 5 as an
// unreachable service does, but says the service answered and its Redis
// did not, instead of asking whether the service runs; a service that is
// not there at all still gets that question.
func TestCheckWhoseRedisFailsSaysTheServiceAnswered(t *testing.T) {
	cfg := regiontest.MustConfig(t, probeLiveConfig)
	reg := regiontest.Start(t, cfg, "us-east")
	keys, _, _, err := reg.Server.CommonFor(cfg, quota.Key{Tenant: "broken", Class: "export"})
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.RDB.RPush(context.Background(), keys.Bucket, "not a bucket").Err(); err != nil {
		t.Fatal(err)
	}
	r := sluicectl(t, "", "check", "-addr", reg.Addr, "-tenant", "broken", "-class", "export")
	wantCode(t, r, exitUnreachable)
	wantContains(t, "stderr", r.stderr, "the regional service answered, but its Redis failed the call", "WRONGTYPE", "Regional Redis down")
	if strings.Contains(r.stderr, "is the regional service running there") {
		t.Errorf("a service that answered is asked whether it runs:\n%s", r)
	}

	r = sluicectl(t, "", "check", "-addr", grpctest.RefusedAddr(t), "-tenant", "t1", "-class", "export")
	wantCode(t, r, exitUnreachable)
	wantContains(t, "stderr", r.stderr, "is the regional service running there")
}
