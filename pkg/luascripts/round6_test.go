package luascripts

import (
	"math"
	"math/rand/v2"
	"testing"
)

// round6 takes a shortcut around the decimal round trip; it must give the
// very float the round trip gives, bit for bit (-0 included), or the model
// parts from the scripts it mirrors.
func sameRound6(t testing.TB, x float64) {
	t.Helper()
	got, want := round6(x), round6Decimal(x)
	if math.Float64bits(got) != math.Float64bits(want) && !(math.IsNaN(got) && math.IsNaN(want)) {
		t.Fatalf("round6(%v) = %v (%#x), the decimal round trip gives %v (%#x)", x, got, math.Float64bits(got), want, math.Float64bits(want))
	}
}

func TestRound6IsTheDecimalRoundTrip(t *testing.T) {
	edges := []float64{0, math.Copysign(0, -1), 1, -1, 0.5, 1e-7, -1e-7, 5e-7, -5e-7, 4.999999e-7,
		1.0 / 128, -1.0 / 128, 3.0 / 128, 0.0078125, 2.5e-6, 1234.5678905, 0.1 + 0.2,
		1 << 30, 1 << 40, 4503599627.3704995, 4503599627.370496, 1e10, 1e15, 1e20, -1e20,
		math.MaxFloat64, -math.MaxFloat64, math.SmallestNonzeroFloat64, math.Inf(1), math.Inf(-1), math.NaN()}
	for _, x := range edges {
		sameRound6(t, x)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200_000 {
		// Token counts as the scripts hold them: whole micro-tokens plus
		// what a refill's division leaves, at every magnitude.
		x := float64(r.Int64N(1<<40)) / 1e6 * math.Pow(10, float64(r.IntN(9)-4))
		if r.IntN(2) == 0 {
			x = -x
		}
		sameRound6(t, x)
		// Half a micro-token away from a whole one, and a few floats
		// either side of it: the cases the shortcut must leave alone.
		h := (float64(r.Int64N(1<<36)) + 0.5) / 1e6
		for i := range 5 {
			sameRound6(t, h)
			sameRound6(t, -h)
			h = math.Nextafter(h, math.Inf(1))
			if i == 2 {
				h = math.Nextafter(math.Nextafter(h, 0), 0)
			}
		}
		sameRound6(t, math.Float64frombits(r.Uint64()))
	}
}

func FuzzRound6(f *testing.F) {
	for _, x := range []float64{0, 1.0 / 128, 7812.5e-6, 0.1 + 0.2, 4503599627.3704995, math.Inf(1)} {
		f.Add(x)
	}
	f.Fuzz(func(t *testing.T, x float64) { sameRound6(t, x) })
}
