package lease

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"os"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/pkg/quota"
)

// UniqueID returns an instance id that no other process shares: prefix,
// this host's name, the process id and a random incarnation suffix, cut
// to the id length limit. Two processes given the same prefix (replicas
// listening on the same address, say) still report as distinct
// instances, and so does a restarted process.
func UniqueID(prefix string) string {
	host, _ := os.Hostname()
	return joinID(prefix+"-"+sanitizeID(host)+"-"+strconv.Itoa(os.Getpid()), randomHex(4))
}

// joinID appends "." and suffix to base, shortening base so the result
// stays within the id length limit.
func joinID(base, suffix string) string {
	if room := quota.MaxTenantLen - len(suffix) - 1; len(base) > room {
		base = base[:room]
	}
	return base + "." + suffix
}

func sanitizeID(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', strings.ContainsRune("._:@-", r):
			return r
		}
		return '-'
	}, s)
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) // never fails (crypto/rand panics rather than return an error)
	return hex.EncodeToString(b)
}

// newIncarnation draws the random, non-zero number that tells this
// process's reports apart from any other process's under the same id.
func newIncarnation() uint64 {
	for {
		var b [8]byte
		rand.Read(b[:])
		if v := binary.LittleEndian.Uint64(b[:]); v != 0 {
			return v
		}
	}
}
