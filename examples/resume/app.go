package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// The app's environment, set by the parent: its presence makes the process
// the app.
const (
	envJournal = "IDEMRETRY_RESUME_JOURNAL" // idemretry's journal directory
	envBook    = "IDEMRETRY_RESUME_BOOK"    // the app's own order book (a file)
	envURL     = "IDEMRETRY_RESUME_URL"     // the payment server
	envOrders  = "IDEMRETRY_RESUME_ORDERS"  // how many orders to pay
)

// An order the app must pay once.
type order struct {
	ID     string
	Amount int // in cents
}

// action is the order's payment, named for the journal: its id must stay
// the same across restarts, and carry no personal data.
func (o order) action() string { return "pay:" + o.ID }

func orderList(n int) []order {
	orders := make([]order, n)
	for i := range orders {
		orders[i] = order{ID: "order-" + strconv.Itoa(i+1), Amount: 1000 + 100*(i+1)}
	}
	return orders
}

func orderIDs(orders []order) []string {
	ids := make([]string, len(orders))
	for i, o := range orders {
		ids[i] = o.ID
	}
	return ids
}

// request is the order's payment request: the same method, URL and body on
// every start, which is what the journal's fingerprint checks.
func (o order) request(ctx context.Context, url string) (*http.Request, error) {
	body, _ := json.Marshal(paymentRequest{Order: o.ID, Amount: o.Amount})
	req, err := http.NewRequestWithContext(idemretry.WithAction(ctx, o.action()),
		http.MethodPost, url+"/v1/payments", strings.NewReader(string(body)))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return req, nil
}

// A bookEntry is one line of the app's order book: an order it got a final
// answer for, and the key that answer came under.
type bookEntry struct {
	Order, Key string
	Status     int
	Replayed   bool
	Resumed    bool // answered to Transport.Resume at start-up
}

// readBook reads the app's order book; a missing book is empty.
func readBook(path string) (map[string]bookEntry, error) {
	book := map[string]bookEntry{}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return book, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var e bookEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("order book %s: %w", path, err)
		}
		book[e.Order] = e
	}
	return book, sc.Err()
}

// appendBook records an answer in the app's order book, durably.
func appendBook(path string, e bookEntry) error {
	line, _ := json.Marshal(e)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(line, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// resumer rebuilds a pending payment from the app's own order list: the
// journal keeps the action's id and key, never its request.
type resumer struct {
	orders map[string]order // by action id
	url    string
}

func (r resumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	o, ok := r.orders[rec.ActionID]
	if !ok {
		return nil, fmt.Errorf("%s is not one of this app's orders", rec.ActionID)
	}
	return o.request(ctx, r.url)
}

// Resolve is for an action whose key window ended with no answer: the app
// would ask the payment provider about rec.Key. This example's restarts come
// within seconds, so it never gets there; such an action is kept.
func (r resumer) Resolve(_ context.Context, rec journal.Record) (bool, error) {
	return false, fmt.Errorf("outcome of %s unknown: reconcile key %s with the payment provider", rec.ActionID, rec.Key)
}

// doneEvents keeps each action's final answer as the Transport's observer
// saw it: the key it came under, and whether the server replayed it.
type doneEvents struct {
	mu   sync.Mutex
	done map[string]idemretry.Event
}

func (d *doneEvents) observe(ev idemretry.Event) {
	if ev.Kind == idemretry.EventDone {
		d.mu.Lock()
		d.done[ev.Action] = ev
		d.mu.Unlock()
	}
}

func (d *doneEvents) get(action string) idemretry.Event {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.done[action]
}

// app is the child process: an app that pays its orders through idemretry
// over a file journal. On start it resumes what the journal lists as
// unfinished, then pays the orders its order book has no answer for. It
// prints what it does and returns its exit code.
func app() int {
	dir, bookPath, url := os.Getenv(envJournal), os.Getenv(envBook), os.Getenv(envURL)
	n, err := strconv.Atoi(os.Getenv(envOrders))
	if err != nil || n < 1 || bookPath == "" || url == "" {
		fmt.Println("bad environment:", envOrders, envBook, envURL)
		return 2
	}
	if err := payOrders(dir, bookPath, url, orderList(n), os.Stdout); err != nil {
		fmt.Println("error:", err)
		return 1
	}
	return 0
}

func payOrders(dir, bookPath, url string, orders []order, out io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	events := &doneEvents{done: map[string]idemretry.Event{}}
	t, err := idemretry.NewTransport(http.DefaultTransport,
		idemretry.WithJournalDir(dir), idemretry.WithRequireAction(), idemretry.WithObserver(events.observe))
	if err != nil {
		return err
	}
	defer t.Close()
	book, err := readBook(bookPath)
	if err != nil {
		return err
	}

	// 1. Resume what a previous run left unfinished, under its keys.
	byAction := map[string]order{}
	for _, o := range orders {
		byAction[o.action()] = o
	}
	results, err := t.Resume(ctx, resumer{orders: byAction, url: url}, 0)
	if err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	fmt.Fprintf(out, "resume: the journal lists %d unfinished action(s)\n", len(results))
	var failed []string
	for _, res := range results {
		rec := res.Record
		fmt.Fprintf(out, "resume: %s %s since %s, key %s: ",
			rec.ActionID, rec.State, rec.CreatedAt.Format(time.TimeOnly), rec.Key)
		switch {
		case res.Err != nil:
			fmt.Fprintln(out, "not finished:", res.Err)
			failed = append(failed, rec.ActionID)
		case res.Forgotten:
			fmt.Fprintln(out, "reconciled and forgotten")
		case res.Sent:
			ev := events.get(rec.ActionID)
			fmt.Fprintf(out, "resent under the same key: %d, %s\n", res.Status, how(ev))
			o := byAction[rec.ActionID]
			if err := appendBook(bookPath, bookEntry{Order: o.ID, Key: ev.Key, Status: res.Status, Replayed: ev.Replayed, Resumed: true}); err != nil {
				return err
			}
			book[o.ID] = bookEntry{Order: o.ID, Key: ev.Key}
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("resume left %s unfinished", strings.Join(failed, ", "))
	}

	// 2. Pay the orders the app has no answer for.
	client := &http.Client{Transport: t, Timeout: 20 * time.Second}
	for _, o := range orders {
		if _, paid := book[o.ID]; paid {
			continue
		}
		req, err := o.request(ctx, url)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("pay %s: %w", o.ID, err)
		}
		var answer struct{ ID string }
		err = json.NewDecoder(resp.Body).Decode(&answer)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || err != nil {
			return fmt.Errorf("pay %s: %s (%v)", o.ID, resp.Status, err)
		}
		ev := events.get(o.action())
		fmt.Fprintf(out, "paid %s: %d, charge %s, key %s, %s\n", o.ID, resp.StatusCode, answer.ID, ev.Key, how(ev))
		if err := appendBook(bookPath, bookEntry{Order: o.ID, Key: ev.Key, Status: resp.StatusCode, Replayed: ev.Replayed}); err != nil {
			return err
		}
	}
	if err := t.Close(); err != nil {
		return err
	}
	s := t.Stats()
	fmt.Fprintf(out, "stats: %d attempt(s), %d done, %d replayed, %d resumed, %d retried, %d gave up\n",
		s.Attempts, s.Done, s.Replays, s.Resumed, s.Retries,
		s.GiveUpsExhausted+s.GiveUpsRetryAfter+s.GiveUpsDeadline+s.GiveUpsOther)
	return nil
}

// how says how the server answered.
func how(ev idemretry.Event) string {
	if ev.Replayed {
		return "replayed by the server (Idempotent-Replayed: true)"
	}
	return "charged now"
}
