package main

import (
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func TestShardClientsExpandTheShard(t *testing.T) {
	s := newShardClients([]string{"sluice-global-{shard}:7500"}, grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer s.Close()
	for i := range 3 {
		if _, err := s.tier(i); err != nil {
			t.Fatalf("shard %d: %v", i, err)
		}
	}
	if a, _ := s.tier(0); a == nil {
		t.Fatal("no client for shard 0")
	}
	if len(s.clients) != 3 {
		t.Fatalf("%d clients, want one per shard", len(s.clients))
	}
	plain := newShardClients([]string{"g:7500"}, grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer plain.Close()
	if _, err := plain.tier(0); err != nil {
		t.Fatal(err)
	}
	if _, err := plain.tier(1); err == nil || !strings.Contains(err.Error(), "{shard}") {
		t.Fatalf("shard 1 without a template: %v", err)
	}
}
