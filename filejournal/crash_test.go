//go:build linux || darwin

package filejournal

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
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

// Environment of the child process that the crash tests start: the test
// binary itself, running TestCrashChild.
const (
	envChild = "IDEMRETRY_CRASH_CHILD" // mode: work, hold, try
	envDir   = "IDEMRETRY_CRASH_DIR"
	envFP    = "IDEMRETRY_CRASH_FP" // failpoint:n, kill at its n-th hit
	envTag   = "IDEMRETRY_CRASH_TAG"
	envHold  = "IDEMRETRY_CRASH_HOLD" // hold: release after this duration
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
	say := childSay()
	o := crashOpts()
	if spec := os.Getenv(envFP); spec != "" {
		o.hooks = killAtFailpoint(spec)
	}
	s, _, err := openWith(os.Getenv(envDir), o)
	if mode == "try" {
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
	if err != nil {
		say("error %v", err)
		os.Exit(3)
	}
	say("open")
	if mode == "hold" {
		d, _ := time.ParseDuration(os.Getenv(envHold))
		time.Sleep(d)
		_ = s.Close()
		os.Exit(0)
	}
	tag := os.Getenv(envTag)
	ctx := context.Background()
	for g := range 4 {
		go func() {
			var mine []string
			for i := 0; ; i++ {
				e := entry(fmt.Sprintf("%s-%d-%d", tag, g, i))
				if i%7 == 3 {
					e.Key = "custom-" + e.ActionID
				}
				got := childReserve(ctx, s, say, e)
				mine = append(mine, got.ActionID)
				for a := range 3 {
					_ = update(s, got.ActionID, got.Key, journal.StatePending, uint32(a+1), 0)
				}
				if i%5 == 4 {
					childForgetOne(ctx, s, say, mine)
				}
			}
		}()
	}
	select {}
}

// childReserve reserves e in a crash child, saying "sub" before and "ack"
// after; the child exits on an error.
func childReserve(ctx context.Context, s *Journal, say func(string, ...any), e journal.Record) journal.Record {
	say("sub %s %s", e.ActionID, e.Key)
	got, _, err := s.Reserve(ctx, e, journal.ReuseAny)
	if err != nil {
		say("error %v", err)
		os.Exit(4)
	}
	say("ack %s %s", got.ActionID, got.Key)
	return got
}

// childForgetOne forgets one of the ids in mine, at random, in a crash
// child, saying "fsub" before and "fack" after; the child exits on an error.
func childForgetOne(ctx context.Context, s *Journal, say func(string, ...any), mine []string) {
	id := mine[rand.IntN(len(mine))]
	say("fsub %s", id)
	if err := s.Forget(ctx, id); err != nil {
		say("error %v", err)
		os.Exit(4)
	}
	say("fack %s", id)
}

// childSay returns a printf to the child's stdout, one whole line at a
// time, safe for concurrent use.
func childSay() func(format string, args ...any) {
	var mu sync.Mutex
	return func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		_, _ = os.Stdout.WriteString(fmt.Sprintf(format, args...) + "\n")
	}
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
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {}
			}
		}
	}}
}

// startChild starts the test binary running only the test named run, with
// env added to the environment, and returns it with its stdout.
func startChild(t *testing.T, run string, env ...string) (*exec.Cmd, io.ReadCloser) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+run+"$", "-test.count=1")
	// A race-enabled child would sleep a second at exit by default.
	cmd.Env = append(os.Environ(), append([]string{"GORACE=atexit_sleep_ms=0"}, env...)...)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	return cmd, out
}

// spawnLines is startChild with the child's output collected in lines.
func spawnLines(t *testing.T, run string, env ...string) (*exec.Cmd, *lines) {
	t.Helper()
	cmd, out := startChild(t, run, env...)
	l := &lines{done: make(chan struct{}), first: make(chan string, 1)}
	go l.read(out)
	return cmd, l
}

func child(t *testing.T, mode, dir string, env ...string) (*exec.Cmd, *lines) {
	t.Helper()
	return spawnLines(t, "TestCrashChild", append([]string{envChild + "=" + mode, envDir + "=" + dir}, env...)...)
}

// lines collects a child's complete output lines.
type lines struct {
	done  chan struct{}
	first chan string
	all   []string
}

func (l *lines) read(r interface{ Read([]byte) (int, error) }) {
	defer close(l.done)
	br := bufio.NewReader(r)
	for {
		s, err := br.ReadString('\n')
		if err != nil {
			return // a partial last line is dropped: it was never complete
		}
		s = strings.TrimSuffix(s, "\n")
		if len(l.all) == 0 {
			l.first <- s
		}
		l.all = append(l.all, s)
	}
}

// waitFirst returns the child's first line, or "" if it died silently (a
// failpoint can kill it inside Open).
func (l *lines) waitFirst(t *testing.T) string {
	t.Helper()
	select {
	case s := <-l.first:
		return s
	case <-l.done:
		select {
		case s := <-l.first:
			return s
		default:
			return ""
		}
	case <-time.After(30 * time.Second):
		t.Error("child said nothing")
		return ""
	}
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
