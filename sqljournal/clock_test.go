package sqljournal_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/internal/paytest"
	"github.com/idemretry/idemretry/journal"
	"github.com/idemretry/idemretry/sqljournal"
)

// Two machines of a fleet whose clocks disagree by less than the minute the
// Transport tolerates (maxClockSkew), sharing one PostgreSQL journal, against
// a payment server that forgets a key once its window has passed (as
// Stripe prunes keys after 24 hours): the key must never be sent after its
// window, whichever machine's clock is off.

// offsetClock is a machine's clock, off by a fixed amount from the real
// one; without a NewTimer, its waits run on the system's timers.
type offsetClock struct{ off time.Duration }

func (c offsetClock) Now() time.Time { return time.Now().Add(c.off) }

// forgetfulServer is the shared payment server (internal/paytest) whose key
// window is retain (on its own, real, clock): a request under a key
// forgotten is a new charge. Its ledger counts charges per order (the
// body); it cuts the connection, after committing, on the first charge of
// each order (a lost answer).
type forgetfulServer struct {
	*httptest.Server
	pay *paytest.Server
}

func newForgetfulServer(t *testing.T, retain time.Duration) *forgetfulServer {
	s := &forgetfulServer{}
	s.pay = paytest.New(paytest.WithKeyWindow(retain), paytest.WithStatus(http.StatusOK),
		paytest.WithAfterCharge(func(n int, w http.ResponseWriter, _ *http.Request) bool {
			req := s.pay.Requests()[n-1]
			if s.pay.ChargesOf(req.Intent)[0].ID != req.Charge {
				return false
			}
			// committed; the answer is lost
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
			}
			return true
		}))
	s.Server = httptest.NewServer(s.pay)
	t.Cleanup(s.Close)
	return s
}

// ledger returns the charges of order and the keys that reached the
// server with it.
func (s *forgetfulServer) ledger(order string) (int, []string) {
	var keys []string
	for _, r := range s.pay.Requests() {
		if string(r.Body) == order {
			keys = append(keys, r.Header.Get(paytest.KeyHeader))
		}
	}
	return len(s.pay.ChargesOf(order)), keys
}

// skewedMachine is a machine of the fleet on table, with its clock off by
// off and a key window of window (the journal told the same).
func skewedMachine(t *testing.T, table string, off, window time.Duration) *idemretry.Transport {
	t.Helper()
	return transportOn(t, openOn(t, testDB(t), table), idemretry.WithKeyWindow(window), idemretry.WithMaxRetries(0),
		idemretry.WithClock(offsetClock{off}))
}

// clockSkewRound pays order on a machine whose clock is off by minterOff,
// loses the answer after the charge, waits until the key's window (and the
// server's memory of the key) has passed in real time, and sends the same
// action from a machine whose clock is off by resenderOff. The server must
// have charged once, and the resend must be refused as past its window.
func clockSkewRound(t *testing.T, minterOff, resenderOff time.Duration) {
	t.Parallel()
	const window = 2 * time.Second
	db := testDB(t)
	table := newTable(t, db)
	openOn(t, db, table) // creates the table
	srv := newForgetfulServer(t, window)
	order := `{"order":"` + t.Name() + `"}`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	minter := skewedMachine(t, table, minterOff, window)
	start := time.Now()
	if p := post(ctx, minter, srv.URL, "pay:1", order); p.err == nil {
		t.Fatalf("first payment: %d %q, want the lost answer's error", p.status, p.body)
	}
	// The window has passed on the real clock, and the server forgot the key.
	time.Sleep(time.Until(start.Add(window + 500*time.Millisecond)))

	resender := skewedMachine(t, table, resenderOff, window)
	p := post(ctx, resender, srv.URL, "pay:1", order)
	charges, keys := srv.ledger(order)
	t.Logf("resend %v after the first payment: %d %q %v; the server saw keys %v", time.Since(start), p.status, p.body, p.err, keys)
	if charges != 1 {
		t.Errorf("order charged %d times, want once: the key went out %v after its window under keys %v", charges, time.Since(start)-window, keys)
	}
	if len(keys) != 1 {
		t.Errorf("the server saw keys %v after the window, want the first request only", keys)
	}
	if !errors.Is(p.err, idemretry.ErrKeyWindowExpired) && !errors.Is(p.err, idemretry.ErrClockSkew) {
		t.Errorf("resend after the window: %d %v, want ErrKeyWindowExpired", p.status, p.err)
	}
	if rows := rowsOf(t, db, table); len(rows) != 1 || rows[0].state == journal.StateDone {
		t.Errorf("records %+v, want the action pending or outcome-unknown", rows)
	}
}

// The machine that minted the key ran 40 s ahead: its record says the key
// was made 40 s later than it was, and a machine with the right clock would
// send it for 40 s after its window.
//
// Found in review hx1 (was TestReviewHX1MinterClockAheadKeyNotSentAfterWindow).
func TestClockMinterAheadKeyNotSentAfterWindow(t *testing.T) {
	clockSkewRound(t, 40*time.Second, 0)
}

// The machine that resends runs 40 s behind: by its clock the key is 40 s
// younger than it is.
//
// Found in review hx1 (was TestReviewHX1ResenderClockBehindKeyNotSentAfterWindow).
func TestClockResenderBehindKeyNotSentAfterWindow(t *testing.T) {
	clockSkewRound(t, 0, -40*time.Second)
}

// Reserve stores the earlier of the record's time and the database's clock,
// and returns the record as stored; Now is never behind the database's
// clock.
//
// Found in review hx1 (was TestReviewHX1ReserveCreatedAtAndNowFollowTheDatabase).
func TestClockReserveCreatedAtAndNowFollowTheDatabase(t *testing.T) {
	db := testDB(t)
	j, _ := openJournal(t, db)
	ctx := context.Background()
	readDB := func() time.Time { return dbClockNow(t, db) }
	before := readDB()
	if now := j.Now(); now.Before(before) {
		t.Errorf("Now %v, behind the database's clock %v", now, before)
	}
	ahead := rec("pay:ahead", "k-ahead", 0, journal.StatePending)
	ahead.CreatedAt = before.Add(time.Hour).Truncate(time.Millisecond)
	got, created, err := j.Reserve(ctx, ahead, journal.ReuseAny)
	after := readDB()
	if err != nil || !created {
		t.Fatalf("Reserve: %v %v", created, err)
	}
	if got.CreatedAt.Before(before.Truncate(time.Millisecond)) || got.CreatedAt.After(after) {
		t.Errorf("created at %v, want the database's clock, between %v and %v", got.CreatedAt, before, after)
	}
	again, created, err := j.Reserve(ctx, rec("pay:ahead", "k-other", 0, journal.StatePending), journal.ReuseAny)
	if err != nil || created || again.Key != "k-ahead" || !again.CreatedAt.Equal(got.CreatedAt) {
		t.Errorf("read back: %+v %v %v, want key k-ahead created at %v", again, created, err, got.CreatedAt)
	}
	past := rec("pay:past", "k-past", 0, journal.StatePending) // a time well behind the database's is kept
	if got, _, err := j.Reserve(ctx, past, journal.ReuseAny); err != nil || !got.CreatedAt.Equal(past.CreatedAt) {
		t.Errorf("Reserve of a past record: %+v %v, want created at %v", got, err, past.CreatedAt)
	}
}

// A machine suspended for ten minutes since Open (a laptop closed): its
// monotonic clock stood still, so the database's time Now extrapolates from
// Open's reading is ten minutes behind. Now is what a Transport on a
// machine whose clock runs behind judges key windows by; behind, it would
// take keys for younger than they are and send them after their window.
// The next Reserve, before which no key of the record it returns is judged,
// reads the database's clock again: created or found, Now is then not
// behind the database's clock.
//
// Found in review hx3 (was TestReviewHX3NowCatchesUpAfterASuspendAtTheNextReserve).
func TestClockNowCatchesUpAfterASuspendAtTheNextReserve(t *testing.T) {
	db := testDB(t)
	j, _ := openJournal(t, db)
	ctx := context.Background()
	readDB := func() time.Time { return dbClockNow(t, db) }
	for _, created := range []bool{true, false} {
		sqljournal.SuspendedFor(j, 10*time.Minute)
		if behind := readDB().Sub(j.Now()); behind < 9*time.Minute {
			t.Fatalf("after the suspend, Now is %v behind the database's clock, want about 10m", behind)
		}
		r := rec("pay:suspended", "k-suspended", 0, journal.StatePending)
		if _, got, err := j.Reserve(ctx, r, journal.ReuseAny); err != nil || got != created {
			t.Fatalf("Reserve: created %v, %v; want created %v", got, err, created)
		}
		if db, now := readDB(), j.Now(); now.Before(db.Add(-time.Second)) {
			t.Errorf("after a Reserve (created %v), Now %v is %v behind the database's clock %v", created, now, db.Sub(now), db)
		}
	}
}

// A double tap of an unnamed payment within the duplicate window
// (WithDuplicateWindow) is the same payment, sent under the same key, on a
// machine whose clock runs ahead of the database's (equally: a database
// whose clock runs behind the application servers'). Reserve stores the
// database's time when it is the earlier, so the window must be judged by a
// time no later than the database's, or every repeat counts as a new
// payment as soon as the clocks disagree by more than the window. On a
// machine whose clock runs behind the database's, the Transport judges
// windows by the database's time (the Journal is a journal.Timekeeper),
// while the record keeps the machine's time: the same, the other way.
//
// Found in review hx3 (was TestReviewHX3DuplicateWindowHeldWhenTheDatabaseClockIsBehind).
func TestClockDuplicateWindowHeldWhenTheDatabaseIsBehind(t *testing.T) {
	for _, off := range []time.Duration{0, 2 * time.Minute, -2 * time.Minute} {
		t.Run(off.String(), func(t *testing.T) {
			var mu sync.Mutex
			charges := map[string]int{}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				mu.Lock()
				charges[r.Header.Get("Idempotency-Key")]++
				mu.Unlock()
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, `{"charged":"`+string(b)+`"}`)
			}))
			defer srv.Close()
			db := testDB(t)
			j, _ := openJournal(t, db)
			tr := transportOn(t, j, idemretry.WithDuplicateWindow(time.Minute), idemretry.WithClock(offsetClock{off}))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			first := post(ctx, tr, srv.URL, "", `{"order":"tap"}`)
			second := post(ctx, tr, srv.URL, "", `{"order":"tap"}`)
			if first.err != nil || second.err != nil {
				t.Fatalf("taps: %v, %v", first.err, second.err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(charges) != 1 { // the server charges once per key
				t.Errorf("clock %v ahead of the database's: a double tap within the duplicate window charged under %d keys (%v), want one",
					off, len(charges), charges)
			}
		})
	}
}

// settleResumer rebuilds the payment and counts the Resolve calls, with
// the real time of the first.
type settleResumer struct {
	url, order string

	mu       sync.Mutex
	resolved int
	first    time.Time
}

func (r *settleResumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	return http.NewRequestWithContext(idemretry.WithAction(ctx, rec.ActionID), http.MethodPost, r.url, strings.NewReader(r.order))
}

func (r *settleResumer) Resolve(context.Context, journal.Record) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.resolved == 0 {
		r.first = time.Now()
	}
	r.resolved++
	return false, nil
}

// A machine whose clock runs ahead of the database's resolves an action it
// minted itself only after the settle time has passed by the database's
// clock, which its key's creation time is stored by: a Resolve sooner may
// find no charge at the provider while the request is still on its way
// there, and the app pays again.
func TestResolveWaitsForTheSettleTimeWhenTheClockRunsAhead(t *testing.T) {
	const (
		window = 1500 * time.Millisecond
		settle = 4 * time.Second
		ahead  = 40 * time.Second
	)
	db := testDB(t)
	table := newTable(t, db)
	srv := newForgetfulServer(t, window)
	order := `{"order":"settle"}`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := transportOn(t, openOn(t, db, table), idemretry.WithKeyWindow(window), idemretry.WithMaxRetries(0),
		idemretry.WithSettleTime(settle), idemretry.WithClock(offsetClock{ahead}))
	start := time.Now()
	if p := post(ctx, m, srv.URL, "pay:settle", order); p.err == nil {
		t.Fatalf("payment: %d %q, want the lost answer's error", p.status, p.body)
	}
	app := &settleResumer{url: srv.URL, order: order}
	for time.Since(start) < window+settle+time.Second {
		if _, err := m.Resume(ctx, app, 0); err != nil {
			t.Fatal(err)
		}
		app.mu.Lock()
		resolved, first := app.resolved, app.first
		app.mu.Unlock()
		if resolved > 0 {
			if early := start.Add(window + settle).Sub(first); early > 0 {
				t.Fatalf("Resolve called %v after the payment, %v before its settle time ended on the database's clock", first.Sub(start), early)
			}
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("Resolve never called within %v", window+settle+time.Second)
}
