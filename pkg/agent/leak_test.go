package agent_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if kind := os.Getenv(benchServerEnv); kind != "" {
		os.Exit(serveBench(kind, os.Getenv(benchArgEnv)))
	}
	goleak.VerifyTestMain(m)
}
