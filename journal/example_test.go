package journal_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idemretry/idemretry/journal"
)

// At start-up, list the actions a previous run left unfinished, to resume
// them (same key) or reconcile them with the server.
func ExampleMemory_Unfinished() {
	j := journal.NewMemory()
	ctx := context.Background()
	_, _, _ = j.Reserve(ctx, journal.Record{ActionID: "pay:order-9", Key: "k-9", CreatedAt: time.Now(), State: journal.StatePending, Attempts: 2}, journal.ReuseAny)
	unfinished, _ := j.Unfinished(ctx)
	for _, r := range unfinished {
		fmt.Println(r.ActionID, r.State, "attempts:", r.Attempts)
	}
	// Output:
	// pay:order-9 pending attempts: 2
}
