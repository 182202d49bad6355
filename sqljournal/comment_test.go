package sqljournal_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/idemretry/idemretry/sqljournal"
)

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
	hashed, err := sqljournal.Open(ctx, db, sqljournal.WithTable(table), sqljournal.WithHashedActionIDs())
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
			j, err := sqljournal.Open(ctx, db, sqljournal.WithTable(table), sqljournal.WithHashedActionIDs())
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
	if _, err := sqljournal.Open(ctx, db, sqljournal.WithTable(table), sqljournal.WithHashedActionIDs()); !errors.Is(err, journal.ErrIncompatible) {
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
