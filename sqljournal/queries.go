package sqljournal

import (
	"strconv"

	"github.com/idemretry/idemretry/journal"
)

// columns is the order every query reads and writes a record's columns in.
const columns = `action_id, key, fingerprint, created_at, state, attempts, status, key_form`

// stateDone and the others are journal.State values as SQL literals, so
// that the constants stay the single source of truth.
var (
	stateDone    = strconv.Itoa(int(journal.StateDone))
	statePending = strconv.Itoa(int(journal.StatePending))
	stateUnknown = strconv.Itoa(int(journal.StateUnknown))
)

// dbNowMs is the database's clock at the transaction's start, in Unix
// milliseconds, and dbClockUs its clock now, in Unix microseconds (see
// Journal.Now).
const (
	dbNowMs   = `floor(extract(epoch FROM now()) * 1000)::bigint`
	dbClockUs = `floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint`
)

// queries is the SQL of one journal, built once from its validated table.
type queries struct {
	insertKeep, insertReplaceDone string
	get, getClocked, update       string
	forget                        string
	unfinished, expire            string
	lease, release                string
}

func newQueries(t table) queries {
	// created_at is the earlier of the record's time and the database's
	// clock (now(), the transaction's start, after the caller read its
	// clock): a machine whose clock runs ahead cannot make a key look
	// younger to the others than it is, which would have them send it
	// after its window (see Reserve). RETURNING yields what was stored.
	values := ` (` + columns + `) VALUES ($1, $2, $3, LEAST($4::bigint, ` + dbNowMs + `), $5, $6, $7, $8::smallint)`
	return queries{
		// One statement each, so the decision is atomic in the database: a
		// conflicting insert waits for the other transaction and then sees
		// its committed row. RETURNING yields a row only when this call
		// wrote one, with the created_at it stored.
		insertKeep: `INSERT INTO ` + t.quoted + values +
			` ON CONFLICT (action_id) DO NOTHING RETURNING created_at, ` + dbClockUs,
		insertReplaceDone: `INSERT INTO ` + t.quoted + values +
			` ON CONFLICT (action_id) DO UPDATE SET key = EXCLUDED.key, fingerprint = EXCLUDED.fingerprint,` +
			` created_at = EXCLUDED.created_at, state = EXCLUDED.state, attempts = EXCLUDED.attempts, status = EXCLUDED.status,` +
			` key_form = EXCLUDED.key_form` +
			` WHERE ` + t.quoted + `.state = ` + stateDone + ` RETURNING created_at, ` + dbClockUs,
		get: `SELECT ` + columns + ` FROM ` + t.quoted + ` WHERE action_id = $1`,
		// Reserve's read, with the database's clock (Journal.Now).
		getClocked: `SELECT ` + columns + `, ` + dbClockUs + ` FROM ` + t.quoted + ` WHERE action_id = $1`,
		// The key must match too: a record replaced (ReusePending) or
		// forgotten and created again is another action under the same id.
		// Done is final: a done row keeps its state and status whatever the
		// update says, and attempts never go down (as journal.Memory). The
		// rule is in the statement, so it holds against writers on other
		// machines: SET reads the row as locked by this UPDATE (at READ
		// COMMITTED, the latest committed version; a concurrent writer's
		// change is waited for and then re-read), never a stale copy.
		update: `UPDATE ` + t.quoted + ` SET` +
			` state = CASE WHEN state = ` + stateDone + ` THEN state ELSE $3 END,` +
			` status = CASE WHEN state = ` + stateDone + ` THEN status ELSE $5 END,` +
			` attempts = GREATEST(attempts, $4)` +
			` WHERE action_id = $1 AND key = $2`,
		forget: `DELETE FROM ` + t.quoted + ` WHERE action_id = $1`,
		// Every row not done: the pending and unknown ones, and any whose
		// state is none a Journal writes (0, 7, NULL in a table made by
		// hand), which scanRecord names as malformed: a pending row whose
		// state was damaged must not drop out of the list unnamed. It
		// reads the whole table (the unfinished index covers states 1 and
		// 3 only): 24 ms for 300,000 rows, 300 unfinished, against 0.7 ms.
		// COLLATE "C" orders equal times by bytes, as journal.Memory does,
		// whatever the database's collation.
		unfinished: `SELECT ` + columns + ` FROM ` + t.quoted +
			` WHERE state IS DISTINCT FROM ` + stateDone + ` ORDER BY created_at, action_id COLLATE "C"`,
		expire: `DELETE FROM ` + t.quoted + ` WHERE state = ` + stateDone + ` AND created_at < $1`,
		// One statement: the UPDATE takes or renews the lease when it is
		// free, $2's own or ended, by the database's clock (now(), the
		// statement's start); the SELECT reports the outcome and, when it
		// was refused, the lease as the statement found it, with the time
		// left in milliseconds. The SELECT reads the statement's snapshot,
		// not the row as the UPDATE rechecked it, so a lease refused on a
		// row that looks free was taken by a concurrent caller: Lease asks
		// again.
		lease: `WITH took AS (UPDATE ` + t.quoted +
			` SET lease_holder = $2, lease_until = now() + $3::bigint * interval '1 millisecond'` +
			` WHERE action_id = $1 AND (lease_holder IS NULL OR lease_holder = $2 OR lease_until IS NULL OR lease_until <= now())` +
			` RETURNING 1)` +
			` SELECT EXISTS (SELECT 1 FROM took), r.action_id IS NOT NULL, r.lease_holder,` +
			` COALESCE(ceil(extract(epoch FROM r.lease_until - now()) * 1000)::bigint, 0)` +
			` FROM (SELECT 1) one LEFT JOIN ` + t.quoted + ` r ON r.action_id = $1`,
		release: `UPDATE ` + t.quoted + ` SET lease_holder = NULL, lease_until = NULL WHERE action_id = $1 AND lease_holder = $2`,
	}
}
