package sqljournal_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
	"github.com/idemretry/idemretry/sqljournal"
)

// previousDDL is the table as Open created it before it recorded keys'
// forms: legacyDDL's columns and the lease columns. currentDDL is the table
// as Open creates it now, with key_form, for tables made by hand.
var (
	previousDDL = strings.Replace(legacyDDL, "status      integer  NOT NULL",
		"status      integer  NOT NULL,\n\tlease_holder text,\n\tlease_until  timestamptz", 1)
	currentDDL = strings.Replace(previousDDL, "lease_until  timestamptz",
		"lease_until  timestamptz,\n\tkey_form     smallint NOT NULL DEFAULT 0", 1)
)

// leaseOf returns the lease columns of id's row: holder ("" for none) and
// the time left on the database's clock.
// leaseAfterRelease returns the action's lease holder once the Transport's
// release has had its bound: a lease is released after RoundTrip returns,
// within a second (the Transport's release bound), so the row is read
// until it is free or two seconds have passed, and the holder then is
// returned ("" when released).
func leaseAfterRelease(t *testing.T, db *sql.DB, table, storedID string) string {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		h, _ := leaseOf(t, db, table, storedID)
		if h == "" || time.Now().After(deadline) {
			return h
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func leaseOf(t *testing.T, db *sql.DB, table, storedID string) (string, time.Duration) {
	t.Helper()
	var (
		holder *string
		leftMs *int64
	)
	if err := db.QueryRow(`SELECT lease_holder, (extract(epoch FROM lease_until - now()) * 1000)::bigint FROM "`+table+`" WHERE action_id = $1`,
		storedID).Scan(&holder, &leftMs); err != nil {
		t.Fatal(err)
	}
	if holder == nil {
		return "", 0
	}
	return *holder, time.Duration(*leftMs) * time.Millisecond
}

func mustLease(t *testing.T, j journal.Leaser, id, holder string, ttl time.Duration) (bool, time.Time) {
	t.Helper()
	held, until, err := j.Lease(context.Background(), id, holder, ttl)
	if err != nil {
		t.Fatalf("Lease(%s, %s): %v", id, holder, err)
	}
	return held, until
}

// One holder at a time: taken, renewed by its holder, refused to another
// until it ends (and then taken over), released by its holder only.
func TestLeaseTakeRenewRefuseRelease(t *testing.T) {
	db := testDB(t)
	j, table := openJournal(t, db)
	ctx := context.Background()
	mustReserve(t, j, rec("pay:1", "k1", 0, journal.StatePending), journal.ReuseAny, true)

	before := time.Now()
	held, until := mustLease(t, j, "pay:1", "machine-a", time.Hour)
	if !held || until.Before(before.Add(time.Hour)) || until.After(time.Now().Add(time.Hour)) {
		t.Fatalf("first Lease: held %v until %v, want held, an hour from the call", held, until)
	}
	if h, left := leaseOf(t, db, table, "pay:1"); h != "machine-a" || left <= 59*time.Minute || left > time.Hour {
		t.Fatalf("row: holder %q, %v left; want machine-a, about an hour", h, left)
	}
	// Another holder is refused, and told when the lease ends.
	held, until = mustLease(t, j, "pay:1", "machine-b", time.Minute)
	if held || until.Before(time.Now().Add(59*time.Minute)) || until.After(time.Now().Add(time.Hour)) {
		t.Fatalf("Lease by another holder: held %v until %v, want refused, about an hour from now", held, until)
	}
	if h, _ := leaseOf(t, db, table, "pay:1"); h != "machine-a" {
		t.Fatalf("a refused Lease changed the holder to %q", h)
	}
	// Its holder renews it, for the ttl it gives now.
	if held, _ := mustLease(t, j, "pay:1", "machine-a", 10*time.Minute); !held {
		t.Fatal("renewal by the holder refused")
	}
	if _, left := leaseOf(t, db, table, "pay:1"); left > 10*time.Minute || left < 9*time.Minute {
		t.Fatalf("after renewal for 10 minutes: %v left", left)
	}
	// Release by another holder changes nothing.
	if err := j.Release(ctx, "pay:1", "machine-b"); err != nil {
		t.Fatalf("Release by a holder without the lease: %v", err)
	}
	if held, _ := mustLease(t, j, "pay:1", "machine-b", time.Minute); held {
		t.Fatal("another holder's Release ended the lease")
	}
	// Release by its holder frees it for anyone.
	if err := j.Release(ctx, "pay:1", "machine-a"); err != nil {
		t.Fatal(err)
	}
	if h, _ := leaseOf(t, db, table, "pay:1"); h != "" {
		t.Fatalf("after Release: holder %q", h)
	}
	if held, _ := mustLease(t, j, "pay:1", "machine-b", time.Minute); !held {
		t.Fatal("a released lease was refused")
	}
	// Releasing twice, or a lease never taken, is not an error.
	for _, h := range []string{"machine-a", "machine-b", "machine-b"} {
		if err := j.Release(ctx, "pay:1", h); err != nil {
			t.Fatalf("Release(%s): %v", h, err)
		}
	}
	// The lease columns leave the record alone.
	got := mustReserve(t, j, rec("pay:1", "k2", 0, journal.StatePending), journal.ReuseAny, false)
	sameRecord(t, "record after leases", got, rec("pay:1", "k1", 0, journal.StatePending))
}

// A lease whose holder stopped renewing it (a machine died) is taken over
// once it ends on the database's clock, and not before; the old holder's
// renewal is then refused and its Release does not end the new lease.
func TestLeaseTakeoverAfterExpiry(t *testing.T) {
	db := testDB(t)
	j, table := openJournal(t, db)
	other := openOn(t, testDB(t), table) // another machine: its own pool
	ctx := context.Background()
	mustReserve(t, j, rec("pay:1", "k1", 0, journal.StatePending), journal.ReuseAny, true)

	const ttl = 300 * time.Millisecond
	if held, _ := mustLease(t, j, "pay:1", "dead", ttl); !held {
		t.Fatal("Lease refused")
	}
	held, until := mustLease(t, other, "pay:1", "alive", time.Minute)
	if held {
		t.Fatal("the lease was taken over before it ended")
	}
	time.Sleep(time.Until(until) + 10*time.Millisecond)
	if held, _ := mustLease(t, other, "pay:1", "alive", time.Minute); !held {
		t.Fatalf("the lease was not taken over once it ended (told it ends at %v)", until)
	}
	if held, _ := mustLease(t, j, "pay:1", "dead", ttl); held {
		t.Fatal("the old holder renewed a lease taken over")
	}
	if err := j.Release(ctx, "pay:1", "dead"); err != nil {
		t.Fatal(err)
	}
	if held, _ := mustLease(t, j, "pay:1", "third", time.Minute); held {
		t.Fatal("the old holder's Release ended the new holder's lease")
	}
}

// Of many holders on many pools asking for a free lease at once, exactly
// one gets it.
func TestLeaseConcurrentTakers(t *testing.T) {
	db := testDB(t)
	j, table := openJournal(t, db)
	mustReserve(t, j, rec("pay:1", "k1", 0, journal.StatePending), journal.ReuseAny, true)
	journals := []*sqljournal.Journal{j, openOn(t, testDB(t), table), openOn(t, testDB(t), table)}
	for round := range 5 {
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			holders []string
		)
		for i := range 30 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				h := fmt.Sprintf("r%d-h%d", round, i)
				held, _, err := journals[i%len(journals)].Lease(context.Background(), "pay:1", h, time.Minute)
				if err != nil {
					t.Errorf("Lease: %v", err)
				}
				if held {
					mu.Lock()
					holders = append(holders, h)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if len(holders) != 1 {
			t.Fatalf("round %d: held by %v, want exactly one holder", round, holders)
		}
		if h, _ := leaseOf(t, db, table, "pay:1"); h != holders[0] {
			t.Fatalf("round %d: row says %q, the winner was %q", round, h, holders[0])
		}
		if err := j.Release(context.Background(), "pay:1", holders[0]); err != nil {
			t.Fatal(err)
		}
	}
}

// With hashed ids the lease is on the digest's row, and the id as given
// and its digest form (as Unfinished returns it) name the same lease.
func TestLeaseHashedIDs(t *testing.T) {
	db := testDB(t)
	j, table := openJournal(t, db, sqljournal.WithHashedIDs())
	mustReserve(t, j, rec("pay:customer-42", "k1", 0, journal.StatePending), journal.ReuseAny, true)
	digest := journal.Digest("pay:customer-42")
	if held, _ := mustLease(t, j, "pay:customer-42", "machine-a", time.Minute); !held {
		t.Fatal("Lease refused")
	}
	if h, _ := leaseOf(t, db, table, digest); h != "machine-a" {
		t.Fatalf("digest row's holder %q, want machine-a", h)
	}
	if held, _ := mustLease(t, j, digest, "machine-b", time.Minute); held {
		t.Fatal("the digest form leased the action again to another holder")
	}
	if held, _ := mustLease(t, j, digest, "machine-a", time.Minute); !held {
		t.Fatal("the holder could not renew by the digest form")
	}
	if err := j.Release(context.Background(), digest, "machine-a"); err != nil {
		t.Fatal(err)
	}
	if held, _ := mustLease(t, j, "pay:customer-42", "machine-b", time.Minute); !held {
		t.Fatal("Release by the digest form left the lease held")
	}
}

// A lease needs a record; bad arguments are refused with typed errors and
// touch nothing; a closed journal says so.
func TestLeaseRefusals(t *testing.T) {
	db := testDB(t)
	j, table := openJournal(t, db)
	ctx := context.Background()
	if _, _, err := j.Lease(ctx, "pay:none", "h", time.Minute); !errors.Is(err, journal.ErrNotFound) {
		t.Errorf("Lease of an action without a record: %v, want journal.ErrNotFound", err)
	}
	if err := j.Release(ctx, "pay:none", "h"); err != nil {
		t.Errorf("Release of an action without a record: %v, want nil", err)
	}
	mustReserve(t, j, rec("pay:1", "k1", 0, journal.StatePending), journal.ReuseAny, true)
	for _, tc := range []struct {
		name, id, holder string
		ttl              time.Duration
	}{
		{"empty id", "", "h", time.Minute},
		{"NUL in id", "pay:\x00", "h", time.Minute},
		{"id too long", strings.Repeat("x", journal.MaxActionID+1), "h", time.Minute},
		{"empty holder", "pay:1", "", time.Minute},
		{"holder with a space", "pay:1", "machine a", time.Minute},
		{"holder too long", "pay:1", strings.Repeat("h", journal.MaxKeyLength+1), time.Minute},
		{"zero ttl", "pay:1", "h", 0},
		{"negative ttl", "pay:1", "h", -time.Second},
		{"ttl under a millisecond", "pay:1", "h", time.Microsecond},
	} {
		_, _, err := j.Lease(ctx, tc.id, tc.holder, tc.ttl)
		if !errors.Is(err, journal.ErrInvalidRecord) || strings.Count(err.Error(), "idemretry: ") != 1 {
			t.Errorf("Lease with %s: %v, want journal.ErrInvalidRecord with the prefix once", tc.name, err)
		}
		if tc.ttl == time.Minute { // a bad id or holder
			if err := j.Release(ctx, tc.id, tc.holder); !errors.Is(err, journal.ErrInvalidRecord) {
				t.Errorf("Release with %s: %v, want journal.ErrInvalidRecord", tc.name, err)
			}
		}
	}
	if h, _ := leaseOf(t, db, table, "pay:1"); h != "" {
		t.Fatalf("refused calls left holder %q", h)
	}
	// Forget takes the lease with the record.
	mustLease(t, j, "pay:1", "h", time.Minute)
	if err := j.Forget(ctx, "pay:1"); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, j, rec("pay:1", "k2", 0, journal.StatePending), journal.ReuseAny, true)
	if held, _ := mustLease(t, j, "pay:1", "other", time.Minute); !held {
		t.Fatal("a forgotten action's lease outlived its record")
	}
	j.Close()
	if _, _, err := j.Lease(ctx, "pay:1", "h", time.Minute); !errors.Is(err, journal.ErrClosed) {
		t.Errorf("Lease after Close: %v, want journal.ErrClosed", err)
	}
	if err := j.Release(ctx, "pay:1", "h"); !errors.Is(err, journal.ErrClosed) {
		t.Errorf("Release after Close: %v, want journal.ErrClosed", err)
	}
}

// A table made before leases (by an earlier version, or by hand from the
// old documentation) is refused WithoutCreateTable, with what to run; an
// Open that may create tables adds the columns, keeping the records.
func TestLeaseColumnsOnOlderTable(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	table := newTable(t, db)
	if _, err := db.Exec(`CREATE TABLE "` + table + `" ` + legacyDDL); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO "`+table+`" VALUES ('pay:1', 'k1', $1, 0, 1, 0, 0)`, make([]byte, 32)); err != nil {
		t.Fatal(err)
	}
	_, err := sqljournal.Open(ctx, db, sqljournal.WithTable(table), sqljournal.WithoutCreateTable())
	t.Logf("Open WithoutCreateTable of a table without lease columns: %v", err)
	if !errors.Is(err, journal.ErrIncompatible) || !strings.Contains(err.Error(), "ADD COLUMN lease_holder") ||
		strings.Count(err.Error(), "idemretry: ") != 1 {
		t.Fatalf("Open WithoutCreateTable of a table without lease columns: %v, want journal.ErrIncompatible saying what to run", err)
	}
	j := openOn(t, db, table)
	if held, _ := mustLease(t, j, "pay:1", "h", time.Minute); !held {
		t.Fatal("Lease on the upgraded table refused")
	}
	got := mustReserve(t, j, rec("pay:1", "k2", 0, journal.StatePending), journal.ReuseAny, false)
	if got.Key != "k1" {
		t.Fatalf("the upgrade lost the record: key %q", got.Key)
	}
	if _, err := sqljournal.Open(ctx, db, sqljournal.WithTable(table), sqljournal.WithoutCreateTable()); err != nil {
		t.Fatalf("Open WithoutCreateTable after the upgrade: %v", err)
	}
	// Lease columns of other types are refused, whoever made them.
	bad := newTable(t, db)
	if _, err := db.Exec(`CREATE TABLE "` + bad + `" ` + strings.Replace(currentDDL, "timestamptz", "bigint", 1)); err != nil {
		t.Fatal(err)
	}
	for _, extra := range []sqljournal.Option{nil, sqljournal.WithoutCreateTable()} {
		_, err := sqljournal.Open(ctx, db, sqljournal.WithTable(bad), extra)
		t.Logf("lease_until of type bigint: %v", err)
		if !errors.Is(err, journal.ErrIncompatible) {
			t.Errorf("Open of a table whose lease_until is a bigint: %v, want journal.ErrIncompatible", err)
		}
	}
}

// logLines is a slog.Handler that keeps each record's message, in order.
type logLines struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logLines) WithGroup(string) slog.Handler            { return l }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Message)
	return nil
}

// count returns how many messages so far contain s.
func (l *logLines) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.Contains(m, s) {
			n++
		}
	}
	return n
}

// releaseFailed is what the Transport logs when a Release fails.
const releaseFailed = "did not release the action's lease"

// Issue 26, item 12: a payment with a 500 ms deadline whose database
// freezes while the charge is on the wire returned after 1.75 s: the
// outcome's write waits until OutcomeGrace past the deadline, and then the
// release of the action's lease waited its own second more. The caller's
// wait ends with its context plus OutcomeGrace: the release runs after
// RoundTrip has returned (its failure is logged later), and Close waits
// for it.
func TestLeaseReleaseAfterTheCallersDeadline(t *testing.T) {
	db, proxy := proxiedDB(t)
	j := openOn(t, db, newTable(t, testDB(t)))
	srv := newUnstartedChargeServer(t)
	srv.process = func(int, *http.Request) { proxy.freeze() }
	srv.Start()
	logs := &logLines{}
	// A journal timeout of a second, so that Close's landing of the
	// outcome on the frozen database ends soon.
	tr := transportOn(t, j, idemretry.WithLogger(slog.New(logs)), idemretry.WithJournalTimeout(time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	p := post(ctx, tr, srv.URL, "pay:frozen", `{"amount":1}`)
	took := time.Since(start)
	released := logs.count(releaseFailed)
	t.Logf("RoundTrip: %d %v after %v; releases logged failed by then: %d", p.status, p.err, took, released)
	if p.status != http.StatusOK {
		t.Fatalf("the charge's answer: %+v, want 200", p)
	}
	if released != 0 {
		t.Errorf("RoundTrip returned after %v, once the lease's release had failed: the release held the caller past its deadline plus OutcomeGrace", took)
	}
	closed := within(t, 10*time.Second, "Close", func() { tr.Close() })
	if n := logs.count(releaseFailed); n != 1 {
		t.Errorf("after Close (%v): %d failed releases logged, want 1: Close did not wait for the release", closed, n)
	}
	proxy.thaw()
}

// Environment of TestLeaseReentryChild.
const (
	envReentryDSN   = "IDEMRETRY_REENTRY_DSN" // set in the child only
	envReentryTable = "IDEMRETRY_REENTRY_TABLE"
	envReentryURL   = "IDEMRETRY_REENTRY_URL"
	reentryAction   = "pay:reentry"
	reentryBody     = `{"order":"reentry","amount":1}`
)

// TestLeaseReentryChild is the process of
// TestLeaseReentryAfterTheDatabaseReturns: it pays once and prints how it
// went ("first ..."), waits for a line on its standard input, pays the
// same action again, with a 10 s deadline, and prints that ("second ...").
func TestLeaseReentryChild(t *testing.T) {
	dsn := os.Getenv(envReentryDSN)
	if dsn == "" {
		t.Skip("a child of TestLeaseReentryAfterTheDatabaseReturns")
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	j, err := sqljournal.Open(ctx, db, sqljournal.WithTable(os.Getenv(envReentryTable)))
	if err != nil {
		t.Fatal(err)
	}
	tr, err := idemretry.NewTransport(&http.Transport{}, idemretry.WithJournal(j),
		idemretry.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	p := post(cctx, tr, os.Getenv(envReentryURL), reentryAction, reentryBody)
	fmt.Printf("first status=%d err=%v\n", p.status, p.err)
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cctx, cancel = context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	p = post(cctx, tr, os.Getenv(envReentryURL), reentryAction, reentryBody)
	fmt.Printf("second status=%d replay=%v took=%v err=%v\n", p.status, p.replay, time.Since(start).Round(time.Millisecond), p.err)
}

// Issue 26, item 13: a process whose database stops while its payment is
// on the wire cannot release the action's lease (nor record the outcome).
// Once the database is back, the same process's resend of the action
// waited for that lease, its own, until its TTL (30 s) ended, as for
// another machine's: with a 10 s deadline it failed with ErrLeaseHeld. A
// Transport re-enters a lease of its own whose release failed: the resend
// is answered at once (the stored answer, one charge), and releases the
// lease when it ends. Another machine still waits for that lease.
func TestLeaseReentryAfterTheDatabaseReturns(t *testing.T) {
	c := ownCluster(t)
	table := newTable(t, c.db())
	srv := newUnstartedChargeServer(t)
	srv.process = func(n int, _ *http.Request) {
		if n == 1 { // the charge is made; the database stops before it is answered
			if err := c.pgCtl("-m", "immediate", "-w", "stop"); err != nil {
				t.Errorf("stop the cluster: %v", err)
			}
		}
	}
	srv.Start()
	ch := startTestChild(t, "reentry", "TestLeaseReentryChild", envReentryDSN+"="+c.dsn,
		envReentryTable+"="+table, envReentryURL+"="+srv.URL)
	first := ch.line(t, "first ")
	t.Logf("child: %s", first)
	if first != "first status=200 err=<nil>" {
		t.Fatalf("the first payment: %s, want the charge's answer", first)
	}
	c.start()
	db := c.db() // a pool made after the restart
	holder, left := leaseOf(t, db, table, reentryAction)
	t.Logf("after the restart: lease held by %q, %v left", holder, left)
	if holder == "" || left < 10*time.Second {
		t.Fatalf("lease held by %q, %v left: the release did not fail, or the test is too slow to prove anything", holder, left)
	}
	// Another machine waits for that lease, as for one whose holder died.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if p := post(ctx, transportOn(t, openOn(t, db, table)), srv.URL, reentryAction, reentryBody); !errors.Is(p.err, idemretry.ErrLeaseHeld) {
		t.Errorf("another machine's request while the lease is held: %+v, want ErrLeaseHeld", p)
	}
	if _, err := io.WriteString(ch.in, "go\n"); err != nil {
		t.Fatal(err)
	}
	second := ch.line(t, "second ")
	if err := ch.cmd.Wait(); err != nil {
		t.Errorf("child: %v", err)
	}
	t.Logf("child: %s", second)
	if !strings.HasPrefix(second, "second status=200 replay=true ") || !strings.HasSuffix(second, "err=<nil>") {
		t.Errorf("the resend from the same process: %s, want the stored answer at once", second)
	}
	if n := srv.chargeCount(); n != 1 {
		t.Errorf("%d charges", n)
	}
	if holder := leaseAfterRelease(t, db, table, reentryAction); holder != "" {
		t.Errorf("after the resend: lease held by %q, want released", holder)
	}
}

// A payment cancelled by its caller while on the wire, while the
// action's row is locked for 500 ms (a concurrent transaction: real
// database load): the Release after the RoundTrip waits for the
// lock, for up to its own second (5a75ef1 cut it at OutcomeGrace, 250 ms,
// and the lease then stayed held by that finished RoundTrip). The app's
// resend of the same action through the same Transport must not wait for
// it as for another machine's, for the whole TTL (30 s), nor fail with
// ErrLeaseHeld: it is answered within its 5 s deadline, one charge.
//
// Found in the review of 5a75ef1 (was TestReviewResendAfterCancelWaitsForOwnLeaseWhenReleaseIsCut).
func TestLeaseResendAfterCancelWaitsForOwnRelease(t *testing.T) {
	probe := testDB(t)
	j, table := openJournal(t, probe)
	srv := newUnstartedChargeServer(t)
	inCharge := make(chan struct{}, 1)
	finish := make(chan struct{})
	srv.process = func(n int, _ *http.Request) {
		if n == 1 {
			inCharge <- struct{}{}
			<-finish
		}
	}
	srv.Start()
	defer func() {
		select {
		case <-finish:
		default:
			close(finish)
		}
	}()
	tr := transportOn(t, j)

	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan payment, 1)
	go func() { first <- post(ctx, tr, srv.URL, "pay:r3-resend", `{"amount":1}`) }()
	select {
	case <-inCharge:
	case <-time.After(30 * time.Second):
		t.Fatal("the first request never reached the server")
	}
	tx, err := holdLock(testDB(t), lockRows(table))
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	unlocked := make(chan error, 1)
	go func() {
		time.Sleep(700 * time.Millisecond)
		unlocked <- tx.Rollback()
	}()
	p1 := <-first
	if !errors.Is(p1.err, context.Canceled) {
		t.Fatalf("first: %+v, want context.Canceled", p1)
	}
	if err := <-unlocked; err != nil {
		t.Fatal(err)
	}
	close(finish)
	h, left := leaseOf(t, probe, table, "pay:r3-resend")
	t.Logf("after the first RoundTrip returned and the lock ended: lease holder %q, %v left", h, left)

	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	start := time.Now()
	p2 := post(rctx, tr, srv.URL, "pay:r3-resend", `{"amount":1}`)
	t.Logf("resend: %+v after %v; journal: %+v", p2, time.Since(start), rowsOf(t, probe, table))
	if errors.Is(p2.err, idemretry.ErrLeaseHeld) {
		t.Fatalf("the resend through the same Transport waited for the lease of its own finished RoundTrip: %v", p2.err)
	}
	if p2.err != nil || p2.status != http.StatusOK {
		t.Fatalf("the resend through the same Transport: %v; want the charge's answer (the first RoundTrip is over, no other machine holds the action)", p2.err)
	}
	if n := srv.chargeCount(); n != 1 {
		t.Errorf("%d charges", n)
	}
}

// A large named payment (a plain fingerprint: sqljournal keeps no secret)
// sent by two machines sharing one table, while the first one's
// charge is in progress: the second waits for the first's lease, reads the
// record again and sends under the first's key (one charge, one key), and
// a third request of the action with another body is refused with
// ErrFingerprintMismatch, with nothing sent.
//
// Found in review hf1 (was TestReviewLargeNamedPaymentTwoMachinesLeased).
func TestLeaseLargeNamedPaymentTwoMachines(t *testing.T) {
	srv := newUnstartedChargeServer(t)
	inProgress, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	srv.process = func(n int, _ *http.Request) {
		if n == 1 {
			once.Do(func() { close(inProgress) })
			<-release
		}
	}
	srv.Start()
	probe := testDB(t)
	table := newTable(t, probe)
	a, b := machine(t, table), machine(t, table)
	line := `{"order":"big-1","amount":1000}` + "\n"
	body := strings.Repeat(line, (4<<16+999)/len(line))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	first := make(chan payment, 1)
	go func() { first <- post(ctx, a, srv.URL, "pay:big-1", body) }()
	<-inProgress
	second := make(chan payment, 1)
	go func() { second <- post(ctx, b, srv.URL, "pay:big-1", body) }()
	// The other body on a third machine: on B it could reach B's flight of
	// the action before B's own request does (the goroutine above is not
	// ordered with it), and B's request would then be refused against it, as
	// guarantee 9 has a request refused against the one in flight first.
	other := post(ctx, machine(t, table), srv.URL, "pay:big-1", body[:len(body)-1]+"X")
	if !errors.Is(other.err, idemretry.ErrFingerprintMismatch) {
		t.Errorf("another body under the action: %d %v, want ErrFingerprintMismatch", other.status, other.err)
	}
	time.Sleep(200 * time.Millisecond) // machine B waits for A's lease
	close(release)
	p1, p2 := <-first, <-second
	if p1.err != nil || p2.err != nil || p1.body != p2.body {
		t.Errorf("machine A: %d %q %v; machine B: %d %q %v: want one answer", p1.status, p1.body, p1.err, p2.status, p2.body, p2.err)
	}
	if n := srv.chargeCount(); n != 1 {
		t.Errorf("%d charges", n)
	}
	keys := srv.keysOf(body)
	for _, k := range keys {
		if k != keys[0] {
			t.Errorf("the payment arrived under keys %v, want one", keys)
			break
		}
	}
	if n := len(srv.keysOf(body[:len(body)-1] + "X")); n != 0 {
		t.Errorf("the other body was sent %d times", n)
	}
}
