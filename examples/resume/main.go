// Command resume shows an app resuming its payments after a crash:
//
//	go -C examples run ./resume
//
// It starts a payment server on loopback with Stripe's semantics (a key is
// charged once and its stored answer replayed, with Idempotent-Replayed:
// true), then the app, as a real child process, which pays its orders
// through idemretry with one action id per order ("pay:order-3") over a file
// journal. The server commits the charge of one order and tells the parent,
// which kills the app with SIGKILL before it reads the answer. The app is
// started again on the same journal: it calls Transport.Resume, which
// resends the unfinished payment under the key it was charged under (the
// app rebuilds the request from its own order list), and then pays the
// remaining orders. The server's ledger is printed and checked: every order
// charged exactly once, under the key the app recorded. The command exits 1
// if an order was charged twice or not at all.
//
// -fresh-journal restarts the app on an empty journal instead, as an app
// that keeps its keys in memory would be: the killed payment is then sent
// under a new key and charged twice, and the check fails (exit 1).
//
// The app is this same program, started with its environment set
// (IDEMRETRY_RESUME_JOURNAL...). Linux and macOS only (SIGKILL).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

func main() {
	if os.Getenv(envJournal) != "" {
		os.Exit(app())
	}
	os.Exit(cli(os.Args[1:], os.Stdout, os.Stderr))
}

// cli is the command, returning its exit code.
func cli(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("resume", flag.ContinueOnError)
	fs.SetOutput(stderr)
	orders := fs.Int("orders", 5, "orders the app pays")
	killAt := fs.Int("kill", 3, "the order whose payment the app is killed in, after the server committed it")
	fresh := fs.Bool("fresh-journal", false, "restart the app on an empty journal (the negative control: must double-charge and exit 1)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *orders < 1 || *killAt < 1 || *killAt > *orders || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "resume: want 1 <= -kill <= -orders, and no arguments")
		return 2
	}
	if !canKill {
		fmt.Fprintln(stderr, "resume: this example kills its app with SIGKILL: Linux or macOS only")
		return 2
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(stderr, "resume:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := run(ctx, config{exe: exe, orders: *orders, killAt: *killAt, freshJournal: *fresh, out: stdout})
	if err != nil {
		fmt.Fprintln(stderr, "resume:", err)
	}
	return exitCode(res, err)
}

// exitCode is the command's exit code for what run returned: 1 if the
// scenario could not be played, or if the ledger shows an order charged
// twice or not at all (or under another key than the app recorded).
func exitCode(res *result, err error) int {
	if err != nil || len(res.problems) > 0 {
		return 1
	}
	return 0
}

type config struct {
	exe          string // the program to start as the app (this one)
	orders       int
	killAt       int  // the order (1-based) the app is killed in
	freshJournal bool // the negative control: restart on an empty journal
	out          io.Writer
}

// A result is what run saw: the commit the app was killed after, the
// server's ledger, the app's order book, and what is wrong with them.
type result struct {
	killedIn commit
	ledger   []ledgerLine
	book     map[string]bookEntry
	problems []string
}

// run plays the scenario and prints it to cfg.out. It fails if the scenario
// could not be played (the app did not start, exited with an error, was not
// killed where it should be); what the ledger shows is in the result.
func run(ctx context.Context, cfg config) (*result, error) {
	orders := orderList(cfg.orders)
	victim := orders[cfg.killAt-1]
	tmp, err := os.MkdirTemp("", "idemretry-resume-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	journalDir, bookPath := filepath.Join(tmp, "journal"), filepath.Join(tmp, "orders.book")

	srv, err := startServer(victim.ID)
	if err != nil {
		return nil, err
	}
	defer srv.close()
	out := cfg.out
	fmt.Fprintf(out, "payment server on %s: a key is charged once, its answer stored and replayed with Idempotent-Replayed: true\n", srv.url)
	fmt.Fprintf(out, "the app's data: %s (idemretry's file journal), %s (its order book)\n", journalDir, bookPath)

	// Run 1: the app pays its orders; it is killed in the payment of
	// victim, right after the server committed its charge.
	fmt.Fprintf(out, "\nrun 1: the app pays %s..%s\n", orders[0].ID, orders[len(orders)-1].ID)
	cmd, exited, err := startApp(ctx, cfg, journalDir, bookPath, srv.url)
	if err != nil {
		return nil, err
	}
	var res result
	// While the app runs, only its own lines are printed (its output is
	// copied until it has ended), so that they come in order.
	select {
	case c := <-srv.committed:
		res.killedIn = c
		kerr := kill(cmd.Process)
		<-exited
		if kerr != nil {
			return nil, fmt.Errorf("kill the app: %w", kerr)
		}
		fmt.Fprintf(out, "server: charged %s (%s, key %s) and holds the answer back\n", c.Order, c.ChargeID, c.Key)
		fmt.Fprintf(out, "parent: SIGKILL to the app (pid %d) before the answer reached it\n", cmd.Process.Pid)
		if !killed(cmd.ProcessState) {
			return nil, fmt.Errorf("run 1 ended with %v, not by SIGKILL", cmd.ProcessState)
		}
		fmt.Fprintf(out, "run 1: %v\n", cmd.ProcessState)
	case err := <-exited:
		return nil, fmt.Errorf("run 1 ended (%v) before the server committed %s", err, victim.ID)
	case <-ctx.Done():
		<-exited
		return nil, fmt.Errorf("run 1: %w", ctx.Err())
	}

	// Run 2: the app starts again, resumes, and pays the rest.
	if cfg.freshJournal {
		journalDir = filepath.Join(tmp, "journal-fresh")
		fmt.Fprintf(out, "\nrun 2: the app restarts on an EMPTY journal (%s): the negative control, no durable keys\n", journalDir)
	} else {
		fmt.Fprintln(out, "\nrun 2: the app restarts on the same journal")
	}
	cmd, exited, err = startApp(ctx, cfg, journalDir, bookPath, srv.url)
	if err != nil {
		return nil, err
	}
	if err := <-exited; err != nil {
		return nil, fmt.Errorf("run 2 (pid %d): %w", cmd.Process.Pid, err)
	}
	fmt.Fprintf(out, "run 2 (pid %d): %v\n", cmd.Process.Pid, cmd.ProcessState)

	res.ledger = srv.ledger(orderIDs(orders))
	if res.book, err = readBook(bookPath); err != nil {
		return nil, err
	}
	res.problems = check(res.ledger, res.book)
	printLedger(out, &res)
	return &res, nil
}

// startApp starts the app as a child process; exited receives cmd.Wait's
// error once it has ended and its output has all been printed, each line
// marked.
func startApp(ctx context.Context, cfg config, journalDir, bookPath, url string) (*exec.Cmd, <-chan error, error) {
	cmd := exec.CommandContext(ctx, cfg.exe)
	cmd.Env = append(os.Environ(),
		envJournal+"="+journalDir, envBook+"="+bookPath, envURL+"="+url, envOrders+"="+strconv.Itoa(cfg.orders))
	w := &prefixWriter{out: cfg.out, prefix: "  app| "}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start the app: %w", err)
	}
	exited := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		w.flush()
		exited <- err
	}()
	return cmd, exited, nil
}

// check returns what is wrong with the ledger: an order charged twice or
// not at all, a charge for no order of the app, an order whose answer the
// app has not recorded or recorded under another key than the charge's.
func check(ledger []ledgerLine, book map[string]bookEntry) []string {
	var problems []string
	for _, l := range ledger {
		e, inBook := book[l.Order]
		switch n := len(l.Charges); {
		case n == 0:
			problems = append(problems, l.Order+" was never charged")
		case n > 1:
			var cs []string
			for _, c := range l.Charges {
				cs = append(cs, c.ID+" under key "+c.Key)
			}
			problems = append(problems, fmt.Sprintf("%s was charged %d times: %s", l.Order, n, strings.Join(cs, ", ")))
		case !inBook:
			problems = append(problems, l.Order+" was charged but the app has no answer for it")
		case e.Key != l.Charges[0].Key:
			problems = append(problems, fmt.Sprintf("%s: the app recorded key %s, the server charged key %s", l.Order, e.Key, l.Charges[0].Key))
		}
	}
	return problems
}

func printLedger(out io.Writer, res *result) {
	fmt.Fprintln(out, "\nthe server's ledger (requests and replays: under the charge's key):")
	const row = "  %-8s  %7s  %-6s  %-36s  %8s  %7s%s\n"
	fmt.Fprintf(out, row, "order", "charges", "charge", "key", "requests", "replays", "")
	for _, l := range res.ledger {
		if len(l.Charges) == 0 {
			fmt.Fprintf(out, row, l.Order, "0", "-", "-", "-", "-", "")
			continue
		}
		for i, c := range l.Charges {
			count, note := "", ""
			if i == 0 {
				count = strconv.Itoa(len(l.Charges))
			}
			if c.ID == res.killedIn.ChargeID {
				note = "  <- the app was killed before this answer"
			}
			fmt.Fprintf(out, row, l.Order, count, c.ID, c.Key, strconv.Itoa(c.Requests), strconv.Itoa(c.Replays), note)
		}
	}
	if len(res.problems) == 0 {
		fmt.Fprintf(out, "\nOK: %d orders, each charged exactly once, under the key the app recorded\n", len(res.ledger))
		return
	}
	fmt.Fprintln(out, "\nFAIL:")
	for _, p := range res.problems {
		fmt.Fprintln(out, "  "+p)
	}
}

// prefixWriter writes each complete line to out with a prefix. It is safe
// for concurrent use (the app's stdout and stderr share it).
type prefixWriter struct {
	mu     sync.Mutex
	out    io.Writer
	prefix string
	buf    []byte
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			return len(p), nil
		}
		if _, err := fmt.Fprintf(w.out, "%s%s\n", w.prefix, w.buf[:i]); err != nil {
			return len(p), err
		}
		w.buf = w.buf[i+1:]
	}
}

// flush writes a last line without its newline.
func (w *prefixWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		fmt.Fprintf(w.out, "%s%s\n", w.prefix, w.buf)
		w.buf = nil
	}
}
