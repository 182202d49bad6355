package filejournal

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemretry/idemretry/internal/childtest"
	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSyncCrashChild is the child of TestSyncedDoneSurvivesKill; it does
// nothing in a normal run. Four workers each create an action, record it
// done (a lazy Update), Sync, and then say so; the flush interval is an
// hour, so only Sync can have written the done.
func TestSyncCrashChild(t *testing.T) {
	if !childtest.IsChild() {
		t.Skip("child process of TestSyncedDoneSurvivesKill")
	}
	dir := os.Getenv(envDir)
	o := testOpts()
	o.flushEvery = time.Hour
	c := openChild(dir, o)
	ctx := context.Background()
	c.work(4, func(w *childWorker, i int) {
		r, _, err := c.Reserve(ctx, entry(fmt.Sprintf("u-%d-%d", w.g, i)), journal.ReuseAny)
		if err == nil {
			r.State, r.Attempts, r.Status = journal.StateDone, 1, 201
			err = c.Update(ctx, r)
		}
		if err == nil {
			err = c.Sync(ctx)
		}
		if err != nil {
			c.fail(err)
		}
		c.say("synced %s", r.ActionID)
	})
}

// An unnamed action's "done" is synced before RoundTrip returns: a child
// killed with SIGKILL right after Syncs returned must leave every one of
// those dones on disk, with its status.
func TestSyncedDoneSurvivesKill(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	for round := range 5 {
		dir := t.TempDir()
		cmd, out := childtest.Start(t, "TestSyncCrashChild", envDir+"="+dir)
		// Killed right after the last Sync it said returned.
		ls, err := killAfter(cmd, out, 1+20+10*round)
		require.NoError(t, err, "round %d", round)
		require.Equal(t, "open", ls[0], "round %d", round)
		s, _ := mustOpen(t, dir, testOpts())
		for _, l := range ls[1:] {
			f := strings.Fields(l)
			require.Equal(t, "synced", f[0], "round %d: child: %s", round, l)
			got, ok, err := s.get(f[1])
			require.NoError(t, err)
			require.True(t, ok, "round %d: %s lost", round, f[1])
			assert.Equal(t, journal.StateDone, got.State, "round %d: %s's synced done lost", round, f[1])
			assert.Equal(t, 201, got.Status, "round %d: %s", round, f[1])
		}
		require.NoError(t, s.Close())
	}
}
