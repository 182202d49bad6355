package bench

import (
	"context"
	"testing"
)

// Every client delivers the body byte for byte and ends with 201, on a
// healthy server, on one that fails each action's first attempt, and with a
// body too large to buffer cheaply. These are the preconditions of the
// benchmarks: a fast client that sends the wrong bytes measures nothing.
func TestClientsDeliverBodyIntact(t *testing.T) {
	for _, tc := range []struct {
		name  string
		size  int64
		flaky bool
		reqs  int64 // server requests per action
	}{
		{"small", SmallBody, false, 1},
		{"retried", SmallBody, true, 2},
		{"large", LargeBody, false, 1},
		{"large-retried", LargeBody, true, 2},
	} {
		for _, name := range append(Names, KeyedPeerNames...) {
			t.Run(tc.name+"/"+name, func(t *testing.T) {
				actions := 3
				if tc.size == LargeBody {
					actions = 1 // keeps the -race run short
				}
				srv := NewCheckingServer(tc.size, tc.flaky)
				defer srv.Close()
				c := testClient(t, name)
				p := payload(tc.size)
				for i := range actions {
					id := t.Name() + "/" + string(rune('a'+i))
					if err := c.Post(context.Background(), srv.URL, p, id, tc.flaky); err != nil {
						t.Fatal(err)
					}
				}
				if got, want := srv.Requests(), int64(actions)*tc.reqs; got != want {
					t.Errorf("server saw %d requests, want %d", got, want)
				}
				if bad := srv.BadBodies(); bad != 0 {
					t.Errorf("%d bodies arrived damaged", bad)
				}
				if bad := srv.KeyMismatches(); bad != 0 {
					t.Errorf("%d retries changed Idempotency-Key", bad)
				}
				if (c.Keyed || c.HandKey) && srv.Keyed() != srv.Requests() {
					t.Errorf("%d of %d requests carried an Idempotency-Key", srv.Keyed(), srv.Requests())
				}
			})
		}
	}
}

func testClient(t *testing.T, name string) *Client {
	t.Helper()
	c, err := NewClient(name, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
