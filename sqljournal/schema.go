package sqljournal

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/idemretry/idemretry/journal"
)

// querier is what the schema checks need of a *sql.DB or a *sql.Tx.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// createSchema creates the table and its indexes if they are missing, and
// records the id mode in the table's comment (see markMode). Concurrent CREATE TABLE IF NOT EXISTS statements can
// still collide in PostgreSQL's catalogs (a unique violation on pg_type),
// and two machines must not mark a new table with two modes, so creators
// take a transaction-scoped advisory lock first.
func createSchema(ctx context.Context, db *sql.DB, t table, mode string) (err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback() // the error that matters is err
		}
	}()
	if _, err = tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, t.lockKey()); err != nil {
		return err
	}
	ddl := []string{
		// created_at is in Unix milliseconds, like the file journal: one
		// integer, no time-zone rules, numeric order.
		`CREATE TABLE IF NOT EXISTS ` + t.quoted + ` (
	action_id   text     PRIMARY KEY,
	key         text     NOT NULL,
	fingerprint bytea    NOT NULL,
	created_at  bigint   NOT NULL,
	state       smallint NOT NULL,
	attempts    integer  NOT NULL,
	status      integer  NOT NULL,
	` + leaseDDL + `,
	` + keyFormDDL + `
)`,
		// Expire reads done records by age, off the rest. Unfinished reads
		// every row not done, states no Journal writes too (queries.go),
		// which the unfinished index (states 1 and 3) does not serve.
		`CREATE INDEX IF NOT EXISTS ` + t.index("_unfinished_idx") + ` ON ` + t.quoted +
			` (created_at) WHERE state IN (` + statePending + `, ` + stateUnknown + `)`,
		`CREATE INDEX IF NOT EXISTS ` + t.index("_done_idx") + ` ON ` + t.quoted +
			` (created_at) WHERE state = ` + stateDone,
	}
	for _, s := range ddl {
		if _, err = tx.ExecContext(ctx, s); err != nil {
			return err
		}
	}
	if err = addLeaseColumns(ctx, tx, t); err != nil {
		return err
	}
	if err = addKeyFormColumn(ctx, tx, t); err != nil {
		return err
	}
	if err = markMode(ctx, tx, t, mode); err != nil {
		return err
	}
	return tx.Commit()
}

// leaseColumns are the columns of an action's lease (see Journal.Lease),
// and leaseDDL declares them: no lease when NULL.
const (
	leaseColumns = `lease_holder, lease_until`
	leaseDDL     = `lease_holder text, lease_until timestamptz`
)

// addLeaseColumns adds the lease columns to a table made before leases (by
// an earlier version, or by hand from its documentation), under
// createSchema's lock. It looks in the catalog first, so that a table that
// has them is not locked by an ALTER TABLE at every Open. A table that has
// one of the two, or has them with other types, is left for checkSchema to
// refuse.
func addLeaseColumns(ctx context.Context, tx *sql.Tx, t table) error {
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM pg_attribute
	WHERE attrelid = $1::text::regclass AND attname IN ('lease_holder', 'lease_until') AND attnum > 0 AND NOT attisdropped`,
		t.quoted).Scan(&n); err != nil || n != 0 {
		return err
	}
	_, err := tx.ExecContext(ctx, `ALTER TABLE `+t.quoted+` ADD COLUMN lease_holder text, ADD COLUMN lease_until timestamptz`)
	return err
}

// keyFormDDL declares the column of a key's form (journal.KeyForm): 0
// unrecorded, the value of every row written before the column (or by a
// version that does not name it), 1 bare, 2 quoted.
const keyFormDDL = `key_form smallint NOT NULL DEFAULT 0`

// addKeyFormColumn adds key_form to a table made before keys' forms were
// recorded, under createSchema's lock, after a look in the catalog (as
// addLeaseColumns does). Its rows read unrecorded. PostgreSQL 11 and later
// add a column with a constant default without rewriting the table; older
// ones rewrite it, holding its lock meanwhile. A key_form of another type
// is left for checkSchema to refuse.
func addKeyFormColumn(ctx context.Context, tx *sql.Tx, t table) error {
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM pg_attribute
	WHERE attrelid = $1::text::regclass AND attname = 'key_form' AND attnum > 0 AND NOT attisdropped`,
		t.quoted).Scan(&n); err != nil || n != 0 {
		return err
	}
	_, err := tx.ExecContext(ctx, `ALTER TABLE `+t.quoted+` ADD COLUMN `+keyFormDDL)
	return err
}

// markMode records mode in the table's comment unless the comment records
// a mode already or the table's rows show the other mode (checkMode then
// refuses the Open). A comment of someone else's (a table made by hand)
// keeps its text: the mark is added as a line of its own after it, so that
// a table with a comment is marked as surely as one without. It runs under
// createSchema's lock, and the comment is read under it, so two machines
// cannot mark one table with two modes: the second sees the first's mark.
// Like the DDL before it, it needs the table's owner.
func markMode(ctx context.Context, tx *sql.Tx, t table, mode string) error {
	var comment sql.NullString
	if err := tx.QueryRowContext(ctx, `SELECT obj_description($1::text::regclass, 'pg_class')`, t.quoted).Scan(&comment); err != nil {
		return err
	}
	if _, found, err := parseMark(comment.String); err != nil || found {
		return err // recorded already, or a mark no Open may overwrite
	}
	rowsMode, err := modeOfRows(ctx, tx, t)
	if err != nil || (rowsMode != "" && rowsMode != mode) {
		return err
	}
	text := markComment(mode)
	switch {
	case comment.String == "":
	case strings.HasSuffix(comment.String, "\n"):
		text = comment.String + text
	default:
		text = comment.String + "\n" + text
	}
	// COMMENT takes a literal, not a parameter: the server quotes the text
	// (quote_literal), which may be anyone's, for the statement.
	var literal string
	if err := tx.QueryRowContext(ctx, `SELECT quote_literal($1::text)`, text).Scan(&literal); err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, `COMMENT ON TABLE `+t.quoted+` IS `+literal)
	return err
}

// checkSchema fails unless the table exists and fits the journal's
// statements: the columns they use, of types they accept, and a unique key
// on action_id alone that INSERT ... ON CONFLICT (action_id) can use, so
// that a wrong table is reported by Open, not by the first payment. The
// statements are planned (EXPLAIN), not run: PostgreSQL itself judges
// whether they fit. A table that does not wraps journal.ErrIncompatible.
func checkSchema(ctx context.Context, db querier, t table, q queries) error {
	if err := checkAddedColumns(ctx, db, t); err != nil {
		return err
	}
	rows, err := db.QueryContext(ctx, `SELECT `+columns+` FROM `+t.quoted+` WHERE false`)
	if err != nil {
		return incompatible(err)
	}
	if err := rows.Close(); err != nil {
		return fmt.Errorf("check columns: %w", err)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	// key_form must be a number: a text column would take the smallints
	// by an assignment cast, and hold anything else too.
	if _, err := db.ExecContext(ctx, `EXPLAIN SELECT key_form + 0::smallint FROM `+t.quoted); err != nil {
		return incompatible(err)
	}
	var fp [32]byte
	if _, err := db.ExecContext(ctx, `EXPLAIN `+q.insertReplaceDone, "", "k", fp[:], int64(0), int16(1), 0, 0, int16(0)); err != nil {
		return incompatible(err)
	}
	if _, err := db.ExecContext(ctx, `EXPLAIN `+q.update, "", "k", int16(1), 0, 0); err != nil {
		return incompatible(err)
	}
	// The planner takes a deferrable unique key as an arbiter, and only the
	// executor refuses it, on every insert.
	var deferrable bool
	if err := db.QueryRowContext(ctx, deferrableKey, t.quoted).Scan(&deferrable); err != nil {
		return err
	}
	if deferrable {
		return fmt.Errorf("%w: the table has a deferrable unique key on action_id, which INSERT ... ON CONFLICT (action_id) cannot use: make it not deferrable",
			journal.ErrIncompatible)
	}
	return nil
}

// addedColumns are the columns of later versions than the table's first,
// each group with the ALTER TABLE clause that adds it.
var addedColumns = []struct{ names, clause string }{
	{leaseColumns, "ADD COLUMN lease_holder text, ADD COLUMN lease_until timestamptz"},
	{"key_form", "ADD COLUMN " + keyFormDDL},
}

// checkAddedColumns fails, wrapping journal.ErrIncompatible and saying
// what to run, if the table lacks columns of a later version than the one
// that made it (the lease columns, key_form), as a table made by an
// earlier version, or by hand from its documentation, and opened
// WithoutCreateTable does: an Open that may create tables adds them
// itself (createSchema). Their types are judged by the statements that use
// them (checkSchema, checkLeaseSchema).
func checkAddedColumns(ctx context.Context, db querier, t table) error {
	var missing []string
	for _, c := range addedColumns {
		rows, err := db.QueryContext(ctx, `SELECT `+c.names+` FROM `+t.quoted+` WHERE false`)
		if err != nil {
			var st interface{ SQLState() string }
			if errors.As(err, &st) && st.SQLState() == "42703" { // undefined_column
				missing = append(missing, c.clause)
				continue
			}
			return incompatible(err)
		}
		if err := rows.Close(); err != nil {
			return fmt.Errorf("check columns: %w", err)
		}
		if err := rows.Err(); err != nil {
			return err
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: the table lacks columns of a later version than the one that made it (an Open without WithoutCreateTable adds them; or run ALTER TABLE %s %s)",
			journal.ErrIncompatible, t.quoted, strings.Join(missing, ", "))
	}
	return nil
}

// checkLeaseSchema fails unless the table's lease columns, which
// checkSchema found (checkAddedColumns), are of types Lease and Release
// accept (planned, as checkSchema plans the others).
func checkLeaseSchema(ctx context.Context, db querier, t table, q queries) error {
	if _, err := db.ExecContext(ctx, `EXPLAIN `+q.lease, "", "h", int64(1)); err != nil {
		return incompatible(err)
	}
	if _, err := db.ExecContext(ctx, `EXPLAIN `+q.release, "", "h"); err != nil {
		return incompatible(err)
	}
	return nil
}

// deferrableKey tells whether the table $1 has a deferrable unique index
// on action_id alone.
const deferrableKey = `SELECT EXISTS (SELECT 1 FROM pg_index i
	JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
	WHERE i.indrelid = $1::text::regclass AND i.indisunique AND NOT i.indimmediate
	AND i.indnatts = 1 AND i.indpred IS NULL AND i.indexprs IS NULL AND a.attname = 'action_id')`

// incompatible wraps an error that says the table does not fit the
// journal's statements (SQLSTATE class 42, a missing table or privilege
// aside) with journal.ErrIncompatible and why; any other error is returned
// as it is.
func incompatible(err error) error {
	var st interface{ SQLState() string }
	if !errors.As(err, &st) {
		return err
	}
	why := "has columns of other types than the journal's (see Open)"
	switch code := st.SQLState(); {
	case code == "42P10": // invalid_column_reference: no arbiter index for ON CONFLICT
		why = "has no unique index or primary key on action_id alone, which INSERT ... ON CONFLICT (action_id) needs"
	case code == "42703": // undefined_column
		why = "lacks a column the journal uses (see Open)"
	case !strings.HasPrefix(code, "42") || code == "42P01" || code == "42501":
		return err // not a mismatch: a missing table, a missing privilege, ...
	}
	return fmt.Errorf("%w: the table %s: %w", journal.ErrIncompatible, why, err)
}

// checkMode fails with journal.ErrIncompatible unless the table's id mode
// (see readMode) is mode or unknown.
func checkMode(ctx context.Context, db querier, t table, mode string) error {
	got, how, err := readMode(ctx, db, t)
	switch {
	case err != nil:
		return err
	case got != "" && got != mode:
		return fmt.Errorf("%w: the table holds %s action ids (%s), this journal %s: every process sharing a table must agree on WithHashedIDs",
			journal.ErrIncompatible, modeWords(got), how, modeWords(mode))
	}
	return nil
}

// readMode returns the table's id mode: the one recorded in its comment
// (how "recorded in its comment") or, for a table without the mark (made
// before modes were recorded, or by hand, and opened only
// WithoutCreateTable since), the one its rows show (how "judged by its
// rows"); "" when neither tells.
func readMode(ctx context.Context, db querier, t table) (mode, how string, err error) {
	var comment sql.NullString
	if err := db.QueryRowContext(ctx, `SELECT obj_description($1::text::regclass, 'pg_class')`, t.quoted).Scan(&comment); err != nil {
		return "", "", err
	}
	mode, found, err := parseMark(comment.String)
	switch {
	case err != nil:
		return "", "", err
	case found:
		return mode, "recorded in its comment", nil
	}
	mode, err = modeOfRows(ctx, db, t)
	return mode, "judged by its rows", err
}

// modeOfRows returns the mode that a sample of the table's action ids
// shows: plain if any is not in digest form (a hashing journal stores
// digests only), hashed if all are, "" for an empty table.
func modeOfRows(ctx context.Context, db querier, t table) (string, error) {
	rows, err := db.QueryContext(ctx, `SELECT action_id FROM `+t.quoted+` LIMIT 100`)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return "", err
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	return modeOfIDs(ids), nil
}
