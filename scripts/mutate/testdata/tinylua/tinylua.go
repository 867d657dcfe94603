// Package tinylua is the mutation tool's test subject for Lua: a Redis
// script embedded the way pkg/luascripts embeds its scripts.
package tinylua

import (
	"context"
	"embed"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/*.lua
var luaFS embed.FS

var clamp = redis.NewScript(mustRead("clamp.lua"))

func mustRead(name string) string {
	b, err := luaFS.ReadFile("lua/" + name)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// Clamp returns v limited to [lo, hi], computed by Redis.
func Clamp(ctx context.Context, c redis.Scripter, v, lo, hi int64) (int64, error) {
	return clamp.Run(ctx, c, nil, v, lo, hi).Int64()
}
