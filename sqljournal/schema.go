package sqljournal

import (
	"context"
	"database/sql"
	"fmt"
)

// createSchema creates the table and its indexes if they are missing.
// Concurrent CREATE TABLE IF NOT EXISTS statements can still collide in
// PostgreSQL's catalogs (a unique violation on pg_type), so machines
// starting together take a transaction-scoped advisory lock first.
func createSchema(ctx context.Context, db *sql.DB, t table) (err error) {
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
	status      integer  NOT NULL
)`,
		// Unfinished reads pending and unknown records oldest first; Expire
		// reads done ones by age. Partial indexes keep both off the rest.
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
	return tx.Commit()
}

// checkSchema fails unless the table exists with the columns the queries
// use, so that a wrong table name is reported by Open, not by the first
// payment.
func checkSchema(ctx context.Context, db *sql.DB, t table) error {
	rows, err := db.QueryContext(ctx, `SELECT `+columns+` FROM `+t.quoted+` WHERE false`)
	if err != nil {
		return err
	}
	if err := rows.Close(); err != nil {
		return fmt.Errorf("check columns: %w", err)
	}
	return rows.Err()
}
