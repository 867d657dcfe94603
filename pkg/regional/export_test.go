package regional

import "github.com/sluicehq/sluice/pkg/config"

// ConfigForTest exposes the live config to the external tests.
func (s *Server) ConfigForTest() *config.Config { return s.opts.Config.Current() }
