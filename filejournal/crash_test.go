//go:build linux || darwin

package filejournal

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemretry/idemretry/internal/childtest"
	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The crash tests: child processes killed with SIGKILL (at random
// moments, at the failpoints of the write and compaction paths, right after
// an acknowledgement) must leave a journal that opens and holds everything
// they were told was durable; and the lock excludes across processes. How a
// child is started, killed and checked is in children_test.go.

// Environment of TestCrashChild, beside envDir, envFP and envTag.
const (
	envChild = "IDEMRETRY_CRASH_CHILD" // mode: work, hold, try
	envHold  = "IDEMRETRY_CRASH_HOLD"  // hold: release after this duration
	// IDEMRETRY_CRASH_ROUNDS sets the kill -9 rounds of TestKillLoop.
	envRounds = "IDEMRETRY_CRASH_ROUNDS"
)

var failpoints = []string{fpBeforeWrite, fpAfterWrite, fpAfterSync, fpTmpWritten, fpTmpSynced, fpRenamed, fpDirSynced}

func crashOpts() config {
	o := testOpts()
	o.compactMin = 2048 // compact often
	o.flushEvery = 2 * time.Millisecond
	return o
}

// TestCrashChild is the child's body; it does nothing in a normal run.
func TestCrashChild(t *testing.T) {
	if !childtest.IsChild() {
		t.Skip("child process of the crash tests")
	}
	mode := os.Getenv(envChild)
	o := crashOpts()
	if spec := os.Getenv(envFP); spec != "" {
		o.hooks = killAtFailpoint(spec)
	}
	if mode == "try" {
		say := childSay()
		s, _, err := openWith(os.Getenv(envDir), o)
		switch {
		case errors.Is(err, ErrLocked):
			say("locked")
		case err != nil:
			say("error %v", err)
		default:
			say("opened")
			_ = s.Close()
		}
		os.Exit(0)
	}
	c := openChild(os.Getenv(envDir), o)
	if mode == "hold" {
		d, _ := time.ParseDuration(os.Getenv(envHold))
		time.Sleep(d)
		_ = c.Close()
		os.Exit(0)
	}
	tag := os.Getenv(envTag)
	c.work(4, func(w *childWorker, i int) {
		e := entry(fmt.Sprintf("%s-%d-%d", tag, w.g, i))
		if i%7 == 3 {
			e.Key = "custom-" + e.ActionID
		}
		got := w.reserve(e)
		for a := range 3 {
			_ = update(c.Journal, got.ActionID, got.Key, journal.StatePending, uint32(a+1), 0)
		}
		if i%5 == 4 {
			w.forgetOne()
		}
	})
}

// killAtFailpoint returns hooks that SIGKILL the process at the n-th hit of
// failpoint name, spec being "name:n".
func killAtFailpoint(spec string) *hooks {
	name, n, _ := strings.Cut(spec, ":")
	left, _ := strconv.Atoi(n)
	var mu sync.Mutex
	return &hooks{failpoint: func(fp string) {
		mu.Lock()
		defer mu.Unlock()
		if fp == name {
			if left--; left == 0 {
				if p, err := os.FindProcess(os.Getpid()); err == nil {
					_ = p.Kill() // SIGKILL, where there are signals
				}
				select {}
			}
		}
	}}
}

func child(t *testing.T, mode, dir string, env ...string) (*exec.Cmd, *lines) {
	t.Helper()
	return spawnLines(t, "TestCrashChild", append([]string{envChild + "=" + mode, envDir + "=" + dir}, env...)...)
}

// T6 and T8: a child creates, updates and forgets actions and is killed with
// SIGKILL at random moments and at each failpoint of the write and
// compaction paths; the journal must then open and satisfy the oracle.
func TestKillLoop(t *testing.T) {
	rounds := 200
	if n, err := strconv.Atoi(os.Getenv(envRounds)); err == nil {
		rounds = n
	}
	if testing.Short() {
		rounds = 20
	}
	const chains, roundsPerDir = 4, 25
	var fpKills, randomKills, torn sync.Map
	var wg sync.WaitGroup
	for c := range chains {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var dir string
			var o *oracle
			rng := rand.New(rand.NewPCG(uint64(c), uint64(time.Now().UnixNano())))
			for r := c; r < rounds; r += chains {
				if t.Failed() {
					return
				}
				// A fresh journal every few rounds keeps a long run's
				// journals (and its rounds) small.
				if (r/chains)%roundsPerDir == 0 {
					dir = t.TempDir()
					o = newOracle()
				}
				fp := ""
				if r%2 == 1 {
					name := failpoints[(r/2)%len(failpoints)]
					n := 1 + rng.IntN(4)
					if strings.HasPrefix(name, "compact") {
						n = 1 + rng.IntN(2)
					}
					fp = fmt.Sprintf("%s:%d", name, n)
				}
				cmd, ls := child(t, "work", dir, envFP+"="+fp, fmt.Sprintf("%s=r%d", envTag, r))
				if first := ls.waitFirst(t); first != "open" && first != "" {
					ls.killWithin(cmd, 0)
					t.Errorf("round %d: child: %s", r, first)
					return
				}
				wait := time.Duration(rng.IntN(15000)) * time.Microsecond
				if fp != "" {
					wait = 500 * time.Millisecond // until the failpoint kills it
				}
				killedByUs := !ls.killWithin(cmd, wait)
				if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
					t.Errorf("round %d (%s): child exited: %v\n%s", r, fp, cmd.ProcessState, strings.Join(ls.all, "\n"))
					return
				}
				if killedByUs {
					randomKills.Store(r, fp)
				} else {
					fpKills.Store(r, fp)
				}
				o.apply(t, ls.all)
				s, rep, err := openWith(dir, testOpts())
				if !assert.NoError(t, err, "round %d (%s)", r, fp) {
					return
				}
				if rep.TornTail {
					torn.Store(r, true)
				}
				good := o.check(t, s, r)
				if !assert.NoError(t, s.Close()) || !good {
					return
				}
			}
		}()
	}
	wg.Wait()
	count := func(m *sync.Map) (n int) {
		m.Range(func(any, any) bool { n++; return true })
		return
	}
	t.Logf("%d rounds: %d killed at failpoints, %d killed by the parent, %d torn tails", rounds, count(&fpKills), count(&randomKills), count(&torn))
	perFP := map[string]int{}
	fpKills.Range(func(_, v any) bool { n, _, _ := strings.Cut(v.(string), ":"); perFP[n]++; return true })
	t.Logf("failpoint kills: %v", perFP)
}

// T10: a second process is refused at once, or after waiting; a killed
// holder releases the lock; the lock still excludes after a compaction.
func TestLockAcrossProcesses(t *testing.T) {
	dir := t.TempDir()
	cmd, ls := child(t, "hold", dir, envHold+"=1m")
	require.Equal(t, "open", ls.waitFirst(t))
	requireLocked(t, dir, 100*time.Millisecond)

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	s, _ := mustOpen(t, dir, testOpts())
	reserve(t, s, entry("a"))
	require.NoError(t, s.Compact(context.Background()))
	cmd, ls = child(t, "try", dir)
	assert.Equal(t, "locked", ls.waitFirst(t), "lock lost after compaction")
	_ = cmd.Wait()
	require.NoError(t, s.Close())
	cmd, ls = child(t, "try", dir)
	assert.Equal(t, "opened", ls.waitFirst(t))
	_ = cmd.Wait()
}

func TestLockWaitForRelease(t *testing.T) {
	dir := t.TempDir()
	cmd, ls := child(t, "hold", dir, envHold+"=200ms")
	require.Equal(t, "open", ls.waitFirst(t))
	o := testOpts()
	o.lockWait = 20 * time.Second
	s, _, err := openWith(dir, o)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	_ = cmd.Wait()
}

// The flush interval of TestReviewCommitChild.
const envReviewFlush = "IDEMRETRY_REVIEW_COMMIT_FLUSH"

// TestReviewCommitChild is the child of TestReviewAckedSurvivesKill; it does
// nothing in a normal run. Six workers reserve actions (in batches that
// grow and shrink, so the reused buffers change size), update them lazily,
// record some done and Sync, forget some; a seventh goroutine compacts now
// and then. The journal compacts often by itself too (a small compactMin).
func TestReviewCommitChild(t *testing.T) {
	if !childtest.IsChild() {
		t.Skip("child process of TestReviewAckedSurvivesKill")
	}
	dir := os.Getenv(envDir)
	o := testOpts()
	o.compactMin = 4096
	o.flushEvery, _ = time.ParseDuration(os.Getenv(envReviewFlush))
	c := openChild(dir, o)
	tag := os.Getenv(envTag)
	ctx := context.Background()
	go func() {
		for {
			time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
			if err := c.Compact(ctx); err != nil {
				c.fail(err)
			}
		}
	}()
	c.work(6, func(w *childWorker, i int) {
		e := entry(fmt.Sprintf("%s-%d-%d", tag, w.g, i))
		if i%11 == 5 {
			e.Key = "custom-" + e.ActionID
		}
		got := w.reserve(e)
		got.Attempts = 1
		if err := c.Update(ctx, got); err != nil { // lazy
			c.fail(err)
		}
		if i%3 != 1 {
			got.State, got.Attempts, got.Status = journal.StateDone, 2, 200+w.g
			if err := c.Update(ctx, got); err != nil {
				c.fail(err)
			}
			if err := c.Sync(ctx); err != nil {
				c.fail(err)
			}
			c.say("synced %s %d %d", got.ActionID, got.Status, got.Attempts)
		}
		if i%7 == 6 {
			w.forgetOne()
		}
	})
}

// Guarantees 1, 6 and 8 under SIGKILL: a child is killed at a random moment
// while it reserves, updates, syncs, forgets and compacts; every Reserve
// and every Sync it acknowledged must be on disk, byte for byte, whatever
// the flush interval (a nanosecond: the timer fires while the committer is
// mid-batch all the time; an hour: only Reserve, Sync, Forget, Compact and
// Close write).
func TestReviewAckedSurvivesKill(t *testing.T) {
	rounds := 16
	if testing.Short() {
		rounds = 6
	}
	for _, flush := range []time.Duration{time.Nanosecond, time.Millisecond, time.Hour} {
		t.Run(flush.String(), func(t *testing.T) {
			dir := t.TempDir()
			o := newOracle()
			for r := range rounds {
				cmd, out := childtest.Start(t, "TestReviewCommitChild", envDir+"="+dir,
					envReviewFlush+"="+flush.String(), fmt.Sprintf("%s=r%d", envTag, r))
				// Killed right after its last acknowledgement was read.
				ls, err := killAfter(cmd, out, 50+rand.IntN(400))
				require.NoError(t, err, "round %d", r)
				require.Equal(t, "open", ls[0], "round %d", r)
				o.apply(t, ls[1:])
				s, _ := mustOpen(t, dir, testOpts())
				o.check(t, s, r)
				require.NoError(t, s.Close())
				if t.Failed() {
					return
				}
			}
			t.Logf("%d acknowledged, %d synced dones", len(o.acked), len(o.synced))
		})
	}
}

// SIGKILL: a child creating records with max-length ids (frames of every
// size, the file growing past several windows, no compaction to keep it
// small, or compaction often) is killed at random moments; every journal it
// leaves opens, holds every acknowledged record with its key, and no
// record never submitted.
func TestReviewKillLargeIDs(t *testing.T) {
	if childtest.IsChild() {
		reviewChild()
		return
	}
	rounds := 8
	if testing.Short() {
		rounds = 3
	}
	for _, compactMin := range []string{"1099511627776", "65536"} {
		dir := t.TempDir()
		o := newOracle()
		rng := rand.New(rand.NewPCG(uint64(len(compactMin)), 9))
		for r := range rounds {
			fp := ""
			if r%2 == 1 { // else killed at a random moment
				fp = fmt.Sprintf("%s:%d", failpoints[(r/2+len(compactMin))%len(failpoints)], 20+rng.IntN(200))
			}
			cmd, ls := reviewSpawn(t, dir, fmt.Sprintf("k%s-%d", compactMin[:2], r), compactMin, fp)
			first := ls.waitFirst(t)
			require.Equal(t, "open", first)
			atFailpoint := ls.killWithin(cmd, time.Duration(100+rng.IntN(400))*time.Millisecond)
			o.apply(t, ls.all)
			// Only a child that died at its own after-write failpoint left an
			// unsynced last frame; one the timeout killed first may have
			// synced (and acknowledged) it, and a cut there would be a loss
			// no crash can cause.
			if atFailpoint && strings.HasPrefix(fp, fpAfterWrite+":") {
				// Killed between a frame's write and its sync: a power
				// loss then could keep any prefix of that frame.
				path := filepath.Join(dir, journalName)
				data, err := os.ReadFile(path)
				require.NoError(t, err)
				offs := frameOffsets(t, data)
				last := offs[len(offs)-1]
				if len(data)-last > 1 {
					require.NoError(t, os.Truncate(path, int64(last+1+rng.IntN(len(data)-last-1))))
				}
			}
			s, rep, err := openWith(dir, testOpts())
			require.NoError(t, err, "round %d", r)
			t.Logf("round %d (%s): %d records, torn %v (%d bytes), adopted tmp %v, %d lines", r, fp, rep.Records, rep.TornTail, rep.TornBytes, rep.AdoptedTemp, len(ls.all))
			ok := o.check(t, s, r)
			require.NoError(t, s.Close())
			require.True(t, ok)
		}
		fi, err := os.Stat(filepath.Join(dir, journalName))
		require.NoError(t, err)
		t.Logf("compactMin %s: journal %d bytes", compactMin, fi.Size())
	}
}

func reviewSpawn(t *testing.T, dir, tag, compactMin, fp string) (*exec.Cmd, *lines) {
	t.Helper()
	return spawnLines(t, "TestReviewKillLargeIDs",
		envDir+"="+dir, envTag+"="+tag, "IDEMRETRY_REVIEW_COMPACTMIN="+compactMin, envFP+"="+fp)
}

// reviewChild is the child of TestReviewKillLargeIDs: 4 workers reserve
// records with max-length ids (some custom keys), update them, and forget
// some, saying what was submitted and acknowledged.
func reviewChild() {
	o := testOpts()
	o.flushEvery = 2 * time.Millisecond
	var cm int64
	_, _ = fmt.Sscan(os.Getenv("IDEMRETRY_REVIEW_COMPACTMIN"), &cm)
	o.compactMin = cm
	if spec := os.Getenv(envFP); spec != "" {
		// Killed at the n-th hit of a failpoint: in the middle of a
		// batch's write, before its sync, inside a compaction.
		o.hooks = killAtFailpoint(spec)
	}
	c := openChild(os.Getenv(envDir), o)
	tag := os.Getenv(envTag)
	c.work(4, func(w *childWorker, i int) {
		id := reviewID(fmt.Sprintf("%s-%d", tag, w.g), i)
		e := entry(id)
		if i%7 == 3 {
			e.Key = fmt.Sprintf("custom-%s-%d-%d", tag, w.g, i)
		}
		got := w.reserve(e)
		_ = update(c.Journal, id, got.Key, journal.StatePending, 2, 0)
		if i%5 == 4 {
			w.forgetOne()
		}
	})
}
