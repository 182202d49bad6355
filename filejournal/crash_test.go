//go:build linux || darwin

package filejournal

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Environment of the child process that the crash tests start, beside
// envDir, envFP and envTag: the test binary itself, running TestCrashChild.
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
	mode := os.Getenv(envChild)
	if mode == "" {
		t.Skip("child process of the crash tests")
	}
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

func child(t *testing.T, mode, dir string, env ...string) (*exec.Cmd, *lines) {
	t.Helper()
	return spawnLines(t, "TestCrashChild", append([]string{envChild + "=" + mode, envDir + "=" + dir}, env...)...)
}

// oracle is what the child acknowledged over all rounds.
type oracle struct {
	submitted  map[string]string // id -> key, every Reserve begun
	acked      map[string]string // id -> key, Reserve returned
	forgotting map[string]bool   // Forget begun
	forgotten  map[string]bool   // Forget returned
}

func (o *oracle) apply(t *testing.T, ls []string) {
	for _, l := range ls {
		f := strings.Fields(l)
		switch f[0] {
		case "sub":
			o.submitted[f[1]] = f[2]
		case "ack":
			o.acked[f[1]] = f[2]
		case "fsub":
			o.forgotting[f[1]] = true
		case "fack":
			o.forgotten[f[1]] = true
		case "error":
			t.Errorf("child: %s", l)
		}
	}
}

// check is the journal's oracle: every acknowledged record is there with
// its key; nothing never submitted is; an acknowledged Forget holds.
// It runs on a goroutine of its own, so it reports with t.Errorf.
func (o *oracle) check(t *testing.T, s *Journal, round int) bool {
	t.Helper()
	ok := true
	for id, key := range o.acked {
		got, found, err := s.get(id)
		switch {
		case err != nil:
			t.Errorf("round %d: %v", round, err)
			return false
		case o.forgotten[id]:
			if found {
				t.Errorf("round %d: forgotten %s is back", round, id)
				ok = false
			}
		case !found && !o.forgotting[id]:
			t.Errorf("round %d: acknowledged %s lost", round, id)
			ok = false
		case found && got.Key != key:
			t.Errorf("round %d: acknowledged %s changed key %s -> %s", round, id, key, got.Key)
			ok = false
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.m {
		r := s.recOf(id, ptr(s.m[id]))
		if key, sub := o.submitted[id]; !sub || key != r.record(id).Key {
			t.Errorf("round %d: %s was never submitted (or with another key)", round, id)
			ok = false
		}
	}
	return ok
}

func ptr[T any](v T) *T { return &v }

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
					o = &oracle{submitted: map[string]string{}, acked: map[string]string{},
						forgotting: map[string]bool{}, forgotten: map[string]bool{}}
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
					_ = cmd.Process.Kill()
					<-ls.done
					_ = cmd.Wait()
					t.Errorf("round %d: child: %s", r, first)
					return
				}
				killedByUs := false
				wait := time.Duration(rng.IntN(15000)) * time.Microsecond
				if fp != "" {
					wait = 500 * time.Millisecond // until the failpoint kills it
				}
				exited := make(chan error, 1)
				go func() { <-ls.done; exited <- nil }()
				select {
				case <-exited:
				case <-time.After(wait):
					killedByUs = true
					_ = cmd.Process.Kill()
				}
				<-ls.done // before Wait, which closes the pipe
				_ = cmd.Wait()
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

// TestSyncCrashChild is the child of TestSyncedDoneSurvivesKill; it does
// nothing in a normal run. Four workers each create an action, record it
// done (a lazy Update), Sync, and then say so; the flush interval is an
// hour, so only Sync can have written the done.
func TestSyncCrashChild(t *testing.T) {
	dir := os.Getenv(envDir)
	if dir == "" {
		t.Skip("child process of TestSyncedDoneSurvivesKill")
	}
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
		cmd, out := startChild(t, "TestSyncCrashChild", envDir+"="+dir)
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
