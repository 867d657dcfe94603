package agent

import (
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
)

// StaticConfig is a ConfigSource serving one config (a sidecar's config
// file): no reload.
type StaticConfig struct{ C *config.Config }

// Current implements ConfigSource.
func (s StaticConfig) Current() *config.Config { return s.C }

// Watched is a ConfigSource following etcd through a configstore.Watcher
// (hot reload; an invalid config in etcd is never applied). Unlike the
// Watcher itself it serves no fallback: until etcd has handed out a valid
// config, Current is nil and the agent answers that no config is loaded,
// rather than deciding on limits nobody configured.
type Watched struct{ W *configstore.Watcher }

// Current implements ConfigSource.
func (w Watched) Current() *config.Config {
	cfg, rev := w.W.Live()
	if rev == 0 {
		return nil
	}
	return cfg
}
