//go:build linux || darwin

package filejournal

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemretry/idemretry/internal/childtest"
	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/require"
)

// The kill test of the review of the performance series (see
// review_perf_test.go): a SIGKILLed child, as in crash_test.go.

// reviewChildOpts are the options of the churn child and of the journal
// the parent opens after it: hashed ids, small compactions, a fast flush.
func reviewChildOpts() config {
	o := crashOpts()
	o.hashed = true
	return o
}

// TestReviewChurnChild is the child of TestReviewKillDuringChurn; it does
// nothing in a normal run. Each worker owns a few ids and cycles each one
// through: Reserve with ReusePending (a new record, or the replacement of
// its done one, with a key that is a canonical UUID, an upper-case UUID or
// a custom string), in-place Updates across varint boundaries, then done,
// synced; now and then it forgets one. It says "sub id key" and "ack id
// key" around each Reserve, "synced id key" after the done's Sync and
// "fsub id" and "fack id" around each Forget.
func TestReviewChurnChild(t *testing.T) {
	if !childtest.IsChild() {
		t.Skip("child process of TestReviewKillDuringChurn")
	}
	o := reviewChildOpts()
	if spec := os.Getenv(envFP); spec != "" {
		o.hooks = killAtFailpoint(spec)
	}
	c := openChild(os.Getenv(envDir), o)
	tag := os.Getenv(envTag)
	ctx := context.Background()
	c.work(4, func(w *childWorker, i int) {
		id := fmt.Sprintf("%s-%d-%d", tag, w.g, i%5)
		e := entry(id)
		switch i % 3 {
		case 1:
			e.Key = strings.ToUpper(e.Key)
		case 2:
			e.Key = "custom-" + e.Key[:i%20+1]
		}
		c.say("sub %s %s", id, e.Key)
		got, _, err := c.Reserve(ctx, e, journal.ReusePending)
		if err != nil {
			c.fail(err)
		}
		c.say("ack %s %s", id, got.Key)
		for _, a := range []int{1, 128, 16384} {
			got.Attempts = a
			if err := c.Update(ctx, got); err != nil {
				c.fail(err)
			}
		}
		got.State, got.Status, got.Attempts = journal.StateDone, 201, 20001
		if err := c.Update(ctx, got); err != nil {
			c.fail(err)
		}
		if err := c.Sync(ctx); err != nil {
			c.fail(err)
		}
		c.say("synced %s %s", id, got.Key)
		if i%7 == 6 {
			f := fmt.Sprintf("%s-%d-%d", tag, w.g, (i+2)%5)
			c.say("fsub %s", f)
			if err := c.Forget(ctx, f); err != nil {
				c.fail(err)
			}
			c.say("fack %s", f)
		}
	})
}

// reviewIDState is what a churn child said of one id, in order.
type reviewIDState struct {
	acked      string // the key of the last Reserve that returned
	sub        string // the key of a Reserve begun after it, not returned
	synced     bool   // the done of acked was synced, and nothing began since
	forgetting bool   // a Forget began after the last ack
	forgotten  bool   // and returned
}

// TestReviewKillDuringChurn: a child cycling records through creation,
// in-place updates, a synced done, replacement under ReusePending (custom
// and UUID keys, hashed ids) and Forget, with compactions running, is
// SIGKILLed at random moments and at failpoints. The journal it leaves
// opens; every acknowledged record is there with its key (or the key of a
// replacement begun), its synced done intact; a forgotten one is gone; the
// index keeps its invariants (no stale custom key, live is the records'
// size).
func TestReviewKillDuringChurn(t *testing.T) {
	const rounds = 16
	fps := []string{fpAfterWrite, fpAfterSync, fpTmpSynced, fpRenamed}
	rng := rand.New(rand.NewPCG(3, uint64(time.Now().UnixNano())))
	var dir string
	var ids map[string]*reviewIDState
	for r := range rounds {
		if r%4 == 0 {
			dir = t.TempDir()
			ids = map[string]*reviewIDState{}
		}
		fp := ""
		if r%2 == 1 {
			fp = fmt.Sprintf("%s:%d", fps[(r/2)%len(fps)], 1+rng.IntN(3))
		}
		cmd, ls := spawnLines(t, "TestReviewChurnChild", envDir+"="+dir,
			envFP+"="+fp, fmt.Sprintf("%s=r%d", envTag, r))
		if first := ls.waitFirst(t); first != "open" && first != "" {
			ls.killWithin(cmd, 0)
			t.Fatalf("round %d: child: %s", r, first)
		}
		wait := time.Duration(5+rng.IntN(40)) * time.Millisecond
		if fp != "" {
			wait = 500 * time.Millisecond
		}
		ls.killWithin(cmd, wait)
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
			t.Fatalf("round %d (%s): child exited: %v\n%s", r, fp, cmd.ProcessState, strings.Join(ls.all, "\n"))
		}
		for _, l := range ls.all {
			f := strings.Fields(l)
			if f[0] == "error" {
				t.Fatalf("round %d: child: %s", r, l)
			}
			if len(f) < 2 {
				continue
			}
			s := ids[f[1]]
			if s == nil {
				s = &reviewIDState{}
				ids[f[1]] = s
			}
			switch f[0] {
			case "sub":
				s.sub, s.synced = f[2], false
			case "ack":
				*s = reviewIDState{acked: f[2]}
			case "synced":
				s.synced = s.sub == "" && s.acked == f[2]
			case "fsub":
				s.forgetting, s.synced = true, false
			case "fack":
				s.forgotten = true
			}
		}
		j, _, err := openWith(dir, reviewChildOpts())
		require.NoError(t, err, "round %d (%s)", r, fp)
		require.NoError(t, reviewCheckIndex(j), "round %d (%s)", r, fp)
		for id, s := range ids {
			got, found, err := j.get(j.storedID(id))
			require.NoError(t, err)
			switch {
			case !found:
				if s.acked != "" && !s.forgetting {
					t.Errorf("round %d (%s): acknowledged %s (key %s) lost", r, fp, id, s.acked)
				}
			case got.Key == s.sub:
			case got.Key != s.acked || s.forgotten:
				t.Errorf("round %d (%s): %s has key %s; acknowledged %q (forgotten %v), begun %q", r, fp, id, got.Key, s.acked, s.forgotten, s.sub)
			case s.synced && (got.State != journal.StateDone || got.Status != 201 || got.Attempts != 20001):
				t.Errorf("round %d (%s): %s's synced done lost: %v %d %d", r, fp, id, got.State, got.Status, got.Attempts)
			}
		}
		acked, synced := 0, 0
		for _, l := range ls.all {
			acked += strings.Count(l[:min(len(l), 4)], "ack ")
			synced += strings.Count(l[:min(len(l), 7)], "synced ")
		}
		t.Logf("round %d (%s): %d acknowledged Reserves, %d synced dones, %d ids", r, fp, acked, synced, len(ids))
		require.NoError(t, j.Close())
		if t.Failed() {
			return
		}
	}
}
