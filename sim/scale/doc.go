// Package scale simulates Sluice at a scale this machine cannot run
// request by request: millions of keys over many regions, instances and
// global shards, on virtual time at epoch granularity.
//
// Demand is a fluid: per (key, region) a rate that follows a compressed
// day. Keys whose demand never comes near half their static share in any
// region are never marked by the scripts, so they never reach the global
// tier; their data-plane Redis commands are counted analytically from the
// instances' lease traffic (see holders) and they cost nothing
// else. Every other key is modeled where its demand comes near a share:
// one fluid instance per (key, region) spends what it leased and syncs
// once per epoch through luascripts.Model (the scripts' twin: refill,
// caps, demand readings, candidate marks), the region leader reads the
// candidate sets and selects with regionsync.Leader (Select, Report,
// Installs, Round), each global shard runs a real hierarchy.Allocator
// behind regionsync's decoding and encoding, and grants go back through
// Model.SetRate. Report and answer sizes are proto.Size of the messages
// built.
//
// The oracle checks, per modeled key, Σ usable rates ≤ r and Σ caps ≤ b
// every epoch and after every applied grant, and admitted ≤ b + r·t over
// whole epochs; it measures utilization against an ideal central bucket
// on contended keys.
package scale
