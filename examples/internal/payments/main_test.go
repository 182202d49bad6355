package payments

import (
	"testing"

	"go.uber.org/goleak"
)

// Every run must leave nothing behind: no client goroutine, no connection,
// no server handler, no Transport wait.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
