package filejournal

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemretry/idemretry/internal/childtest"
	"github.com/idemretry/idemretry/journal"
)

// The kill tests' child processes. A child is the test binary itself,
// started by childtest.Start to run one test alone (a Test...Child
// function, or a test that is its own child); it opens a journal and works on it, saying on its stdout,
// one whole line at a time, what it began and what returned. The parent
// SIGKILLs it (at a random moment, after it said enough, or through a
// failpoint), then opens the journal it left and checks it against what
// the child said.

// Environment of a child.
const (
	envDir = "IDEMRETRY_CRASH_DIR" // the journal's directory
	envFP  = "IDEMRETRY_CRASH_FP"  // failpoint:n, kill at its n-th hit
	envTag = "IDEMRETRY_CRASH_TAG" // tells this child's ids from earlier ones'
)

// spawnLines is childtest.Start with the child's output collected in
// lines.
func spawnLines(t *testing.T, run string, env ...string) (*exec.Cmd, *lines) {
	t.Helper()
	cmd, out := childtest.Start(t, run, env...)
	l := &lines{done: make(chan struct{}), first: make(chan string, 1)}
	go l.read(out)
	return cmd, l
}

// lines collects a child's complete output lines.
type lines struct {
	done  chan struct{}
	first chan string
	all   []string
}

func (l *lines) read(r io.Reader) {
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

// killWithin waits at most wait for the child cmd to die by itself (at its
// failpoint), SIGKILLs it if it has not, and waits for the end of its
// output, then for it; it says whether the child died by itself.
func (l *lines) killWithin(cmd *exec.Cmd, wait time.Duration) (byItself bool) {
	select {
	case <-l.done:
		byItself = true
	case <-time.After(wait):
		_ = cmd.Process.Signal(syscall.SIGKILL)
	}
	<-l.done // before Wait, which closes the pipe
	_ = cmd.Wait()
	return byItself
}

// killAfter reads the output of the child cmd until it has said n lines,
// SIGKILLs it right after the n-th, and returns every complete line it
// wrote before it died (those after the n-th count too). A child that ends
// before its n-th line is an error, which holds what it said.
func killAfter(cmd *exec.Cmd, out io.Reader, n int) ([]string, error) {
	var ls []string
	br := bufio.NewReader(out)
	for len(ls) < n {
		l, err := br.ReadString('\n')
		if err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return ls, fmt.Errorf("child ended after %d of %d lines: %w\n%s", len(ls), n, err, strings.Join(ls, "\n"))
		}
		ls = append(ls, strings.TrimSuffix(l, "\n"))
	}
	killErr := cmd.Process.Signal(syscall.SIGKILL)
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			break // a partial last line is dropped: it was never complete
		}
		ls = append(ls, strings.TrimSuffix(l, "\n"))
	}
	_ = cmd.Wait()
	return ls, killErr
}

// killAt reads the output of the child cmd until it says the line stop,
// SIGKILLs it then, and returns every complete line it wrote before it
// died. A child that ends before it says stop is an error, which holds
// what it said.
func killAt(cmd *exec.Cmd, out io.Reader, stop string) ([]string, error) {
	var ls []string
	br := bufio.NewReader(out)
	for len(ls) == 0 || ls[len(ls)-1] != stop {
		l, err := br.ReadString('\n')
		if err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return ls, fmt.Errorf("child ended before it said %q: %w\n%s", stop, err, strings.Join(ls, "\n"))
		}
		ls = append(ls, strings.TrimSuffix(l, "\n"))
	}
	killErr := cmd.Process.Signal(syscall.SIGKILL)
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			break
		}
		ls = append(ls, strings.TrimSuffix(l, "\n"))
	}
	_ = cmd.Wait()
	return ls, killErr
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

// childJournal is the journal a child works on, and its say.
type childJournal struct {
	*Journal
	say func(format string, args ...any)
}

// openChild opens the journal in dir with o, in a child, and says "open";
// on an error it says so and exits with 3.
func openChild(dir string, o config) *childJournal {
	say := childSay()
	s, _, err := openWith(dir, o)
	if err != nil {
		say("error %v", err)
		os.Exit(3)
	}
	say("open")
	return &childJournal{s, say}
}

// fail says err and exits with 4.
func (c *childJournal) fail(err error) {
	c.say("error %v", err)
	os.Exit(4)
}

// work runs n workers until the child is killed (it never returns): worker
// g calls step(w, i) for i = 0, 1, 2, ..., w being g's own.
func (c *childJournal) work(n int, step func(w *childWorker, i int)) {
	for g := range n {
		go func() {
			w := &childWorker{childJournal: c, g: g}
			for i := 0; ; i++ {
				step(w, i)
			}
		}()
	}
	select {}
}

// childWorker is one of a child's workers: its number, and the ids it
// reserved.
type childWorker struct {
	*childJournal
	g    int
	mine []string
}

// reserve reserves e, saying "sub" before and "ack" after; the child exits
// on an error.
func (w *childWorker) reserve(e journal.Record) journal.Record {
	w.say("sub %s %s", e.ActionID, e.Key)
	got, _, err := w.Reserve(context.Background(), e, journal.ReuseAny)
	if err != nil {
		w.fail(err)
	}
	w.say("ack %s %s", got.ActionID, got.Key)
	w.mine = append(w.mine, got.ActionID)
	return got
}

// forgetOne forgets one of the ids the worker reserved, at random, saying
// "fsub" before and "fack" after; the child exits on an error.
func (w *childWorker) forgetOne() {
	id := w.mine[rand.IntN(len(w.mine))]
	w.say("fsub %s", id)
	if err := w.Forget(context.Background(), id); err != nil {
		w.fail(err)
	}
	w.say("fack %s", id)
}

// oracle is what a child said over all the rounds of a kill test.
type oracle struct {
	submitted  map[string]string     // id -> key, every Reserve begun
	acked      map[string]string     // id -> key, Reserve returned
	synced     map[string]syncedDone // id -> its done, Sync returned
	forgotting map[string]bool       // Forget begun
	forgotten  map[string]bool       // Forget returned
}

// syncedDone is the status and attempts of a done the child synced.
type syncedDone struct{ status, attempts int }

func newOracle() *oracle {
	return &oracle{submitted: map[string]string{}, acked: map[string]string{}, synced: map[string]syncedDone{},
		forgotting: map[string]bool{}, forgotten: map[string]bool{}}
}

// apply adds the lines a child said: "sub id key", "ack id key", "synced
// id status attempts", "fsub id", "fack id"; "error ..." fails the test.
func (o *oracle) apply(t *testing.T, ls []string) {
	for _, l := range ls {
		f := strings.Fields(l)
		switch f[0] {
		case "sub":
			o.submitted[f[1]] = f[2]
		case "ack":
			o.acked[f[1]] = f[2]
		case "synced":
			var d syncedDone
			if _, err := fmt.Sscan(f[2]+" "+f[3], &d.status, &d.attempts); err != nil {
				t.Errorf("child: %s: %v", l, err)
			}
			o.synced[f[1]] = d
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
// its key and its fingerprint (the bytes a reused buffer could overwrite)
// unless a Forget of it began, and every synced done is done, with its
// status and attempts; an acknowledged Forget holds; nothing never
// submitted is there. It may run on a goroutine of its own, so it reports
// with t.Errorf.
func (o *oracle) check(t *testing.T, s *Journal, round int) bool {
	t.Helper()
	ok := true
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf("round %d: "+format, append([]any{round}, args...)...)
		ok = false
	}
	for id, key := range o.acked {
		got, found, err := s.get(id)
		switch {
		case err != nil:
			fail("%v", err)
			return false
		case o.forgotten[id]:
			if found {
				fail("forgotten %s is back", id)
			}
			continue
		case !found:
			if !o.forgotting[id] {
				fail("acknowledged %s lost", id)
			}
			continue
		}
		var fp journal.Fingerprint
		copy(fp[:], id)
		if got.Key != key || got.Fingerprint != fp {
			fail("acknowledged %s changed: key %s -> %s, fingerprint %x -> %x", id, key, got.Key, fp, got.Fingerprint)
		}
		if d, synced := o.synced[id]; synced && (got.State != journal.StateDone || got.Status != d.status || got.Attempts != d.attempts) {
			fail("%s's synced done (status %d, attempts %d) lost: %v, status %d, attempts %d", id, d.status, d.attempts, got.State, got.Status, got.Attempts)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.m {
		r := s.recOf(id, ptr(s.m[id]))
		if key, sub := o.submitted[id]; !sub || key != r.record(id).Key {
			fail("%s was never submitted (or with another key)", id)
		}
	}
	return ok
}

func ptr[T any](v T) *T { return &v }
