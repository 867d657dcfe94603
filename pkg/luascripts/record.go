package luascripts

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// compactMark starts a compact lease record (see lib.lua, lease_record).
const compactMark = '~'

// compactable mirrors lib.lua's compactable: a whole, non-negative number
// below 2^53.
func compactable(x float64) bool { return x >= 0 && x < 1<<53 && x == math.Floor(x) }

// canonicalInc mirrors lib.lua's test of an incarnation a compact record
// can carry: a canonical decimal of at most 20 digits.
func canonicalInc(inc string) bool {
	if len(inc) == 0 || len(inc) > 20 || (inc[0] == '0' && inc != "0") {
		return false
	}
	for i := 0; i < len(inc); i++ {
		if inc[i] < '0' || inc[i] > '9' {
			return false
		}
	}
	return true
}

// leaseRecord renders a lease record as lib.lua's lease_record does:
// compact when every number and the incarnation allow it, else as text.
func leaseRecord(l *modelLease) string {
	nums := [13]float64{l.g, l.u, l.r, l.seq, l.exp, l.lg, l.lt, l.pd, l.dr, l.au, l.ad, l.ar, l.le}
	ok := canonicalInc(l.inc)
	for _, x := range nums {
		ok = ok && compactable(x)
	}
	if !ok {
		f := make([]string, 0, 14)
		for _, x := range nums {
			f = append(f, i0(x))
		}
		return strings.Join(append(f, l.inc), " ")
	}
	b := make([]byte, 1, 64)
	b[0] = compactMark
	for _, x := range nums {
		b = binary.AppendUvarint(b, uint64(x))
	}
	var hi, lo uint64
	if n := len(l.inc); n > 10 {
		hi, _ = strconv.ParseUint(l.inc[:n-10], 10, 64)
		lo, _ = strconv.ParseUint(l.inc[n-10:], 10, 64)
	} else {
		lo, _ = strconv.ParseUint(l.inc, 10, 64)
	}
	b = binary.AppendUvarint(b, hi)
	return string(binary.AppendUvarint(b, lo))
}

// parseCompact reads a compact lease record.
func parseCompact(v string) (LeaseRecord, error) {
	b := []byte(v[1:])
	var n [15]uint64
	for i := range n {
		x, k := binary.Uvarint(b)
		if k <= 0 {
			return LeaseRecord{}, fmt.Errorf("%w: compact lease record %q: number %d unreadable", ErrReply, v, i+1)
		}
		n[i], b = x, b[k:]
	}
	if len(b) != 0 {
		return LeaseRecord{}, fmt.Errorf("%w: compact lease record %q: %d bytes left over", ErrReply, v, len(b))
	}
	inc := strconv.FormatUint(n[14], 10)
	if n[13] > 0 {
		inc = strconv.FormatUint(n[13], 10) + fmt.Sprintf("%010d", n[14])
	}
	f := func(i int) float64 { return float64(n[i]) }
	return LeaseRecord{
		Granted: f(0), Used: f(1), Returned: f(2), Seq: n[3], ExpiryUS: int64(n[4]), LastGrant: f(5),
		WindowStartUS: int64(n[6]), WindowDemand: f(7), DemandRate: f(8) / 1000,
		AppliedUsed: f(9), AppliedDenied: f(10), AppliedReturned: f(11), Lease: n[12],
		Incarnation: inc, Fingerprint: true,
	}, nil
}
