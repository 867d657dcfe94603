package config

import (
	"errors"
	"math"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// maxTTLms is the largest TTL (ms) the regional scripts ever set (MAXMS in
// lib.lua, 2^43 ms): far inside what PEXPIRE accepts.
const maxTTLms = 1 << 43

// FuzzParse: any document either is refused with errors that wrap
// ErrInvalidConfig (every validation problem a *FieldError naming its
// field) or is accepted, and then every quantity the daemons and the
// scripts derive from it is finite and in range, and it survives a
// Marshal/Parse round trip unchanged. Seeds: testdata/fuzz/FuzzParse and
// the shipped sample; `make fuzz` explores further.
func FuzzParse(f *testing.F) {
	f.Add(SampleYAML())
	for _, name := range []string{"full.yaml", "many_errors.yaml"} {
		if data, err := os.ReadFile("testdata/" + name); err == nil {
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			checkRefusal(t, err)
			return
		}
		checkDerived(t, c)
		out, err := c.Marshal()
		if err != nil {
			t.Fatalf("accepted config does not marshal: %v", err)
		}
		again, err := Parse(out)
		if err != nil {
			t.Fatalf("accepted config refused after a round trip: %v\n%s", err, out)
		}
		if d := Diff(c, again); d != "" {
			t.Fatalf("round trip changed the config:\n%s", d)
		}
	})
}

// yamlLineRE matches a decoding problem that says where it is;
// decoderWordsRE matches the decoder's own form of a message ("line 1:
// cannot unmarshal !!str ... into config.Config"), which names Go types.
var (
	yamlLineRE     = regexp.MustCompile(`\(line \d+\)$`)
	decoderWordsRE = regexp.MustCompile(`^line \d+: `)
)

func checkRefusal(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("refusal does not wrap ErrInvalidConfig: %v", err)
	}
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return // a YAML syntax or shape error: one message with its line
	}
	for _, e := range joined.Unwrap() {
		// A document of the wrong shape (a scalar or a list where a
		// mapping belongs, a field of the wrong type) is refused by the
		// decoder, one problem per misplaced node, each naming its line.
		var ye *yamlError
		if errors.As(e, &ye) {
			if !yamlLineRE.MatchString(ye.msg) || decoderWordsRE.MatchString(ye.msg) {
				t.Fatalf("decoding problem names no line: %q (in %v)", e, err)
			}
			continue
		}
		var fe *FieldError
		if !errors.As(e, &fe) || fe.Path == "" || fe.Message == "" {
			t.Fatalf("validation problem names no field: %q (in %v)", e, err)
		}
	}
}

// checkDerived checks an accepted config the way the daemons use it.
func checkDerived(t *testing.T, c *Config) {
	t.Helper()
	epoch, validity := time.Duration(c.Epoch), time.Duration(c.GrantValidity)
	ttl, refresh := time.Duration(c.LeaseTTL), time.Duration(c.Refresh)
	for name, d := range map[string]time.Duration{"epoch": epoch, "grant_validity": validity, "lease_ttl": ttl, "refresh": refresh} {
		if d <= 0 || d > MaxInterval {
			t.Fatalf("accepted %s %v outside (0, %v]", name, d, MaxInterval)
		}
	}
	if epoch < MinEpoch || validity < 4*epoch || refresh < MinRefresh || refresh >= ttl/2 {
		t.Fatalf("accepted epoch %v validity %v lease_ttl %v refresh %v", epoch, validity, ttl, refresh)
	}
	if w := c.DemandWindow(); w <= 0 || w > refresh {
		t.Fatalf("demand window %v for refresh %v", w, refresh)
	}
	if a := c.DemandAlpha; !(a > 0 && a <= 1) {
		t.Fatalf("accepted demand_alpha %v (after defaults)", a)
	}
	var minSum float64
	for name, r := range c.Regions {
		if !(r.Weight > 0) || math.IsInf(r.Weight, 0) || !(r.MinShare >= 0 && r.MinShare <= r.MaxShare && r.MaxShare <= 1) {
			t.Fatalf("accepted region %s %+v", name, r)
		}
		minSum += r.MinShare
	}
	if minSum > 1+1e-9 {
		t.Fatalf("accepted min_shares summing to %v", minSum)
	}
	if len(c.Tenants) > 50 || len(c.Classes) > 50 || len(c.Tiers) > 50 {
		return // the checks below are per key and region; keep each input fast
	}
	check := func(where string, class Class, l LimitSpec) {
		rate, burst := float64(l.Rate), l.Burst
		if !(rate > 0) || rate > MaxRate || !(burst >= 1) || burst > MaxBurst || burst != math.Trunc(burst) || burst < class.Unit() {
			t.Fatalf("%s: accepted limit rate %v burst %v (max_cost %d)", where, rate, burst, class.MaxCost)
		}
		// Tokens are held at micro-token resolution; a rate over any
		// interval the config sets stays exact in float64.
		if burst*1e6 > 1<<53 || rate*MaxInterval.Seconds() > 1<<53 {
			t.Fatalf("%s: rate %v burst %v leave float64's exact range", where, rate, burst)
		}
		var rateSum, burstSum float64
		for region := range c.Regions {
			rs, bs, err := c.StaticShareOf(region, Resolved{Limit: quota.Limit{Rate: rate, Burst: int64(burst)}, Class: class})
			if err != nil {
				t.Fatalf("%s: static share of %s: %v", where, region, err)
			}
			if !(rs > 0) || rs > rate || math.IsInf(rs, 0) || !(bs >= 0) || bs > burst || bs != math.Trunc(bs) {
				t.Fatalf("%s: region %s static share rate %v burst %v of %v/%v", where, region, rs, bs, rate, burst)
			}
			// The bucket's TTL: two refills of its cap at its static
			// rate, plus the grant validity and the lease TTL, must be
			// a TTL the scripts can set.
			fillMs := 2000 * bs / rs
			if ttlMs := fillMs + float64(validity.Milliseconds()) + 2*float64(ttl.Milliseconds()) + 1000; !(ttlMs < maxTTLms) {
				t.Fatalf("%s: region %s bucket TTL %.4g ms (cap %v at %v/s) is beyond %d ms", where, region, ttlMs, bs, rs, int64(maxTTLms))
			}
			rateSum += rs
			burstSum += bs
		}
		if rateSum > rate || burstSum != burst {
			t.Fatalf("%s: static shares sum to rate %v of %v, burst %v of %v", where, rateSum, rate, burstSum, burst)
		}
	}
	for tier, classes := range c.Tiers {
		for class, l := range classes {
			check("tiers."+tier+"."+class, c.Classes[class], l)
		}
	}
	for id, tn := range c.Tenants {
		for class, l := range tn.Overrides {
			check("tenants."+id+".overrides."+class, c.Classes[class], l)
		}
	}
}
