package sqljournal_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/idemretry/idemretry/journal"
	"github.com/idemretry/idemretry/sqljournal"
)

// legacyDDL is the table as Open created it before it recorded the id
// mode: the same columns, no comment.
const legacyDDL = `(
	action_id   text     PRIMARY KEY,
	key         text     NOT NULL,
	fingerprint bytea    NOT NULL,
	created_at  bigint   NOT NULL,
	state       smallint NOT NULL,
	attempts    integer  NOT NULL,
	status      integer  NOT NULL
)`

// Processes that disagree on WithHashedIDs over one table would give
// one action two keys (one under its id, one under its digest): the table
// records its mode when Open creates it, and an Open in the other mode is
// refused with journal.ErrIncompatible, as the file journal refuses it.
func TestOpenRefusesOtherIDMode(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	modes := map[bool][]sqljournal.Option{false: nil, true: {sqljournal.WithHashedIDs()}}
	for _, first := range []bool{false, true} {
		table := newTable(t, db)
		open := func(hashed bool, extra ...sqljournal.Option) (*sqljournal.Journal, error) {
			opts := append([]sqljournal.Option{sqljournal.WithTable(table)}, modes[hashed]...)
			return sqljournal.Open(ctx, db, append(opts, extra...)...)
		}
		j, err := open(first)
		if err != nil {
			t.Fatal(err)
		}
		mustReserve(t, j, rec("pay:1", "k1", 0, journal.StatePending), journal.ReuseAny, true)
		j.Close()
		for _, extra := range [][]sqljournal.Option{nil, {sqljournal.WithoutCreateTable()}} {
			_, err := open(!first, extra...)
			t.Logf("table made with hashed=%v, Open with hashed=%v (creating: %v): %v", first, !first, extra == nil, err)
			if !errors.Is(err, journal.ErrIncompatible) {
				t.Errorf("table made with hashed=%v, Open with hashed=%v (creating: %v): %v, want journal.ErrIncompatible", first, !first, extra == nil, err)
			} else if strings.Count(err.Error(), "idemretry: ") != 1 {
				t.Errorf("error %q: want the idemretry: prefix once", err)
			}
			j, err := open(first, extra...)
			if err != nil {
				t.Fatalf("Open in the table's own mode: %v", err)
			}
			mustReserve(t, j, rec("pay:1", "k2", 0, journal.StatePending), journal.ReuseAny, false)
			j.Close()
		}
	}
}

// An empty table made by an earlier version (no recorded mode) takes the
// mode of the first Open; one with records is judged by them.
func TestOpenLegacyTableIDMode(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	hashed := sqljournal.WithHashedIDs()

	empty := newTable(t, db)
	if _, err := db.Exec(`CREATE TABLE "` + empty + `" ` + legacyDDL); err != nil {
		t.Fatal(err)
	}
	j, err := sqljournal.Open(ctx, db, sqljournal.WithTable(empty), hashed)
	if err != nil {
		t.Fatalf("Open of an empty legacy table: %v", err)
	}
	j.Close()
	if _, err := sqljournal.Open(ctx, db, sqljournal.WithTable(empty)); !errors.Is(err, journal.ErrIncompatible) {
		t.Errorf("plain Open of a legacy table first opened hashed: %v, want journal.ErrIncompatible", err)
	}

	for _, tc := range []struct {
		name   string
		stored string
		hashed bool // the mode its rows show
	}{
		{"plain", "pay:order-1", false},
		{"hashed", "sha256:" + strings.Repeat("ab", 32), true},
	} {
		table := newTable(t, db)
		if _, err := db.Exec(`CREATE TABLE "` + table + `" ` + legacyDDL); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(`INSERT INTO "`+table+`" VALUES ($1, 'k1', $2, 0, 1, 0, 0)`, tc.stored, make([]byte, 32)); err != nil {
			t.Fatal(err)
		}
		other := []sqljournal.Option{sqljournal.WithTable(table)}
		same := []sqljournal.Option{sqljournal.WithTable(table)}
		if tc.hashed {
			same = append(same, hashed)
		} else {
			other = append(other, hashed)
		}
		for _, extra := range []sqljournal.Option{sqljournal.WithoutCreateTable(), sqljournal.WithTable(table)} {
			if _, err := sqljournal.Open(ctx, db, append(other, extra)...); !errors.Is(err, journal.ErrIncompatible) {
				t.Errorf("%s legacy table, Open in the other mode: %v, want journal.ErrIncompatible", tc.name, err)
			}
		}
		j, err := sqljournal.Open(ctx, db, same...)
		if err != nil {
			t.Fatalf("%s legacy table, Open in its mode: %v", tc.name, err)
		}
		j.Close()
	}
}

// Machines starting together in different modes on a new table: one mode
// wins, every Open in the other fails.
func TestOpenConcurrentModes(t *testing.T) {
	db := testDB(t)
	table := newTable(t, db)
	openInBothModes(t, db, table)
}

// An existing table whose action_id has no unique key (Reserve's INSERT ...
// ON CONFLICT (action_id) needs one) is refused by Open, not by every
// Reserve after it.
func TestOpenRequiresUniqueActionID(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	cols := strings.Replace(currentDDL, "PRIMARY KEY", "NOT NULL", 1)
	for _, tc := range []struct {
		name string
		ddl  []string // %s is the quoted table
		ok   bool
	}{
		{"no key", nil, false},
		{"plain index", []string{`CREATE INDEX ON %s (action_id)`}, false},
		{"composite unique", []string{`CREATE UNIQUE INDEX ON %s (action_id, key)`}, false},
		{"partial unique", []string{`CREATE UNIQUE INDEX ON %s (action_id) WHERE state = 1`}, false},
		{"deferrable unique", []string{`ALTER TABLE %s ADD UNIQUE (action_id) DEFERRABLE`}, false},
		{"state of another type", []string{`ALTER TABLE %s ADD PRIMARY KEY (action_id)`, `ALTER TABLE %s ALTER state TYPE text`}, false},
		{"unique constraint", []string{`ALTER TABLE %s ADD UNIQUE (action_id)`}, true},
		{"unique index", []string{`CREATE UNIQUE INDEX ON %s (action_id)`}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table := newTable(t, db)
			q := `"` + table + `"`
			if _, err := db.Exec(`CREATE TABLE ` + q + ` ` + cols); err != nil {
				t.Fatal(err)
			}
			for _, s := range tc.ddl {
				if _, err := db.Exec(strings.ReplaceAll(s, "%s", q)); err != nil {
					t.Fatal(err)
				}
			}
			for _, extra := range []sqljournal.Option{sqljournal.WithoutCreateTable(), nil} {
				j, err := sqljournal.Open(ctx, db, sqljournal.WithTable(table), extra)
				if !tc.ok {
					t.Logf("Open: %v", err)
					want := "unique"
					if strings.Contains(tc.name, "type") {
						want = "types"
					}
					if !errors.Is(err, journal.ErrIncompatible) || !strings.Contains(err.Error(), want) {
						t.Errorf("Open: %v, want journal.ErrIncompatible saying %q", err, want)
					}
					continue
				}
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				mustReserve(t, j, rec("pay:1", "k1", 0, journal.StatePending), journal.ReuseAny, extra != nil)
				mustReserve(t, j, rec("pay:1", "k2", 0, journal.StatePending), journal.ReusePending, false)
				j.Close()
			}
		})
	}
}

// Open takes no nil option as a crash: it is skipped, as NewTransport
// skips one.
func TestOpenNilOption(t *testing.T) {
	ctx := context.Background()
	if _, err := sqljournal.Open(ctx, nil, nil); !errors.Is(err, sqljournal.ErrInvalidOption) {
		t.Errorf("nil db, nil option: %v, want ErrInvalidOption", err)
	}
	db := testDB(t)
	table := newTable(t, db)
	j, err := sqljournal.Open(ctx, db, nil, sqljournal.WithTable(table), nil)
	if err != nil {
		t.Fatalf("Open with nil options: %v", err)
	}
	defer j.Close()
	mustReserve(t, j, rec("pay:1", "k1", 0, journal.StatePending), journal.ReuseAny, true)
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM "` + table + `"`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the options around the nil ones were not applied: %d rows in %s (%v)", n, table, err)
	}
}

// openInBothModes opens table from 10 goroutines at once, alternating plain
// and hashed ids, and checks that exactly the 5 Opens of one mode succeed
// (the others failing with ErrIncompatible). It returns the Opens per mode
// (key: hashed).
func openInBothModes(t *testing.T, db *sql.DB, table string) map[bool]int {
	t.Helper()
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		opened = map[bool]int{}
	)
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			opts := []sqljournal.Option{sqljournal.WithTable(table)}
			if i%2 == 1 {
				opts = append(opts, sqljournal.WithHashedIDs())
			}
			j, err := sqljournal.Open(context.Background(), db, opts...)
			switch {
			case errors.Is(err, journal.ErrIncompatible):
			case err != nil:
				t.Errorf("Open: %v", err)
			default:
				j.Close()
				mu.Lock()
				opened[i%2 == 1]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(opened) != 1 || opened[false]+opened[true] != 5 {
		t.Fatalf("opened per mode (hashed?): %v, want the 5 Opens of one mode", opened)
	}
	return opened
}

// A table made by the previous schema (no key_form: by an earlier version,
// or by hand from its documentation) is refused WithoutCreateTable, with
// what to run; an Open that may create tables adds the column. Its rows
// read unrecorded (the Transport sends their keys in its WithQuotedKey form,
// as the earlier version did), and every form Reserve is given from then
// on is kept, for every Journal on the table. A row an earlier version
// inserts into the upgraded table (naming no key_form) reads unrecorded.
func TestKeyFormColumnOnOlderTable(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	old := `INSERT INTO "%s" (action_id, key, fingerprint, created_at, state, attempts, status) VALUES ($1, $2, $3, 0, 1, 1, 0)`
	table := newTable(t, db)
	if _, err := db.Exec(`CREATE TABLE "` + table + `" ` + previousDDL); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(fmt.Sprintf(old, table), "pay:1", "k1", make([]byte, 32)); err != nil {
		t.Fatal(err)
	}
	_, err := sqljournal.Open(ctx, db, sqljournal.WithTable(table), sqljournal.WithoutCreateTable())
	t.Logf("Open WithoutCreateTable of a table without key_form: %v", err)
	if !errors.Is(err, journal.ErrIncompatible) || !strings.Contains(err.Error(), "ADD COLUMN key_form smallint NOT NULL DEFAULT 0") ||
		strings.Count(err.Error(), "idemretry: ") != 1 {
		t.Fatalf("Open WithoutCreateTable of a table without key_form: %v, want journal.ErrIncompatible saying what to run", err)
	}
	j := openOn(t, db, table)
	got := mustReserve(t, j, rec("pay:1", "k2", 0, journal.StatePending), journal.ReuseAny, false)
	if got.Key != "k1" || got.KeyForm != journal.KeyFormUnrecorded {
		t.Fatalf("the upgraded table's row: key %q, form %v; want k1, unrecorded", got.Key, got.KeyForm)
	}
	for i, f := range []journal.KeyForm{journal.KeyFormBare, journal.KeyFormQuoted} {
		r := rec(fmt.Sprint("pay:new-", i), "k3", 0, journal.StatePending)
		r.KeyForm = f
		mustReserve(t, j, r, journal.ReuseAny, true)
	}
	if _, err := db.Exec(fmt.Sprintf(old, table), "pay:by-an-earlier-version", "k4", make([]byte, 32)); err != nil {
		t.Fatal(err)
	}
	// Another Journal on the table (a restart, another machine), not
	// allowed to change it.
	j2, err := sqljournal.Open(ctx, db, sqljournal.WithTable(table), sqljournal.WithoutCreateTable())
	if err != nil {
		t.Fatalf("Open WithoutCreateTable after the upgrade: %v", err)
	}
	defer j2.Close()
	want := map[string]journal.KeyForm{"pay:1": journal.KeyFormUnrecorded, "pay:new-0": journal.KeyFormBare,
		"pay:new-1": journal.KeyFormQuoted, "pay:by-an-earlier-version": journal.KeyFormUnrecorded}
	un, err := j2.Unfinished(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(un) != len(want) {
		t.Fatalf("Unfinished: %d records, want %d", len(un), len(want))
	}
	for _, r := range un {
		if r.KeyForm != want[r.ActionID] {
			t.Errorf("%s: form %v, want %v", r.ActionID, r.KeyForm, want[r.ActionID])
		}
	}

	// The statement the error names, run by hand, is the upgrade.
	manual := newTable(t, db)
	if _, err := db.Exec(`CREATE TABLE "` + manual + `" ` + previousDDL); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`ALTER TABLE "` + manual + `" ADD COLUMN key_form smallint NOT NULL DEFAULT 0`); err != nil {
		t.Fatal(err)
	}
	j3, err := sqljournal.Open(ctx, db, sqljournal.WithTable(manual), sqljournal.WithoutCreateTable())
	if err != nil {
		t.Fatalf("Open WithoutCreateTable after the ALTER TABLE: %v", err)
	}
	j3.Close()

	// A key_form of another type is refused, whoever made it.
	bad := newTable(t, db)
	if _, err := db.Exec(`CREATE TABLE "` + bad + `" ` + strings.Replace(currentDDL, "key_form     smallint NOT NULL DEFAULT 0", "key_form text", 1)); err != nil {
		t.Fatal(err)
	}
	for _, extra := range []sqljournal.Option{nil, sqljournal.WithoutCreateTable()} {
		_, err := sqljournal.Open(ctx, db, sqljournal.WithTable(bad), extra)
		t.Logf("key_form of type text: %v", err)
		if !errors.Is(err, journal.ErrIncompatible) {
			t.Errorf("Open of a table whose key_form is text: %v, want journal.ErrIncompatible", err)
		}
	}
}
