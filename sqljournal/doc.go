// Package sqljournal is a [journal.Journal] kept in a SQL database, so
// that every machine of a fleet sends the same Idempotency-Key for one
// logical action. It is written for PostgreSQL ($1 placeholders, ON CONFLICT)
// through [database/sql], and works with any PostgreSQL driver: the
// application imports and registers the one it likes, for instance
//
//	import _ "github.com/jackc/pgx/v5/stdlib" // driver name "pgx"
//
//	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
//	j, err := sqljournal.Open(ctx, db)
//	t, err := idemretry.NewTransport(http.DefaultTransport, idemretry.WithJournal(j))
//
// It imports only the seam package [journal] of idemretry's module, and
// applies its rules: [journal.CheckRecord] for records, [journal.Digest]
// for hashed action ids.
//
// # Guarantees
//
// [Journal.Reserve] is one atomic statement (INSERT ... ON CONFLICT), so
// concurrent Reserves of one action, from any number of goroutines, pools,
// processes or machines, all return the same key. It runs in a transaction
// begun at READ COMMITTED, so it works the same when the database's or the
// role's default_transaction_isolation is REPEATABLE READ or SERIALIZABLE.
// Update, Forget and Expire are single statements at the default level;
// under a stricter default, one that races with another client's change of
// the same record may fail with a serialization error (SQLSTATE 40001),
// having changed nothing. A record it creates is
// durable once the database has committed it; with PostgreSQL's default
// synchronous_commit = on that means it is on the server's disk (and on its
// synchronous standbys, if any) before the first request is sent. Do not
// turn synchronous_commit off for the journal's database or role: a
// server crash could then lose a key whose request was already sent.
//
// [Journal.Update] never moves a record out of done, in the statement
// itself: a stale writer on another machine (one that saw a 409, gave up
// and records "pending") cannot undo an outcome another one recorded.
//
// Every call returns by its context's deadline even when the database
// hangs, and errors of a database that does not answer wrap
// [journal.ErrUnavailable] (see [Journal]). [Open] refuses, with
// [journal.ErrIncompatible], a table that does not fit: no unique
// key on action_id, other columns, or action ids hashed the other way.
//
// # Clocks
//
// Key windows are held to the database's clock, as leases are: a record is
// created with the earlier of the minting machine's time and the
// database's, and the Journal is a [journal.Timekeeper] whose time is the
// database's clock (read at Open and again at each Reserve, advanced by the
// monotonic clock in between), which
// a Transport judges windows by when its machine's clock is behind it. So
// neither a machine whose clock runs ahead when it mints a key nor one
// whose clock runs behind when it resends it sends the key after its
// window (the server may have forgotten it, and would perform the action
// again); a skewed clock only makes keys look older, refused sooner.
//
// # Leases
//
// The Journal is a [journal.Leaser]: [Journal.Lease] gives an action to one
// holder at a time across every machine sharing the table, and a Transport
// uses it to keep one machine in flight per action (see
// idemretry.WithLeaseTTL). Without it, two machines resuming the same
// action both send its key, and the server answers one of them 409 on
// every retry. A lease is two columns of the action's row, taken, renewed
// and taken over in one UPDATE whose condition reads the database's clock
// (now()), never a machine's: a lease ends when the database says so, so
// machines whose clocks disagree still agree on who holds it. Leases are
// for load, not safety: the key already makes the server perform the action
// once.
//
// # Records and expiry
//
// The journal is told the Transport's key window ([WithKeyWindow], default
// 24 hours) and a grace beyond it ([WithGrace], default 24 hours). Done
// records are kept for the two together after their key was minted, and
// then deleted by [Journal.Expire], which the application calls on a
// schedule. Pending and unknown records are never expired: an action whose
// outcome may be unknown must never get a new key. They leave the table
// only through [Journal.Forget], once the application has reconciled them.
//
// Action ids are stored as given, or as SHA-256 digests with
// [WithHashedIDs]. Either way they must not carry personal data.
//
// The table's schema is in [Open]'s documentation. The package is tested
// against PostgreSQL 15; it uses nothing newer than PostgreSQL 9.5.
package sqljournal
