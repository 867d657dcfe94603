package main

import (
	"strings"
	"testing"
)

// TestRedisAddrWithCredentialsIsRefusedWithoutThem: an address given as a
// URL with credentials was dialled as is, failed "too many colons", and
// the address, password included, was logged at WARN. It is refused at
// start saying the flag wants host:port and where credentials go, and the
// password is written nowhere.
func TestRedisAddrWithCredentialsIsRefusedWithoutThem(t *testing.T) {
	const secret = "s3cret-pw"
	for _, addr := range []string{
		"redis://sluice:" + secret + "@10.0.0.7:6379",
		"rediss://:" + secret + "@redis.example:6380",
		"sluice:" + secret + "@10.0.0.7:6379",
		"10.0.0.6:6379,redis://u:" + secret + "@10.0.0.7:6379",
	} {
		stderr, code := runMain(t, "-redis-addr", addr, "-listen", "127.0.0.1:0", "-metrics-listen", "off")
		if code != 1 {
			t.Fatalf("-redis-addr %q: exit %d, want 1:\n%s", addr, code, stderr)
		}
		if strings.Contains(stderr, secret) {
			t.Errorf("-redis-addr %q: the password is in the output:\n%s", addr, stderr)
		}
		for _, want := range []string{"-redis-addr wants host:port", "-redis-username", "-redis-password"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("-redis-addr %q: output does not say %q:\n%s", addr, want, stderr)
			}
		}
		if strings.Contains(stderr, "regional service started") || strings.Contains(stderr, "too many colons") {
			t.Errorf("-redis-addr %q: started or dialled:\n%s", addr, stderr)
		}
	}
	// A plain mistake is shown: it holds nothing secret.
	stderr, code := runMain(t, "-redis-addr", "redis-host", "-listen", "127.0.0.1:0", "-metrics-listen", "off")
	if code != 1 || !strings.Contains(stderr, `"redis-host" is not host:port: missing port in address`) {
		t.Errorf("-redis-addr redis-host: exit %d:\n%s", code, stderr)
	}
}

// TestRedisUsernameNeedsAPassword: a username alone would never be sent
// (Redis authenticates a user with its password), so it is refused.
func TestRedisUsernameNeedsAPassword(t *testing.T) {
	if _, err := parseFlags([]string{"-redis-username", "sluice"}); err == nil || !strings.Contains(err.Error(), "-redis-username needs -redis-password") {
		t.Fatalf("err %v", err)
	}
	t.Setenv("SLUICE_REDIS_USERNAME", "sluice")
	t.Setenv("SLUICE_REDIS_PASSWORD", "pw")
	f, err := parseFlags(nil)
	if err != nil || f.redisUsername != "sluice" || f.redisPassword != "pw" {
		t.Fatalf("from the environment: %+v, %v", f, err)
	}
}
