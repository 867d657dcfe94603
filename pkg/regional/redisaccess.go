package regional

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/pkg/luascripts"
)

// A Redis user short of one command the scripts call fails only when a
// script reaches that call (Redis checks a script's commands as it runs
// them, NOPERM), so a PING answers, the sentinel script runs, and every
// caller degrades. The access probe calls every command the scripts and
// the replica's own reads use, on keys of its own under the key prefix,
// inside one script: at start a refusal fails the start naming the
// command, and while running it keeps readiness honest.

// probeScript runs probeSource.
var probeScript = redis.NewScript(probeSource)

// probeSource calls each Redis command the Lua scripts of pkg/luascripts
// call (a test holds the list to theirs) and those the replica and the
// region leader send themselves (ZREMRANGEBYSCORE trims the candidate
// sets), on three keys of its own that share one hash tag, and returns
// every refusal as "'command': error". Each write is undone by a later call
// of the probe (HDEL, ZREM, DEL), and the string expires by itself, so a
// user refused one command leaves nothing behind either; no other client
// sees the keys meanwhile (a script is atomic).
const probeSource = `
local s, h, z = KEYS[1], KEYS[2], KEYS[3]
local refused = {}
local function try(...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then
    refused[#refused + 1] = "'" .. string.lower((...)) .. "': " .. r.err
  end
end
try('TIME')
try('GET', s)
try('SET', s, '1', 'PX', '1000')
try('HSET', h, 'p', '1')
try('HGET', h, 'p')
try('HMGET', h, 'p')
try('HGETALL', h)
try('HLEN', h)
try('PEXPIRE', h, 1000)
try('HDEL', h, 'p')
try('ZADD', z, 0, 'p')
try('ZCARD', z)
try('ZRANGEBYSCORE', z, '-inf', '+inf')
try('ZREMRANGEBYSCORE', z, '-inf', '(0')
try('ZREM', z, 'p')
try('DEL', s, h, z)
return refused
`

// probeKeys are the probe's keys in the hash slot of tag's braces (a
// born sentinel's: every slot has one, so every cluster node can be probed
// on a slot it serves).
func probeKeys(sentinel string) []string {
	return []string{sentinel + ":probe-s", sentinel + ":probe-h", sentinel + ":probe-z"}
}

// ProbeAccess runs the access probe with c's credentials: on a single
// Redis once, on a Redis Cluster once per master (each node has its own
// ACL), on a slot that master serves. The error names what Redis refused
// (ExplainRedisErr's words).
func ProbeAccess(ctx context.Context, c redis.UniversalClient, prefix string) error {
	if prefix == "" {
		prefix = luascripts.DefaultPrefix
	}
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		return probeOn(ctx, c, probeKeys(prefix+"born"))
	}
	slots, err := cc.ClusterSlots(ctx).Result()
	if err != nil {
		return ExplainRedisErr(fmt.Errorf("read cluster slots: %w", err))
	}
	for _, s := range slots {
		if err := probeOn(ctx, cc, probeKeys(luascripts.BornKey(prefix, int(s.Start)))); err != nil {
			node := ""
			if len(s.Nodes) > 0 {
				node = s.Nodes[0].Addr
			}
			return fmt.Errorf("redis node %s: %w", node, err)
		}
	}
	return nil
}

func probeOn(ctx context.Context, c redis.Scripter, keys []string) error {
	refused, err := probeScript.Run(ctx, c, keys).StringSlice()
	if err != nil {
		return ExplainRedisErr(err)
	}
	if len(refused) == 0 {
		return nil
	}
	err = fmt.Errorf("redis refused %s", strings.Join(refused, "; "))
	if e := ExplainRedisErr(err); errors.Is(e, ErrRedisRefused) {
		return e
	}
	// Not a permission (a Redis out of memory refuses the writes): the
	// scripts may run once it passes.
	return err
}

// ErrRedisRefused matches errors of a Redis that refused the credentials
// (WRONGPASS, NOAUTH) or a command or key to the user (NOPERM): a
// deployment mistake no retry fixes, unlike an outage.
var ErrRedisRefused = errors.New("redis refused access")

// refusedError is a Redis refusal with what it means.
type refusedError struct {
	what string
	err  error
}

func (e *refusedError) Error() string { return e.what + ": " + e.err.Error() }
func (e *refusedError) Unwrap() error { return e.err }
func (e *refusedError) Is(target error) bool {
	return target == ErrRedisRefused
}

// ExplainRedisErr says what a refusal from Redis means, in words that
// point at the fix; any other error (nil too) is returned as it is.
// Matching is on Redis's own error codes.
func ExplainRedisErr(err error) error {
	if err == nil || errors.Is(err, ErrRedisRefused) {
		return err
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "WRONGPASS"), strings.Contains(msg, "NOAUTH"),
		strings.Contains(msg, "invalid password"), strings.Contains(msg, "invalid username-password"):
		return &refusedError{what: "redis refused the credentials (check the username and password: -redis-username, -redis-password)", err: err}
	case strings.Contains(msg, "NOPERM"), strings.Contains(msg, "can't run this command"),
		strings.Contains(msg, "can't access at least one of the keys"):
		return &refusedError{what: "the redis user lacks a permission the scripts need (grant the commands and keys of docs/operations.md's ACL recipe)", err: err}
	}
	return err
}
