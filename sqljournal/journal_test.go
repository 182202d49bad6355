package sqljournal_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"math"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
	"github.com/idemretry/idemretry/sqljournal"
)

func TestOpenRejectsBadOptions(t *testing.T) {
	ctx := context.Background()
	invalid := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, sqljournal.ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", what, err)
		} else if msg := err.Error(); !strings.HasPrefix(msg, "sqljournal: ") || strings.Count(msg, "idemretry: ") != 1 {
			t.Errorf("%s: %q, want the sqljournal: prefix and idemretry: once", what, msg)
		}
	}
	_, err := sqljournal.Open(ctx, nil)
	invalid("nil db", err)
	db := testDB(t)
	bad := []string{"", "1abc", "a-b", `a"; DROP TABLE x; --`, "a.b.c", ".a", "a.", "tab le",
		"é", strings.Repeat("a", 49), "a\x00"}
	for _, name := range bad {
		_, err := sqljournal.Open(ctx, db, sqljournal.WithTable(name))
		invalid(fmt.Sprintf("table %q", name), err)
	}
	for _, d := range []time.Duration{0, -time.Hour, math.MinInt64} {
		_, err := sqljournal.Open(ctx, db, sqljournal.WithKeyWindow(d))
		invalid(fmt.Sprintf("key window %v", d), err)
	}
	for _, d := range []time.Duration{-time.Nanosecond, -time.Hour, math.MinInt64} {
		_, err := sqljournal.Open(ctx, db, sqljournal.WithGrace(d))
		invalid(fmt.Sprintf("grace %v", d), err)
	}
	// Their sum must be a time.Duration: not wrapped round, not clamped.
	_, err = sqljournal.Open(ctx, db, sqljournal.WithKeyWindow(math.MaxInt64/2+1), sqljournal.WithGrace(math.MaxInt64/2+1))
	invalid("key window and grace over the longest duration", err)
	_, err = sqljournal.Open(ctx, db, sqljournal.WithKeyWindow(math.MaxInt64), sqljournal.WithGrace(time.Nanosecond))
	invalid("the longest key window plus a nanosecond", err)
	_, err = sqljournal.Open(ctx, db, sqljournal.WithClock(nil))
	invalid("nil clock", err)
}

func TestOpenWithoutCreateTable(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	table := newTable(t, db)
	if _, err := sqljournal.Open(ctx, db, sqljournal.WithTable(table), sqljournal.WithoutCreateTable()); err == nil {
		t.Fatal("Open of a missing table without creating it succeeded")
	}
	j, err := sqljournal.Open(ctx, db, sqljournal.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	j.Close()
	j, err = sqljournal.Open(ctx, db, sqljournal.WithTable(table), sqljournal.WithoutCreateTable())
	if err != nil {
		t.Fatalf("Open of an existing table: %v", err)
	}
	mustReserve(t, j, rec("pay:1", "k1", 0, journal.StatePending), journal.ReuseAny, true)
}

func TestOpenRejectsForeignTable(t *testing.T) {
	db := testDB(t)
	table := newTable(t, db)
	if _, err := db.Exec(`CREATE TABLE "` + table + `" (action_id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	if _, err := sqljournal.Open(context.Background(), db, sqljournal.WithTable(table)); !errors.Is(err, journal.ErrIncompatible) {
		t.Fatalf("Open of a table without the journal's columns: %v, want journal.ErrIncompatible", err)
	}
}

func TestOpenSchemaQualified(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	var b [6]byte
	rand.Read(b[:])
	schema := "sqlj_schema_" + hex.EncodeToString(b[:])
	if _, err := db.Exec(`CREATE SCHEMA "` + schema + `"`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Exec(`DROP SCHEMA "` + schema + `" CASCADE`) })
	j, err := sqljournal.Open(ctx, db, sqljournal.WithTable(schema+".Keys"))
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	mustReserve(t, j, rec("pay:1", "k1", 0, journal.StatePending), journal.ReuseAny, true)
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM "` + schema + `"."Keys"`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows in %s.Keys: %d, %v", schema, n, err)
	}
}

// Machines of a fleet start together; creating the table must not trip
// over itself.
func TestOpenConcurrently(t *testing.T) {
	db := testDB(t)
	table := newTable(t, db)
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j, err := sqljournal.Open(context.Background(), db, sqljournal.WithTable(table))
			if err != nil {
				t.Errorf("concurrent Open: %v", err)
				return
			}
			j.Close()
		}()
	}
	wg.Wait()
}

func TestCloseLeavesDBOpen(t *testing.T) {
	db := testDB(t)
	j, _ := openJournal(t, db)
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Ping(); err != nil {
		t.Fatalf("db after Journal.Close: %v", err)
	}
}

func TestMalformedRecord(t *testing.T) {
	db := testDB(t)
	j, table := openJournal(t, db)
	if _, err := db.Exec(`INSERT INTO "` + table + `" VALUES ('pay:1', 'k', '\x0102'::bytea, 0, 1, 0, 0)`); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	malformed := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, sqljournal.ErrMalformedRecord) {
			t.Errorf("%s: %v, want ErrMalformedRecord", what, err)
		} else if msg := err.Error(); strings.Count(msg, "idemretry: ") != 1 || strings.Count(msg, "sqljournal: ") != 1 {
			t.Errorf("%s: %q, want the sqljournal: and idemretry: prefixes once each", what, msg)
		}
	}
	_, _, err := j.Reserve(ctx, rec("pay:1", "k2", 0, journal.StatePending), journal.ReuseAny)
	malformed("Reserve of a malformed record", err)
	_, err = j.Unfinished(ctx)
	malformed("Unfinished with a malformed record", err)
}

// A table made by hand (a DBA's, opened WithoutCreateTable, or before
// Open created it) may lack the NOT NULL of Open's columns: a row with a
// NULL in one is a record no Journal writes, ErrMalformedRecord (and
// journal.ErrCorruptRecord) from Reserve, Get and Unfinished, and a
// payment of its action is refused with nothing sent (Unfinished names a
// row whose state is NULL too). Before: each failed
// with database/sql's "converting NULL to string is unsupported", which
// wraps neither, so the app could not tell it from any other failure.
func TestMalformedRecordNullColumns(t *testing.T) {
	db := testDB(t)
	lost := newUnstartedChargeServer(t) // charges, and loses every answer
	lost.dropAnswers = true
	lost.Start()
	srv := newChargeServer(t)
	nullable := strings.NewReplacer(" NOT NULL", "").Replace(currentDDL)
	for _, col := range []string{"key", "fingerprint", "created_at", "state", "attempts", "status"} {
		t.Run(col, func(t *testing.T) {
			table := newTable(t, db)
			if _, err := db.Exec(`CREATE TABLE "` + table + `" ` + nullable); err != nil {
				t.Fatal(err)
			}
			j := openOn(t, db, table, sqljournal.WithoutCreateTable())
			tr := transportOn(t, j, idemretry.WithMaxRetries(0))
			if p := post(context.Background(), tr, lost.URL, "pay:null-"+col, `{"order":"null-`+col+`"}`); p.err == nil {
				t.Fatalf("the first answer was not lost: %+v", p)
			}
			if _, err := db.Exec(`UPDATE "`+table+`" SET `+col+` = NULL WHERE action_id = $1`, "pay:null-"+col); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			check := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, sqljournal.ErrMalformedRecord) || !errors.Is(err, journal.ErrCorruptRecord) {
					t.Errorf("%s of a row with a NULL %s: %v, want ErrMalformedRecord", what, col, err)
				}
			}
			_, _, err := j.Reserve(ctx, rec("pay:null-"+col, "k2", 0, journal.StatePending), journal.ReuseAny)
			check("Reserve", err)
			_, _, err = j.Get(ctx, "pay:null-"+col)
			check("Get", err)
			_, err = j.Unfinished(ctx)
			check("Unfinished", err)
			p := post(ctx, tr, srv.URL, "pay:null-"+col, `{"order":"null-`+col+`"}`)
			check("a payment", p.err)
			if keys := srv.keysOf(`{"order":"null-` + col + `"}`); len(keys) != 0 {
				t.Errorf("the payment was sent again, under %q", keys)
			}
		})
	}
}

// markLine is the line of a table's comment that records its id mode, as
// Open documents it.
const markLine = "idemretry.sqljournal.action_ids="

// commentedTable creates a new table by hand, as a DBA would, with comment
// as its comment, and returns its name.
func commentedTable(t *testing.T, db *sql.DB, comment string) string {
	t.Helper()
	ctx := context.Background()
	table := newTable(t, db)
	if _, err := db.ExecContext(ctx, `CREATE TABLE "`+table+`" `+legacyDDL); err != nil {
		t.Fatal(err)
	}
	// A parameter cannot stand for the comment; quote_literal builds the
	// literal on the server from the parameter.
	var lit string
	if err := db.QueryRowContext(ctx, `SELECT quote_literal($1::text)`, comment).Scan(&lit); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `COMMENT ON TABLE "`+table+`" IS `+lit); err != nil {
		t.Fatal(err)
	}
	return table
}

// tableComment returns table's comment ("" for none).
func tableComment(t *testing.T, db *sql.DB, table string) string {
	t.Helper()
	var c sql.NullString
	if err := db.QueryRow(`SELECT obj_description($1::regclass, 'pg_class')`, `"`+table+`"`).Scan(&c); err != nil {
		t.Fatal(err)
	}
	return c.String
}

// A table made by hand with a comment of its own (no mode mark) must still
// get the mark from the first creating Open, or an empty table tells
// nothing and both modes are accepted: one action, two keys. The mark is
// added as a line of its own; the comment's text is kept.
func TestForeignCommentGetsModeMark(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	const comment = "payment idempotency keys"
	table := commentedTable(t, db, comment)
	plain, err := sqljournal.Open(ctx, db, sqljournal.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	hashed, err := sqljournal.Open(ctx, db, sqljournal.WithTable(table), sqljournal.WithHashedIDs())
	if err == nil {
		defer hashed.Close()
		rec := journal.Record{ActionID: "pay:1", CreatedAt: time.Now(), State: journal.StatePending}
		rec.Key = "key-a"
		a, _, _ := plain.Reserve(ctx, rec, journal.ReuseAny)
		rec.Key = "key-b"
		b, _, _ := hashed.Reserve(ctx, rec, journal.ReuseAny)
		t.Fatalf("Open in the other mode accepted; one action, two keys: %q and %q", a.Key, b.Key)
	}
	if !errors.Is(err, journal.ErrIncompatible) {
		t.Fatalf("want ErrIncompatible, got %v", err)
	}
	if got, want := tableComment(t, db, table), comment+"\n"+markLine+"plain"; got != want {
		t.Fatalf("comment %q, want %q: the original text kept, the mark added", got, want)
	}
	// Marked once: Opens in the table's mode leave the comment as it is.
	for _, extra := range []sqljournal.Option{nil, sqljournal.WithoutCreateTable()} {
		j, err := sqljournal.Open(ctx, db, sqljournal.WithTable(table), extra)
		if err != nil {
			t.Fatalf("Open in the table's mode: %v", err)
		}
		j.Close()
	}
	if got, want := tableComment(t, db, table), comment+"\n"+markLine+"plain"; got != want {
		t.Fatalf("comment after more Opens %q, want %q", got, want)
	}
}

// The comment's text is kept byte for byte, whatever it holds: quotes,
// backslashes, several lines, a trailing newline, non-ASCII text, and a
// line that only looks like a mark.
func TestForeignCommentKeptExactly(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	for _, tc := range []struct{ name, comment, want string }{
		{"quotes", `it's "ours" \n \\ $$ E'x'`, `it's "ours" \n \\ $$ E'x'` + "\n" + markLine + "sha256"},
		{"lines", "line one\nline two", "line one\nline two\n" + markLine + "sha256"},
		{"trailing newline", "owned by payments\n", "owned by payments\n" + markLine + "sha256"},
		{"unicode", "clés d'idempotence ✓", "clés d'idempotence ✓\n" + markLine + "sha256"},
		{"look-alike", "see " + markLine + "plain", "see " + markLine + "plain\n" + markLine + "sha256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table := commentedTable(t, db, tc.comment)
			j, err := sqljournal.Open(ctx, db, sqljournal.WithTable(table), sqljournal.WithHashedIDs())
			if err != nil {
				t.Fatal(err)
			}
			j.Close()
			if got := tableComment(t, db, table); got != tc.want {
				t.Fatalf("comment %q, want %q", got, tc.want)
			}
			if _, err := sqljournal.Open(ctx, db, sqljournal.WithTable(table)); !errors.Is(err, journal.ErrIncompatible) {
				t.Fatalf("plain Open of a table marked hashed: %v, want journal.ErrIncompatible", err)
			}
		})
	}
}

// Machines starting together in different modes on an empty table with a
// foreign comment: one mode wins, every Open in the other fails.
func TestForeignCommentConcurrentModes(t *testing.T) {
	db := testDB(t)
	for range 3 {
		table := commentedTable(t, db, "payment idempotency keys")
		opened := openInBothModes(t, db, table)
		mode := "plain"
		if opened[true] > 0 {
			mode = "sha256"
		}
		if got, want := tableComment(t, db, table), "payment idempotency keys\n"+markLine+mode; got != want {
			t.Fatalf("comment %q, want %q", got, want)
		}
	}
}

// A commented table whose rows show one mode is not marked with the other
// by a refused Open; an Open in the rows' mode marks it.
func TestForeignCommentRowsDecide(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	const comment = "payment idempotency keys"
	table := commentedTable(t, db, comment)
	if _, err := db.Exec(`INSERT INTO "`+table+`" VALUES ('pay:order-1', 'k1', $1, 0, 1, 0, 0)`, make([]byte, 32)); err != nil {
		t.Fatal(err)
	}
	if _, err := sqljournal.Open(ctx, db, sqljournal.WithTable(table), sqljournal.WithHashedIDs()); !errors.Is(err, journal.ErrIncompatible) {
		t.Fatalf("hashed Open of a table with plain ids: %v, want journal.ErrIncompatible", err)
	}
	if got := tableComment(t, db, table); got != comment {
		t.Fatalf("a refused Open changed the comment to %q", got)
	}
	j, err := sqljournal.Open(ctx, db, sqljournal.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	j.Close()
	if got, want := tableComment(t, db, table), comment+"\n"+markLine+"plain"; got != want {
		t.Fatalf("comment %q, want %q", got, want)
	}
}

// sqljournal is a journal like any third party's: its code reaches
// idemretry's module only through the seam package journal, never through
// the Transport's package (whose internals it must not depend on, and
// which would pull the Transport into every program that only opens a
// table). Tests and examples may use the whole module.
func TestImportsOnlyTheSeam(t *testing.T) {
	const (
		module = "github.com/idemretry/idemretry"
		seam   = module + "/journal"
		own    = module + "/sqljournal"
	)
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked, seamUsers := 0, 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range f.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				t.Fatalf("%s: import %s: %v", name, imp.Path.Value, err)
			}
			switch {
			case path == seam:
				seamUsers++
			case path == own || strings.HasPrefix(path, own+"/"):
			case path == module || strings.HasPrefix(path, module+"/"):
				t.Errorf("%s imports %s: sqljournal's code may import only %s of its parent module", fset.Position(imp.Pos()), path, seam)
			}
		}
	}
	if checked == 0 || seamUsers == 0 {
		t.Fatalf("read %d non-test files, %d importing %s: wrong directory?", checked, seamUsers, seam)
	}
}

// journalCall is one of the Journal's calls that reach the database.
type journalCall struct {
	name string
	call func(ctx context.Context, j *sqljournal.Journal) error
}

// journalCalls returns every call, on the action of r (already reserved)
// and on fresh ones.
func journalCalls(r journal.Record) []journalCall {
	return []journalCall{
		{"Reserve", func(ctx context.Context, j *sqljournal.Journal) error {
			_, _, err := j.Reserve(ctx, rec("pay:fresh", "k-fresh", 0, journal.StatePending), journal.ReuseAny)
			return err
		}},
		{"Update", func(ctx context.Context, j *sqljournal.Journal) error {
			u := r
			u.State, u.Attempts, u.Status = journal.StateDone, 1, 201
			return j.Update(ctx, u)
		}},
		{"Forget", func(ctx context.Context, j *sqljournal.Journal) error { return j.Forget(ctx, "pay:other") }},
		{"Unfinished", func(ctx context.Context, j *sqljournal.Journal) error { _, err := j.Unfinished(ctx); return err }},
		{"Expire", func(ctx context.Context, j *sqljournal.Journal) error { _, err := j.Expire(ctx); return err }},
		{"Lease", func(ctx context.Context, j *sqljournal.Journal) error {
			_, _, err := j.Lease(ctx, r.ActionID, "machine-a", time.Minute)
			return err
		}},
		{"Release", func(ctx context.Context, j *sqljournal.Journal) error { return j.Release(ctx, r.ActionID, "machine-a") }},
	}
}

// recNow is a pending record created now, so that Expire keeps it when done.
func recNow(id, key string) journal.Record {
	r := rec(id, key, 0, journal.StatePending)
	r.CreatedAt = time.Now().Truncate(time.Millisecond)
	return r
}

// reservedJournal opens a Journal on a fresh table of db, closed when t
// ends, and reserves in it the record that journalCalls then works on.
func reservedJournal(t *testing.T, db *sql.DB) (*sqljournal.Journal, string, journal.Record) {
	t.Helper()
	j, table := openJournal(t, db)
	r := recNow("pay:1", "k1")
	mustReserve(t, j, r, journal.ReuseAny, true)
	return j, table, r
}

// driverError reports whether err carries an error of the driver or the
// network underneath the Journal's own wrapping.
func driverError(err error) bool {
	var (
		pgErr   *pgconn.PgError
		connErr *pgconn.ConnectError
		netErr  net.Error
	)
	return errors.As(err, &pgErr) || errors.As(err, &connErr) || errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// unavailable fails t unless err says the journal is unavailable, keeps
// the driver's error, and carries the "idemretry: " prefix once.
func unavailable(t *testing.T, what string, err error) {
	t.Helper()
	t.Logf("%s: %v", what, err)
	switch {
	case !errors.Is(err, journal.ErrUnavailable):
		t.Errorf("%s: %v, want an error wrapping journal.ErrUnavailable", what, err)
	case !driverError(err) && !errors.Is(err, context.DeadlineExceeded):
		t.Errorf("%s: %v (%T), want the driver's error kept in the chain", what, err, errors.Unwrap(err))
	case strings.Count(err.Error(), "idemretry: ") != 1:
		t.Errorf("%s: %q, want the idemretry: prefix once", what, err)
	}
}

// With the server stopped, every call fails at once with an error that
// wraps journal.ErrUnavailable and the driver's error; once it is back, the
// same Journal works again.
func TestUnavailableServerStopped(t *testing.T) {
	c := ownCluster(t)
	db := c.db()
	ctx := context.Background()
	j, _, r := reservedJournal(t, db)

	c.stop()
	for _, call := range journalCalls(r) {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err := call.call(cctx, j)
		cancel()
		unavailable(t, call.name+" with the server stopped", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	_, err := sqljournal.Open(cctx, db, sqljournal.WithTable("another"))
	cancel()
	unavailable(t, "Open with the server stopped", err)

	c.start()
	got := mustReserve(t, j, rec("pay:1", "k2", 0, journal.StatePending), journal.ReuseAny, false)
	if got.Key != "k1" {
		t.Fatalf("after the restart: key %s, want k1", got.Key)
	}
}

// A connection killed (pg_terminate_backend) while its statement waits
// fails the call with journal.ErrUnavailable and the server's error, and the
// statement did not take effect.
func TestUnavailableConnectionKilled(t *testing.T) {
	db := testDB(t)
	j, table, r := reservedJournal(t, db)
	ctx := context.Background()

	for _, call := range journalCalls(r) {
		holder, err := holdLock(db, lockTable(table))
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() { errc <- call.call(ctx, j) }()
		pid, err := lockWaiter(db, table)
		if err != nil {
			t.Fatal(err)
		}
		var killed bool
		if err := db.QueryRowContext(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&killed); err != nil || !killed {
			t.Fatalf("pg_terminate_backend(%d): %v, %v", pid, killed, err)
		}
		select {
		case err = <-errc:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s did not return after its connection was killed", call.name)
		}
		holder.Rollback()
		unavailable(t, call.name+" on a killed connection", err)
	}
	// Nothing the killed statements ran took effect, and the journal works.
	rows := rowsOf(t, db, table)
	if len(rows) != 1 || rows[0].key != "k1" || rows[0].state != journal.StatePending {
		t.Fatalf("after the killed calls: %+v, want pay:1 pending alone", rows)
	}
	for _, call := range journalCalls(r) {
		if err := call.call(ctx, j); err != nil {
			t.Errorf("%s after the kills: %v", call.name, err)
		}
	}
}

// A call that runs out of its context's time while the database hangs (a
// lock held elsewhere) returns by the deadline with an error wrapping both
// journal.ErrUnavailable and context.DeadlineExceeded. A caller's own
// cancellation is reported as such.
func TestUnavailableDeadline(t *testing.T) {
	db := testDB(t)
	j, table, r := reservedJournal(t, db)
	ctx := context.Background()
	holder, err := holdLock(db, lockTable(table))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	for _, call := range journalCalls(r) {
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err := call.call(cctx, j)
		cancel()
		unavailable(t, call.name+" past its deadline", err)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s past its deadline: %v, want context.DeadlineExceeded too", call.name, err)
		}

		cctx, cancel = context.WithCancel(ctx)
		time.AfterFunc(100*time.Millisecond, cancel)
		if err := call.call(cctx, j); !errors.Is(err, context.Canceled) {
			t.Errorf("%s cancelled: %v, want context.Canceled", call.name, err)
		}
		cancel()
	}
}

// A server that stops answering (every process SIGSTOPped: connections
// stay open, the kernel still accepts new ones) holds no call past its
// context's deadline, with pgx's default cancellation and with a driver
// whose cancellation waits for the server (pgx told to ignore the context,
// as a driver that only sends the server a cancel request would).
func TestBoundedPausedServer(t *testing.T) {
	c := ownCluster(t)
	for _, tc := range []struct {
		name string
		db   func() *sql.DB
	}{
		{"pgx", c.db},
		{"cancellation waits for the server", func() *sql.DB {
			cfg, err := pgx.ParseConfig(c.dsn)
			if err != nil {
				t.Fatal(err)
			}
			cfg.BuildContextWatcherHandler = func(*pgconn.PgConn) ctxwatch.Handler { return ignoreCancel{} }
			db := stdlib.OpenDB(*cfg)
			db.SetMaxOpenConns(10)
			db.SetMaxIdleConns(10)
			t.Cleanup(func() { db.Close() })
			return db
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j, _, r := reservedJournal(t, tc.db())
			ctx := context.Background()
			calls := journalCalls(r)
			for _, call := range calls { // warm the pool: paused connections, not refused ones
				if err := call.call(ctx, j); err != nil {
					t.Fatal(err)
				}
			}
			c.pause()
			defer c.resume()
			const deadline = 300 * time.Millisecond
			for _, call := range calls {
				var err error
				took := within(t, 10*time.Second, call.name+" on a paused server", func() {
					cctx, cancel := context.WithTimeout(ctx, deadline)
					defer cancel()
					err = call.call(cctx, j)
				})
				if took > deadline+time.Second {
					t.Errorf("%s took %v with a %v deadline", call.name, took, deadline)
				}
				unavailable(t, call.name+" on a paused server", err)
			}
			c.resume()
			if got := mustReserve(t, j, rec("pay:1", "k2", 0, journal.StatePending), journal.ReuseAny, false); got.Key != "k1" {
				t.Fatalf("after the pause: key %s, want k1", got.Key)
			}
		})
	}
}

// ignoreCancel is a pgx context handler that does nothing when a context
// ends: a statement then waits for the server's answer, however long.
type ignoreCancel struct{}

func (ignoreCancel) HandleCancel(context.Context) {}
func (ignoreCancel) HandleUnwatchAfterCancel()    {}

// A row lock held by another session (here up to 3 s, as a slow
// transaction elsewhere would) holds no Update, Reserve, Lease, Release or
// Forget past its context's deadline.
func TestBoundedRowLock(t *testing.T) {
	db := testDB(t)
	j, table := openJournal(t, db)
	ctx := context.Background()
	pending := recNow("pay:pending", "k1")
	mustReserve(t, j, pending, journal.ReuseAny, true)
	done := recNow("fp:done", "k2")
	mustReserve(t, j, done, journal.ReusePending, true)
	done.State, done.Status = journal.StateDone, 201
	if err := j.Update(ctx, done); err != nil {
		t.Fatal(err)
	}
	calls := []journalCall{
		{"Update", func(ctx context.Context, j *sqljournal.Journal) error {
			u := pending
			u.State, u.Attempts, u.Status = journal.StateDone, 1, 201
			return j.Update(ctx, u)
		}},
		{"Reserve replacing done", func(ctx context.Context, j *sqljournal.Journal) error {
			_, _, err := j.Reserve(ctx, recNow("fp:done", "k3"), journal.ReusePending)
			return err
		}},
		// A Lease or Release that changes nothing (refused, or not the
		// holder's) does not wait for the row: these renew and end one.
		{"Lease", func(ctx context.Context, j *sqljournal.Journal) error {
			_, _, err := j.Lease(ctx, "pay:pending", "machine-a", time.Minute)
			return err
		}},
		{"Release", func(ctx context.Context, j *sqljournal.Journal) error {
			return j.Release(ctx, "pay:pending", "machine-a")
		}},
		{"Forget", func(ctx context.Context, j *sqljournal.Journal) error { return j.Forget(ctx, "pay:pending") }},
	}
	if held, _, err := j.Lease(ctx, "pay:pending", "machine-a", time.Hour); !held || err != nil {
		t.Fatalf("Lease: %v, %v", held, err)
	}
	for _, call := range calls {
		holder, err := holdLock(db, lockRows(table))
		if err != nil {
			t.Fatal(err)
		}
		release := time.AfterFunc(3*time.Second, func() { holder.Rollback() })
		const deadline = 500 * time.Millisecond
		cctx, cancel := context.WithTimeout(ctx, deadline)
		start := time.Now()
		err = call.call(cctx, j)
		took := time.Since(start)
		cancel()
		if took > deadline+time.Second {
			t.Errorf("%s took %v with a %v deadline under a row lock", call.name, took, deadline)
		}
		unavailable(t, call.name+" under a row lock", err)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s under a row lock: %v, want context.DeadlineExceeded too", call.name, err)
		}
		release.Stop()
		holder.Rollback()
	}
}

// Rows that no Journal writes, put in the table by someone else (an UPDATE
// by hand, a bad migration, a damaged backup): the Transport never sends
// them as they are (issue 26, item 14).

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
// such requests; 'a b' went out as it is); the resend fails, and Resume
// gives the row a result of its own, with an error that says the record
// is corrupt (before issue 30, Resume failed whole).
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
			if err != nil || len(res) != 1 || res[0].Record.ActionID != action || !errors.Is(res[0].Err, journal.ErrCorruptRecord) || res[0].Sent {
				t.Errorf("Resume with the crafted row: %d results, %v; want one, of %s, unsent, journal.ErrCorruptRecord", len(res), err, action)
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
