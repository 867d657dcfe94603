package configstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluicehq/sluice/pkg/config"
)

// ErrConflict is wrapped by Store.Apply when the config in etcd is not at
// the expected revision: someone else changed it since it was read.
var ErrConflict = errors.New("config changed concurrently")

// Store keeps the config in etcd as one key, <prefix>/config, holding the
// YAML document. Leader election keys live beside it under
// <prefix>/election/. Safe for concurrent use.
type Store struct {
	cli    *clientv3.Client
	prefix string
	key    string
}

// NewStore uses cli under prefix ("" means DefaultPrefix; a trailing slash
// is ignored).
func NewStore(cli *clientv3.Client, prefix string) *Store {
	prefix = strings.TrimRight(prefix, "/")
	if prefix == "" {
		prefix = config.DefaultPrefix
	}
	return &Store{cli: cli, prefix: prefix, key: prefix + "/config"}
}

// Key is the etcd key holding the config.
func (s *Store) Key() string { return s.key }

// Prefix is the etcd key prefix, without a trailing slash.
func (s *Store) Prefix() string { return s.prefix }

// ElectionPrefix is where leader election keys live.
func (s *Store) ElectionPrefix() string { return s.prefix + "/election/" }

// Get reads the config and its mod revision. An absent key is (nil, 0,
// nil). Content that fails Parse is an error wrapping ErrInvalidConfig,
// returned with its revision so it can be overwritten with Apply.
func (s *Store) Get(ctx context.Context) (*config.Config, int64, error) {
	resp, err := s.cli.Get(ctx, s.key)
	if err != nil {
		return nil, 0, fmt.Errorf("config: read %s: %w", s.key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, nil
	}
	kv := resp.Kvs[0]
	c, err := config.Parse(kv.Value)
	if err != nil {
		return nil, kv.ModRevision, fmt.Errorf("config: %s at revision %d: %w", s.key, kv.ModRevision, err)
	}
	return c, kv.ModRevision, nil
}

// Apply validates cfg and, only if it is valid, writes its YAML rendering
// in one transaction that succeeds only if the key's mod revision is still
// expectRev (0: the key must not exist). It returns the new revision. A lost
// race is an error wrapping ErrConflict; an invalid config wraps
// ErrInvalidConfig. Neither writes anything.
func (s *Store) Apply(ctx context.Context, cfg *config.Config, expectRev int64) (int64, error) {
	if expectRev < 0 {
		return 0, fmt.Errorf("config: expected revision %d is negative", expectRev)
	}
	if cfg == nil {
		return 0, fmt.Errorf("%w: no config given", config.ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return 0, err
	}
	data, err := cfg.Marshal()
	if err != nil {
		return 0, err
	}
	// What is stored is what watchers will parse: check it parses too.
	if _, err := config.Parse(data); err != nil {
		return 0, fmt.Errorf("config: rendering does not parse back: %w", err)
	}
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(s.key), "=", expectRev)).
		Then(clientv3.OpPut(s.key, string(data))).
		Else(clientv3.OpGet(s.key, clientv3.WithKeysOnly())).
		Commit()
	if err != nil {
		return 0, fmt.Errorf("config: write %s: %w", s.key, err)
	}
	if !resp.Succeeded {
		var current int64
		if rr := resp.Responses[0].GetResponseRange(); rr != nil && len(rr.Kvs) > 0 {
			current = rr.Kvs[0].ModRevision
		}
		return 0, fmt.Errorf("%w: %s is at revision %d, expected %d; read it again and retry",
			ErrConflict, s.key, current, expectRev)
	}
	return resp.Header.Revision, nil
}
