package luascripts

// newVirtual builds scripts whose clock is the value set with setNow, so the
// differential test can run Lua and Model through the same instants.
func newVirtual() *Scripts { return build(embedded, true) }

func (s *Scripts) setNow(us int64) { s.virtualNow.Store(us) }

// forgetGenerations gives s a process view that has seen nothing, as a
// fresh process has: for tests that empty Redis and start a fresh Model.
func (s *Scripts) forgetGenerations() { s.gens = NewGenerations() }

// rolledBack returns a copy of m's data as it was (a snapshot taken
// earlier), called by the process whose view of the generations is g's:
// a Redis restored from an older snapshot, or a replica promoted while it
// lagged.
func (m *Model) rolledBack(g *Generations) *Model {
	c := NewModelSeen(g)
	for k, b := range m.buckets {
		cb := *b
		c.buckets[k] = &cb
	}
	for k, ls := range m.leases {
		cl := &modelLeases{byID: map[string]*modelLease{}}
		for id, l := range ls.byID {
			cr := *l
			cl.byID[id] = &cr
		}
		c.leases[k] = cl
	}
	for k, v := range m.born {
		c.born[k] = v
	}
	for k, v := range m.gen {
		c.gen[k] = v
	}
	for k, set := range m.cands {
		cs := map[string]float64{}
		for mem, sc := range set {
			cs[mem] = sc
		}
		c.cands[k] = cs
	}
	return c
}
