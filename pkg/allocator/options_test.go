package allocator

import (
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestDefaultsAreTheDocumentedValues: the report bounds are the numbers
// docs/operations.md ("Request bounds") and the -max-report-bytes flag
// promise operators: 100,000 keys a message, 512 MiB held of a region's
// report, counting 384 bytes for each key held; Status lists the keys
// StatusRequest.top_keys documents: 10 by default, at most 1000.
func TestDefaultsAreTheDocumentedValues(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"DefaultMaxKeysPerPage", DefaultMaxKeysPerPage, 100_000},
		{"DefaultMaxReportBytes", DefaultMaxReportBytes, 512 << 20},
		{"heldBytesPerKey", heldBytesPerKey, 384},
		{"DefaultStatusKeys", DefaultStatusKeys, 10},
		{"MaxStatusKeys", MaxStatusKeys, 1000},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
}

// TestNewServiceOptions: a Service needs a config source holding a
// config the allocator takes and refuses a negative key or byte bound; zero bounds and no
// logger take the defaults, and bounds given are kept.
func TestNewServiceOptions(t *testing.T) {
	cfg := StaticConfig{C: parseConfig(t, loopConfig)}
	logger := slog.New(slog.DiscardHandler)
	refused := *cfg.C // past the config's checks
	refused.DemandAlpha = 2
	for _, c := range []struct {
		name              string
		o                 serviceOptions
		err               string
		maxKeys, maxBytes int
		defaultLogger     bool
	}{
		{name: "no config source", o: serviceOptions{logger: logger}, err: "a ConfigSource is required"},
		{name: "a source without a config", o: serviceOptions{config: StaticConfig{}, logger: logger}, err: "the ConfigSource has no config"},
		{name: "negative keys", o: serviceOptions{config: cfg, maxKeys: -1, logger: logger}, err: "max keys per page -1 is negative"},
		{name: "a config the allocator refuses", o: serviceOptions{config: StaticConfig{C: &refused}, logger: logger}, err: "demand alpha 2 must be in (0, 1]"},
		{name: "negative bytes", o: serviceOptions{config: cfg, maxBytes: -1, logger: logger}, err: "max report bytes -1 is negative"},
		{name: "defaults", o: serviceOptions{config: cfg}, maxKeys: DefaultMaxKeysPerPage, maxBytes: DefaultMaxReportBytes, defaultLogger: true},
		{name: "bounds given", o: serviceOptions{config: cfg, maxKeys: 1, maxBytes: 1, logger: logger}, maxKeys: 1, maxBytes: 1},
	} {
		s, err := newService(c.o, time.Now())
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: %v, want an error containing %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if s.maxKeys != c.maxKeys || s.maxReportBytes != c.maxBytes {
			t.Errorf("%s: %d keys a page, %d report bytes; want %d and %d", c.name, s.maxKeys, s.maxReportBytes, c.maxKeys, c.maxBytes)
		}
		want := logger
		if c.defaultLogger {
			want = slog.Default()
		}
		if s.log != want {
			t.Errorf("%s: logger %p, want %p", c.name, s.log, want)
		}
	}
}
