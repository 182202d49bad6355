package sqljournal_test

// Rows that no Journal writes, put in the table by someone else (an UPDATE
// by hand, a bad migration, a damaged backup): the Transport never sends
// them as they are (issue 26, item 14).

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// craftedRows are values of a record's columns that journal.CheckRecord
// refuses, as an UPDATE of the table sets them.
var craftedRows = []struct{ name, set string }{
	{"empty key", `key = ''`},
	{"key with a space", `key = 'a b'`},
	{"key with a control byte", `key = E'k\x01'`},
	{"key too long", `key = repeat('k', 256)`},
	{"negative attempts", `attempts = -1`},
	{"negative status", `status = -1`},
	{"creation time before 1678", `created_at = -9223372036854775808`},
	{"creation time after 2262", `created_at = 9223372036854775807`},
}

// keyLog is a chargeServer's record of the Idempotency-Key headers of
// every request it answered ("" for none).
type keyLog struct {
	mu   sync.Mutex
	keys []string
}

func (l *keyLog) answered(r *http.Request, _ int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.keys = append(l.keys, strings.Join(r.Header.Values("Idempotency-Key"), ","))
}

func (l *keyLog) seen() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.keys...)
}

// seededServer is a chargeServer whose first request is answered 503, and
// a Transport over a fresh table that has sent it: the action is pending
// in the table, with the request's own fingerprint.
func seededServer(t *testing.T, action, body string) (srv *chargeServer, keys *keyLog, tr *idemretry.Transport, table string) {
	t.Helper()
	db := testDB(t)
	j, table := openJournal(t, db)
	srv, keys = newUnstartedChargeServer(t), &keyLog{}
	srv.answered = keys.answered
	var once sync.Once
	srv.before = func(w http.ResponseWriter, r *http.Request) bool {
		down := false
		once.Do(func() { down = true })
		if down {
			keys.answered(r, http.StatusServiceUnavailable)
			http.Error(w, "down", http.StatusServiceUnavailable)
		}
		return down
	}
	srv.Start()
	tr = transportOn(t, j, idemretry.WithMaxRetries(0))
	if p := post(context.Background(), tr, srv.URL, action, body); p.status != http.StatusServiceUnavailable {
		t.Fatalf("seeding: %+v, want the 503", p)
	}
	return srv, keys, tr, table
}

// resendAll is a Resumer that rebuilds each pending action as POST body
// to url.
type resendAll struct{ url, body string }

func (r resendAll) Rebuild(ctx context.Context, _ journal.Record) (*http.Request, error) {
	return http.NewRequestWithContext(ctx, http.MethodPost, r.url, strings.NewReader(r.body))
}

func (resendAll) Resolve(context.Context, journal.Record) (bool, error) { return false, nil }

// A pending row made corrupt by hand: neither a resend of the action nor
// Resume sends anything (an empty key went out as a request without an
// Idempotency-Key, every retry a new charge on a server that charges
// such requests; 'a b' went out as it is); both fail with an error that
// says the record is corrupt.
func TestCraftedRowIsNeverSent(t *testing.T) {
	for _, tc := range craftedRows {
		t.Run(tc.name, func(t *testing.T) {
			const action, body = "pay:crafted", `{"amount":1}`
			srv, keys, tr, table := seededServer(t, action, body)
			if _, err := testDB(t).Exec(`UPDATE "`+table+`" SET `+tc.set+` WHERE action_id = $1`, action); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			p := post(ctx, tr, srv.URL, action, body)
			t.Logf("resend: %d %v", p.status, p.err)
			if !errors.Is(p.err, journal.ErrCorruptRecord) {
				t.Errorf("resend of the crafted row: %d %v, want journal.ErrCorruptRecord", p.status, p.err)
			}
			res, err := tr.Resume(ctx, resendAll{srv.URL, body}, 1)
			t.Logf("Resume: %+v, %v", res, err)
			if !errors.Is(err, journal.ErrCorruptRecord) {
				t.Errorf("Resume with the crafted row: %v, want journal.ErrCorruptRecord", err)
			}
			if seen := keys.seen(); len(seen) != 1 {
				t.Errorf("requests under keys %q: want the seed's alone", seen)
			}
		})
	}
}

// A pending row whose attempts are at the journal's bound (2^31-1, by
// hand): the resend goes out and its outcome is recorded, the attempts
// kept at the bound. It could never be recorded (the count went past the
// bound, and every Update was refused), and every later request of the
// action was refused, nothing sent, until the process ended.
func TestRowAtTheAttemptsBoundRecordsItsOutcome(t *testing.T) {
	const action, body = "pay:many-attempts", `{"amount":1}`
	srv, keys, tr, table := seededServer(t, action, body)
	probe := testDB(t)
	if _, err := probe.Exec(`UPDATE "`+table+`" SET attempts = 2147483647 WHERE action_id = $1`, action); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, want := range []bool{false, true} {
		p := post(ctx, tr, srv.URL, action, body)
		t.Logf("request %d: %d replay=%v %v; rows %+v", i+1, p.status, p.replay, p.err, rowsOf(t, probe, table))
		if p.err != nil || p.status != http.StatusOK || p.replay != want {
			t.Errorf("request %d: %d replay=%v %v, want 200, replay %v", i+1, p.status, p.replay, p.err, want)
		}
	}
	rows := rowsOf(t, probe, table)
	if len(rows) != 1 || rows[0].state != journal.StateDone || rows[0].attempts != 2147483647 {
		t.Errorf("rows %+v, want the action done, 2147483647 attempts", rows)
	}
	if n := srv.chargeCount(); n != 1 || len(keys.seen()) != 3 {
		t.Errorf("%d charges, requests under keys %q", n, keys.seen())
	}
}
