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
	onlyOn(t, "linux", "darwin")
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
	onlyOn(t, "linux", "darwin")
	t.Parallel()
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
	onlyOn(t, "linux", "darwin")
	t.Parallel()
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
	onlyOn(t, "linux", "darwin")
	t.Parallel()
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

// The flush interval of TestCrashCommitChild.
const envCommitFlush = "IDEMRETRY_COMMIT_FLUSH"

// TestCrashCommitChild is the child of TestCrashAckedSurvivesKill; it does
// nothing in a normal run. Six workers reserve actions (in batches that
// grow and shrink, so the reused buffers change size), update them lazily,
// record some done and Sync, forget some; a seventh goroutine compacts now
// and then. The journal compacts often by itself too (a small compactMin).
func TestCrashCommitChild(t *testing.T) {
	onlyOn(t, "linux", "darwin")
	if !childtest.IsChild() {
		t.Skip("child process of TestCrashAckedSurvivesKill")
	}
	dir := os.Getenv(envDir)
	o := testOpts()
	o.compactMin = 4096
	o.flushEvery, _ = time.ParseDuration(os.Getenv(envCommitFlush))
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
func TestCrashAckedSurvivesKill(t *testing.T) {
	onlyOn(t, "linux", "darwin")
	t.Parallel()
	rounds := 16
	if testing.Short() {
		rounds = 6
	}
	for _, flush := range []time.Duration{time.Nanosecond, time.Millisecond, time.Hour} {
		t.Run(flush.String(), func(t *testing.T) {
			dir := t.TempDir()
			o := newOracle()
			for r := range rounds {
				cmd, out := childtest.Start(t, "TestCrashCommitChild", envDir+"="+dir,
					envCommitFlush+"="+flush.String(), fmt.Sprintf("%s=r%d", envTag, r))
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
func TestCrashKillLargeIDs(t *testing.T) {
	onlyOn(t, "linux", "darwin")
	if childtest.IsChild() {
		largeIDsChild()
		return
	}
	t.Parallel()
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
			cmd, ls := spawnLargeIDs(t, dir, fmt.Sprintf("k%s-%d", compactMin[:2], r), compactMin, fp)
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

func spawnLargeIDs(t *testing.T, dir, tag, compactMin, fp string) (*exec.Cmd, *lines) {
	t.Helper()
	return spawnLines(t, "TestCrashKillLargeIDs",
		envDir+"="+dir, envTag+"="+tag, "IDEMRETRY_COMPACTMIN="+compactMin, envFP+"="+fp)
}

// largeIDsChild is the child of TestCrashKillLargeIDs: 4 workers reserve
// records with max-length ids (some custom keys), update them, and forget
// some, saying what was submitted and acknowledged.
func largeIDsChild() {
	o := testOpts()
	o.flushEvery = 2 * time.Millisecond
	var cm int64
	_, _ = fmt.Sscan(os.Getenv("IDEMRETRY_COMPACTMIN"), &cm)
	o.compactMin = cm
	if spec := os.Getenv(envFP); spec != "" {
		// Killed at the n-th hit of a failpoint: in the middle of a
		// batch's write, before its sync, inside a compaction.
		o.hooks = killAtFailpoint(spec)
	}
	c := openChild(os.Getenv(envDir), o)
	tag := os.Getenv(envTag)
	c.work(4, func(w *childWorker, i int) {
		id := craftedID(fmt.Sprintf("%s-%d", tag, w.g), i)
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

// T7/T9, for compaction: at each step, build the directory images a power
// loss could leave (unsynced file data dropped or torn; a rename not yet
// made durable by the directory sync showing the old name or the new one)
// and check that every image recovers every acknowledged record.
func TestCompactionPowerLossImages(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	type image map[string][]byte // file name -> content; absent: no file
	var images []struct {
		name string
		img  image
	}
	add := func(name string, img image) {
		images = append(images, struct {
			name string
			img  image
		}{name, img})
	}
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		return b
	}
	var oldJournal []byte
	armed := false // not for the creation of the journal in Open
	o := testOpts()
	o.hooks = &hooks{failpoint: func(fp string) {
		if !armed {
			return
		}
		switch fp {
		case fpTmpWritten: // tmp not synced: any prefix of it may be there
			oldJournal = read(journalName)
			tmp := read(tmpName)
			for _, n := range []int{0, headerSize - 1, headerSize + 7, len(tmp) / 2, len(tmp) - 1} {
				add(fmt.Sprintf("tmp torn at %d", n), image{journalName: oldJournal, tmpName: tmp[:n]})
			}
			add("tmp lost", image{journalName: oldJournal})
		case fpTmpSynced:
			add("tmp synced", image{journalName: oldJournal, tmpName: read(tmpName)})
		case fpRenamed: // the rename may not be durable yet
			nj := read(journalName)
			add("renamed, old entry", image{journalName: oldJournal, tmpName: nj})
			add("renamed, new entry", image{journalName: nj})
		case fpDirSynced:
			add("dir synced", image{journalName: read(journalName)})
		}
	}}
	s, _ := mustOpen(t, dir, o)
	var acked []journal.Record
	for i := range 30 {
		acked = append(acked, reserve(t, s, entry(fmt.Sprintf("a%02d", i))))
	}
	for i := range 10 {
		require.NoError(t, s.Forget(context.Background(), acked[i].ActionID))
	}
	acked = acked[10:]
	armed = true
	require.NoError(t, s.Compact(context.Background()))
	require.NoError(t, s.Close())
	require.Len(t, images, 10)

	for _, im := range images {
		t.Run(im.name, func(t *testing.T) {
			d := t.TempDir()
			for name, data := range im.img {
				require.NoError(t, os.WriteFile(filepath.Join(d, name), data, 0o600))
			}
			s, rep, err := openWith(d, testOpts())
			require.NoError(t, err)
			defer s.Close()
			assert.Equal(t, len(acked), rep.Records)
			for _, e := range acked {
				got, ok, _ := s.get(e.ActionID)
				if assert.True(t, ok, e.ActionID) {
					assert.Equal(t, e.Key, got.Key)
				}
			}
			_, err = os.Stat(filepath.Join(d, tmpName))
			assert.ErrorIs(t, err, os.ErrNotExist)
		})
	}
}

// T7, for appends: a power loss while a batch is written but not synced
// may leave any prefix of it, or its pages with holes of zeros; recovery
// must keep every acknowledged record and reject nothing.
func TestAppendPowerLossImages(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var synced []byte // the file as of the last sync
	var images [][]byte
	armed := false
	o := testOpts()
	o.hooks = &hooks{failpoint: func(fp string) {
		data, err := os.ReadFile(filepath.Join(dir, journalName))
		if err != nil {
			return
		}
		switch fp {
		case fpAfterSync:
			synced = data
		case fpAfterWrite:
			if !armed || synced == nil {
				return
			}
			un := data[len(synced):]
			for _, n := range []int{1, 15, 16, len(un) / 2, len(un) - 1} {
				images = append(images, append(append([]byte(nil), synced...), un[:n]...))
			}
			holed := append([]byte(nil), data...)
			for i := len(synced) + 4; i < len(synced)+12 && i < len(holed); i++ {
				holed[i] = 0
			}
			images = append(images, holed)
		}
	}}
	s, _ := mustOpen(t, dir, o)
	var acked []journal.Record
	for i := range 5 {
		acked = append(acked, reserve(t, s, entry(fmt.Sprintf("a%d", i))))
	}
	armed = true
	_ = reserve(t, s, entry("in-flight")) // its write is what the images tear
	require.NoError(t, s.Close())
	require.NotEmpty(t, images)
	for i, img := range images {
		d := writeJournal(t, img)
		s, rep, err := openWith(d, testOpts())
		require.NoError(t, err, "image %d", i)
		assert.True(t, rep.TornTail, "image %d", i)
		for _, e := range acked {
			got, ok, _ := s.get(e.ActionID)
			if assert.True(t, ok, "image %d: %s", i, e.ActionID) {
				assert.Equal(t, e.Key, got.Key)
			}
		}
		require.NoError(t, s.Close())
	}
}

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
	t.Parallel()
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

// The clock part of hW2's review of the file journal: processes SIGKILLed
// at random moments while done records expire, on a wall clock that runs
// 100 times fast and is set back and forward across the restarts.

// Environment of TestCrashClockChild.
const (
	envClockBase   = "IDEMRETRY_CLOCK_BASE"   // the real Unix ms the fake clock starts from
	envClockOffset = "IDEMRETRY_CLOCK_OFFSET" // ms added to the fake clock in this run
)

const fastClockSpeed = 100 // fake ms per real ms

// fastClockOpts are the options of the child and of the parent's opens: a
// wall clock without monotonic readings that runs fastClockSpeed times fast from
// base, shifted by offset; a retention of 20 s of it (2 s of grace);
// expiry looked for every millisecond; frequent compactions and flushes.
func fastClockOpts(base, offset int64) config {
	o := crashOpts()
	start := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	o.now = func() time.Time {
		return time.UnixMilli(start + (time.Now().UnixMilli()-base)*fastClockSpeed + offset)
	}
	o.keyWindow, o.grace = 18*time.Second, 2*time.Second
	o.expiryEvery = time.Millisecond
	if err := o.check(); err != nil {
		panic(err)
	}
	return o
}

// TestCrashClockChild is the child of TestCrashKillWithClockJumps; it does
// nothing in a normal run. Four workers cycle six ids each through Reserve
// (ReusePending), a done (synced) and now and then a Forget of another of
// their ids, saying "sub id key", "ack id key", "dsub id" (before the
// done), "synced id key", "fsub id" and "fack id".
func TestCrashClockChild(t *testing.T) {
	onlyOn(t, "linux", "darwin")
	if !childtest.IsChild() {
		t.Skip("child process of TestCrashKillWithClockJumps")
	}
	base, _ := strconv.ParseInt(os.Getenv(envClockBase), 10, 64)
	offset, _ := strconv.ParseInt(os.Getenv(envClockOffset), 10, 64)
	c := openChild(os.Getenv(envDir), fastClockOpts(base, offset))
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

// clockKillID is what the children said of one id, in order.
type clockKillID struct {
	acked      string // the key of the last Reserve that returned
	ackedRun   int    // the run it returned in
	sub        string // the key of a Reserve begun since, not returned
	doneBegun  bool   // a done of acked began: it may expire
	synced     bool   // and was synced
	forgetting bool   // a Forget began since the last ack
	forgotten  bool   // and returned
}

// TestCrashKillWithClockJumps: children working on one journal are SIGKILLed
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
func TestCrashKillWithClockJumps(t *testing.T) {
	onlyOn(t, "linux", "darwin")
	t.Parallel()
	const rounds = 12
	base := time.Now().UnixMilli()
	offsets := []int64{0, -int64(time.Hour / time.Millisecond), int64(365 * 24 * time.Hour / time.Millisecond)}
	rng := rand.New(rand.NewPCG(77, uint64(time.Now().UnixNano())))
	dir := t.TempDir()
	ids := map[string]*clockKillID{}
	var runs []time.Duration // every open journal's span, children's and the parent's
	ret := fastClockOpts(base, 0).retention
	// openSince bounds the fake time that journals were open from run r on
	// (the current parent's open included, as far as elapsed).
	openSince := func(r int, current time.Duration) time.Duration {
		d := current
		for _, x := range runs[r:] {
			d += x
		}
		return d * fastClockSpeed
	}
	offset := int64(0)
	expiredSeen := 0
	for r := range rounds {
		start := time.Now()
		cmd, ls := spawnLines(t, "TestCrashClockChild", envClockBase+"="+strconv.FormatInt(base, 10),
			envClockOffset+"="+strconv.FormatInt(offset, 10), envDir+"="+dir, fmt.Sprintf("%s=c%d", envTag, r))
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
				s = &clockKillID{}
				ids[f[1]] = s
			}
			switch f[0] {
			case "sub":
				s.sub = f[2]
			case "ack":
				*s = clockKillID{acked: f[2], ackedRun: child}
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
		j, _, err := openWith(dir, fastClockOpts(base, offset))
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
		require.NoError(t, checkIndex(j))
		require.NoError(t, j.Close())
		runs = append(runs, time.Since(opened))
		if t.Failed() {
			return
		}
	}
	t.Logf("%d ids, %d found expired", len(ids), expiredSeen)
	require.Positive(t, expiredSeen, "no done record expired: the test did not reach expiry")
}

// The kill test of the review of the performance series (its other tests
// are in store_test.go): a SIGKILLed child, as above.

// churnChildOpts are the options of the churn child and of the journal
// the parent opens after it: hashed ids, small compactions, a fast flush.
func churnChildOpts() config {
	o := crashOpts()
	o.hashed = true
	return o
}

// TestCrashChurnChild is the child of TestCrashKillDuringChurn; it does
// nothing in a normal run. Each worker owns a few ids and cycles each one
// through: Reserve with ReusePending (a new record, or the replacement of
// its done one, with a key that is a canonical UUID, an upper-case UUID or
// a custom string), in-place Updates across varint boundaries, then done,
// synced; now and then it forgets one. It says "sub id key" and "ack id
// key" around each Reserve, "synced id key" after the done's Sync and
// "fsub id" and "fack id" around each Forget.
func TestCrashChurnChild(t *testing.T) {
	onlyOn(t, "linux", "darwin")
	if !childtest.IsChild() {
		t.Skip("child process of TestCrashKillDuringChurn")
	}
	o := churnChildOpts()
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

// churnIDState is what a churn child said of one id, in order.
type churnIDState struct {
	acked      string // the key of the last Reserve that returned
	sub        string // the key of a Reserve begun after it, not returned
	synced     bool   // the done of acked was synced, and nothing began since
	forgetting bool   // a Forget began after the last ack
	forgotten  bool   // and returned
}

// TestCrashKillDuringChurn: a child cycling records through creation,
// in-place updates, a synced done, replacement under ReusePending (custom
// and UUID keys, hashed ids) and Forget, with compactions running, is
// SIGKILLed at random moments and at failpoints. The journal it leaves
// opens; every acknowledged record is there with its key (or the key of a
// replacement begun), its synced done intact; a forgotten one is gone; the
// index keeps its invariants (no stale custom key, live is the records'
// size).
func TestCrashKillDuringChurn(t *testing.T) {
	onlyOn(t, "linux", "darwin")
	t.Parallel()
	const rounds = 16
	fps := []string{fpAfterWrite, fpAfterSync, fpTmpSynced, fpRenamed}
	rng := rand.New(rand.NewPCG(3, uint64(time.Now().UnixNano())))
	var dir string
	var ids map[string]*churnIDState
	for r := range rounds {
		if r%4 == 0 {
			dir = t.TempDir()
			ids = map[string]*churnIDState{}
		}
		fp := ""
		if r%2 == 1 {
			fp = fmt.Sprintf("%s:%d", fps[(r/2)%len(fps)], 1+rng.IntN(3))
		}
		cmd, ls := spawnLines(t, "TestCrashChurnChild", envDir+"="+dir,
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
				s = &churnIDState{}
				ids[f[1]] = s
			}
			switch f[0] {
			case "sub":
				s.sub, s.synced = f[2], false
			case "ack":
				*s = churnIDState{acked: f[2]}
			case "synced":
				s.synced = s.sub == "" && s.acked == f[2]
			case "fsub":
				s.forgetting, s.synced = true, false
			case "fack":
				s.forgotten = true
			}
		}
		j, _, err := openWith(dir, churnChildOpts())
		require.NoError(t, err, "round %d (%s)", r, fp)
		require.NoError(t, checkIndex(j), "round %d (%s)", r, fp)
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
