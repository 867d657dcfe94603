package regional

import (
	"fmt"
	"strings"

	"github.com/sluicehq/sluice/internal/flagenv"
)

// ValidateRedisAddr checks a Redis address list (RedisAddr: host:port,
// several comma-separated for a Redis Cluster). An address given as a URL
// with credentials (redis://user:password@host:6379) is the mistake it
// catches first: the error says the form wanted and where credentials go,
// and never repeats an address that may carry them, so the password does
// not reach a log or a terminal.
func ValidateRedisAddr(list string) error {
	addrs := strings.Split(list, ",")
	for i, a := range addrs {
		which := "the address"
		if len(addrs) > 1 {
			which = fmt.Sprintf("address %d of %d", i+1, len(addrs))
		}
		a = strings.TrimSpace(a)
		// An address with a scheme, a user part or more than one colon
		// outside brackets may hold credentials: it is not shown.
		secret := strings.Contains(a, "://") || strings.Contains(a, "@") || strings.Contains(a, "/") ||
			(!strings.HasPrefix(a, "[") && strings.Count(a, ":") > 1)
		if secret {
			return fmt.Errorf("%s is not host:port (it looks like a URL or holds credentials, so it is not shown); give host:port and the credentials in the username and password settings (-redis-username, -redis-password)", which)
		}
		if err := flagenv.HostPort(a); err != nil {
			return fmt.Errorf("%s %q is not host:port: %v", which, a, err)
		}
	}
	return nil
}
