package luascripts

// newVirtual builds scripts whose clock is the value set with setNow, so the
// differential test can run Lua and Model through the same instants.
func newVirtual() *Scripts { return build(true) }

func (s *Scripts) setNow(us int64) { s.virtualNow.Store(us) }
