package regionsync

import (
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/shard"
)

// The region's side of the sharded global tier. The region leader sends
// each shard the part of its report naming the keys that shard owns under
// the config the region runs (its chain's current one), installs from each
// shard's answer only the grants for keys that shard owns there, and keeps
// one static lease per shard. A key runs on its static share only while
// the static leases of its owners under every shard map the region
// honours are valid: the maps of the configs in its chain, and those it
// dropped less than one grant validity and one epoch ago. A shard that
// found the region lapsed re-divides only the keys it owns, and under any
// of those maps the region keeps such a key on its floor until that
// shard's lease ends; an old owner's grants, issued while other regions
// still ran the old map, end within a validity of the last region's
// adoption of the new map, which the retention outlasts.

// ShardLeases is a region's static leases, indexed by shard. A shard past
// its end holds none. A value: methods return new slices.
type ShardLeases []StaticLease

// Of is shard i's lease (none when i is past the end or negative).
func (s ShardLeases) Of(i int) StaticLease {
	if i < 0 || i >= len(s) {
		return StaticLease{}
	}
	return s[i]
}

// With is s with shard i's lease merged with l (StaticLease.Merge: a lease
// only grows).
func (s ShardLeases) With(i int, l StaticLease) ShardLeases {
	out := make(ShardLeases, max(len(s), i+1))
	copy(out, s)
	out[i] = out[i].Merge(l)
	return out
}

// Merge is the elementwise longer of s and o.
func (s ShardLeases) Merge(o ShardLeases) ShardLeases {
	out := make(ShardLeases, max(len(s), len(o)))
	copy(out, s)
	for i, l := range o {
		out[i] = out[i].Merge(l)
	}
	return out
}

// KeyLease is the static lease key k runs under: the one ending first
// among the leases of its owners under every map in maps. With no map (or
// only one shard) it is shard 0's lease.
func KeyLease(k quota.Key, maps []shard.Map, leases ShardLeases) StaticLease {
	if len(maps) == 0 {
		return leases.Of(0)
	}
	out := leases.Of(maps[0].Of(k))
	for _, m := range maps[1:] {
		if l := leases.Of(m.Of(k)); l.UntilUS < out.UntilUS {
			out = l
		}
	}
	return out
}

// ShardMaps is the shard maps of the chain's configs, without repeats, the
// current config's first.
func (c Chain) ShardMaps() []shard.Map {
	var out []shard.Map
	add := func(m shard.Map) {
		for _, x := range out {
			if x.N() == m.N() {
				return
			}
		}
		out = append(out, m)
	}
	if cur := c.Current(); cur.Cfg != nil {
		add(cur.Cfg.ShardMap())
	}
	c.each(func(r Revision) {
		if r.Cfg != nil {
			add(r.Cfg.ShardMap())
		}
	})
	return out
}
