//go:build linux || darwin

package filejournal

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemretry/idemretry/internal/childtest"
	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/require"
)

// The clock part of hW2's review of the file journal: processes SIGKILLed
// at random moments while done records expire, on a wall clock that runs
// 100 times fast and is set back and forward across the restarts.

// Environment of TestHW2ClockChild.
const (
	envHW2Clock  = "IDEMRETRY_HW2_CLOCK"  // the real Unix ms the fake clock starts from
	envHW2Offset = "IDEMRETRY_HW2_OFFSET" // ms added to the fake clock in this run
)

const hw2Speed = 100 // fake ms per real ms

// hw2ClockOpts are the options of the child and of the parent's opens: a
// wall clock without monotonic readings that runs hw2Speed times fast from
// base, shifted by offset; a retention of 20 s of it (2 s of grace);
// expiry looked for every millisecond; frequent compactions and flushes.
func hw2ClockOpts(base, offset int64) config {
	o := crashOpts()
	start := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	o.now = func() time.Time {
		return time.UnixMilli(start + (time.Now().UnixMilli()-base)*hw2Speed + offset)
	}
	o.keyWindow, o.grace = 18*time.Second, 2*time.Second
	o.expiryEvery = time.Millisecond
	if err := o.check(); err != nil {
		panic(err)
	}
	return o
}

// TestHW2ClockChild is the child of TestHW2KillWithClockJumps; it does
// nothing in a normal run. Four workers cycle six ids each through Reserve
// (ReusePending), a done (synced) and now and then a Forget of another of
// their ids, saying "sub id key", "ack id key", "dsub id" (before the
// done), "synced id key", "fsub id" and "fack id".
func TestHW2ClockChild(t *testing.T) {
	if !childtest.IsChild() {
		t.Skip("child process of TestHW2KillWithClockJumps")
	}
	base, _ := strconv.ParseInt(os.Getenv(envHW2Clock), 10, 64)
	offset, _ := strconv.ParseInt(os.Getenv(envHW2Offset), 10, 64)
	c := openChild(os.Getenv(envDir), hw2ClockOpts(base, offset))
	tag := os.Getenv(envTag)
	ctx := context.Background()
	c.work(4, func(w *childWorker, i int) {
		id := fmt.Sprintf("%s-%d-%d", tag, w.g, i%6)
		e := entry(id)
		c.say("sub %s %s", id, e.Key)
		got, _, err := c.Reserve(ctx, e, journal.ReusePending)
		if err != nil {
			c.fail(err)
		}
		c.say("ack %s %s", id, got.Key)
		c.say("dsub %s", id)
		got.State, got.Status, got.Attempts = journal.StateDone, 201, 1
		if err := c.Update(ctx, got); err != nil {
			c.fail(err)
		}
		if err := c.Sync(ctx); err != nil {
			c.fail(err)
		}
		c.say("synced %s %s", id, got.Key)
		if i%5 == 4 {
			f := fmt.Sprintf("%s-%d-%d", tag, w.g, (i+3)%6)
			c.say("fsub %s", f)
			if err := c.Forget(ctx, f); err != nil {
				c.fail(err)
			}
			c.say("fack %s", f)
		}
	})
}

// hw2ClockID is what the children said of one id, in order.
type hw2ClockID struct {
	acked      string // the key of the last Reserve that returned
	ackedRun   int    // the run it returned in
	sub        string // the key of a Reserve begun since, not returned
	doneBegun  bool   // a done of acked began: it may expire
	synced     bool   // and was synced
	forgetting bool   // a Forget began since the last ack
	forgotten  bool   // and returned
}

// TestHW2KillWithClockJumps: children working on one journal are SIGKILLed
// at random moments, each run with the wall clock set elsewhere: as it was,
// an hour back (by more than the grace: the persisted mark is not
// believed), or a year forward (every record old by the clock). After each
// kill the parent opens the journal (on the next run's clock) and checks
// every id: an acknowledged record is there with its key, its synced done
// done, unless a Forget of it began, or its done began and the time the
// journals were open since its Reserve (an upper bound: whole runs, at the
// fake clock's speed) exceeds the retention, which a clock set forward
// while closed must never shorten; a forgotten record is not back; no key
// that was never submitted.
func TestHW2KillWithClockJumps(t *testing.T) {
	const rounds = 12
	base := time.Now().UnixMilli()
	offsets := []int64{0, -int64(time.Hour / time.Millisecond), int64(365 * 24 * time.Hour / time.Millisecond)}
	rng := rand.New(rand.NewPCG(77, uint64(time.Now().UnixNano())))
	dir := t.TempDir()
	ids := map[string]*hw2ClockID{}
	var runs []time.Duration // every open journal's span, children's and the parent's
	ret := hw2ClockOpts(base, 0).retention
	// openSince bounds the fake time that journals were open from run r on
	// (the current parent's open included, as far as elapsed).
	openSince := func(r int, current time.Duration) time.Duration {
		d := current
		for _, x := range runs[r:] {
			d += x
		}
		return d * hw2Speed
	}
	offset := int64(0)
	expiredSeen := 0
	for r := range rounds {
		start := time.Now()
		cmd, ls := spawnLines(t, "TestHW2ClockChild", envHW2Clock+"="+strconv.FormatInt(base, 10),
			envHW2Offset+"="+strconv.FormatInt(offset, 10), envDir+"="+dir, fmt.Sprintf("%s=c%d", envTag, r))
		if first := ls.waitFirst(t); first != "open" {
			ls.killWithin(cmd, 0)
			t.Fatalf("round %d: child: %q", r, first)
		}
		ls.killWithin(cmd, time.Duration(20+rng.IntN(150))*time.Millisecond)
		runs = append(runs, time.Since(start))
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
			t.Fatalf("round %d: child exited: %v\n%s", r, cmd.ProcessState, strings.Join(ls.all, "\n"))
		}
		child := len(runs) - 1
		for _, l := range ls.all {
			f := strings.Fields(l)
			if f[0] == "error" {
				t.Fatalf("round %d: child: %s", r, l)
			}
			if len(f) < 2 {
				continue // "open"
			}
			s := ids[f[1]]
			if s == nil {
				s = &hw2ClockID{}
				ids[f[1]] = s
			}
			switch f[0] {
			case "sub":
				s.sub = f[2]
			case "ack":
				*s = hw2ClockID{acked: f[2], ackedRun: child}
			case "dsub":
				s.doneBegun = true
			case "synced":
				s.synced = s.sub == "" || s.sub == s.acked
			case "fsub":
				s.forgetting = true
			case "fack":
				s.forgotten = true
			}
			if f[0] == "ack" {
				s.sub = ""
			}
		}

		offset = offsets[(r+1)%len(offsets)]
		opened := time.Now()
		j, _, err := openWith(dir, hw2ClockOpts(base, offset))
		require.NoError(t, err, "round %d", r)
		for id, s := range ids {
			got, found, err := j.Get(context.Background(), id)
			require.NoError(t, err)
			elapsed := time.Since(opened)
			switch {
			case !found && s.forgetting:
			case !found && s.doneBegun && openSince(s.ackedRun, elapsed) > ret:
				expiredSeen++
			case !found && s.acked != "":
				t.Errorf("round %d: %s (key %s, done begun %v, synced %v) lost after %v of open journals, retention %v",
					r, id, s.acked, s.doneBegun, s.synced, openSince(s.ackedRun, elapsed), ret)
			case !found:
			case got.Key == s.sub:
			case got.Key != s.acked:
				t.Errorf("round %d: %s has key %s, acknowledged %q, begun %q", r, id, got.Key, s.acked, s.sub)
			case s.forgotten:
				t.Errorf("round %d: forgotten %s is back", r, id)
			case s.synced && got.State != journal.StateDone:
				t.Errorf("round %d: %s's synced done came back %v", r, id, got.State)
			}
		}
		require.NoError(t, reviewCheckIndex(j))
		require.NoError(t, j.Close())
		runs = append(runs, time.Since(opened))
		if t.Failed() {
			return
		}
	}
	t.Logf("%d ids, %d found expired", len(ids), expiredSeen)
	require.Positive(t, expiredSeen, "no done record expired: the test did not reach expiry")
}
