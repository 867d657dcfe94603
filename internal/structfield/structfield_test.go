package structfield

import "testing"

func TestParseListAcceptsRFC8941Examples(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		kind Kind
	}{
		{`sugar, tea, rum`, 3, Token},
		{`"default";r=50;t=30`, 1, String},
		{`"burst";q=100;w=60,"daily";q=1000;w=86400`, 2, String},
		{`10, 10;w=1`, 2, Integer},
		{`-1.5;a;b=?0, :cHJldGVuZCB0aGlzIGlzIGJpbmFyeSBjb250ZW50Lg==:`, 2, Decimal},
		{`("foo" "bar");lvl=5, ("baz")`, 2, 0},
		{`  "a \"q\" \\ b"  `, 1, String},
	} {
		got, err := ParseList(tc.in)
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		if len(got) != tc.n || (tc.kind != 0 && got[0].Item.Kind != tc.kind) {
			t.Errorf("%s: got %+v", tc.in, got)
		}
	}
	m, _ := ParseList(`"p";q=5;w=1;q=6`)
	if q, ok := m[0].Param("q"); !ok || q.Kind != Integer || q.Int != 6 {
		t.Errorf("last parameter must win: %+v", m)
	}
	if s, _ := ParseList(`"a \"q\" \\ b"`); s[0].Item.Str != `a "q" \ b` {
		t.Errorf("escapes: %q", s[0].Item.Str)
	}
}

func TestParseListRefusesInvalidValues(t *testing.T) {
	for _, in := range []string{
		`"open`, `a,`, `,a`, `"x";Q=1`, `"x";q=1.2345`, `1234567890123456`,
		`"x" "y"`, `"x";q=`, `?2`, `"é"`, `"bad \n escape"`, `(a b`, `"x";t=-`,
	} {
		if got, err := ParseList(in); err == nil {
			t.Errorf("%q parsed as %+v", in, got)
		}
	}
}
