package bench

import (
	"context"
	"fmt"
	"testing"
)

// failsafehttp does not drain or close a response it retries past, so the
// connection under it is neither reused nor freed: every retry dials anew
// and leaves a connection (and two goroutines) behind. The benchmarks add
// the closing listener a careful user would; this test shows why, by
// counting the server's connections, and asserts only that idemretry reuses
// its connection.
func TestConnectionsPerRetry(t *testing.T) {
	const actions = 10
	dials := map[string]int64{}
	for _, name := range append(append([]string{}, Names...), FailsafeNoClose) {
		srv := NewServer(SmallBody, true)
		c := testClient(t, name)
		for i := range actions {
			id := fmt.Sprintf("%s/%d", name, i)
			if err := c.Post(context.Background(), srv.URL, payload(SmallBody), id, true); err != nil {
				t.Fatal(err)
			}
		}
		dials[name] = srv.Conns()
		c.Close()
		srv.CloseClientConnections()
		srv.Close()
		t.Logf("%-18s %2d connections for %d actions of 2 attempts", name, dials[name], actions)
	}
	for _, name := range []string{IdemMemory, IdemFile} {
		if dials[name] > 1 {
			t.Errorf("%s dialed %d connections for %d sequential actions, want 1", name, dials[name], actions)
		}
	}
}
