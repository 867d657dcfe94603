package live

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine the package's tests start ends before the binary exits.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
