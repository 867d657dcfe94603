package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/pkg/allocator"
	"github.com/sluicehq/sluice/pkg/regional"
)

// shardClients is the region leader's allocator.Client per global-tier
// shard, made at first use from the -global-addr list: "{shard}" in an
// address stands for the shard's number; a list without it serves shard 0
// only.
type shardClients struct {
	addrs []string
	dial  []grpc.DialOption

	mu      sync.Mutex
	clients map[int]*allocator.Client
}

func newShardClients(addrs []string, dial ...grpc.DialOption) *shardClients {
	return &shardClients{addrs: addrs, dial: dial, clients: map[int]*allocator.Client{}}
}

// templated says whether the addresses name their shard.
func (s *shardClients) templated() bool {
	for _, a := range s.addrs {
		if strings.Contains(a, "{shard}") {
			return true
		}
	}
	return false
}

// tier is shard's client (regional.LeaderOptions.Shards).
func (s *shardClients) tier(shard int) (regional.GlobalTier, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.clients[shard]; ok {
		return c, nil
	}
	if shard > 0 && !s.templated() {
		return nil, fmt.Errorf("no address for global shard %d: -global-addr names no {shard}", shard)
	}
	addrs := make([]string, len(s.addrs))
	for i, a := range s.addrs {
		addrs[i] = strings.ReplaceAll(a, "{shard}", strconv.Itoa(shard))
	}
	c, err := allocator.NewClient(addrs, s.dial...)
	if err != nil {
		return nil, err
	}
	s.clients[shard] = c
	return c, nil
}

// Close closes every client made.
func (s *shardClients) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, c := range s.clients {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}
