package main

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// mainEnv makes the test binary run main, so tests can run the command as
// a process without building it.
const mainEnv = "SLUICE_TEST_RUN_REGIONAL_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) == "1" {
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}
