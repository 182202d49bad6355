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
// once.
//
// The Transport takes the action's lease after reserving its key and before
// the first attempt, renews it every third of its TTL while it runs, and
// releases it after RoundTrip returns, in the background, for at most a
// second (Close waits for it). A machine that finds the lease held waits,
// polling with jitter, for the holder to release it or for the lease to
// end, reads the action again and sends it under the same key; if the
// other machine finished, the server replays its answer. If the caller's
// context ends first, it gets idemretry.ErrLeaseHeld, with nothing sent. A
// release that fails (the database down) leaves the lease to its TTL for the
// other machines, and the Transport that held it takes it again at once. A
// machine that dies holding a lease delays the action for at most the TTL
// (idemretry.WithLeaseTTL, 30 s by default). If the holder's renewals fail
// for a whole TTL and another machine takes over, the holder stops before
// its next attempt with idemretry.ErrLeaseLost, the action pending with its
// key. A Lease that fails is logged and the action is sent anyway. Leases
// cost two extra statements per action. In the two-process test, a second
// machine resuming an action while the first one's charge was in progress
// drew 11 409s without leases and none with them; the server charged once
// either way.
//
// # Fleets
//
// An outcome the database could not take (it was down when the answer came)
// is kept in the memory of the machine that got it until it lands; until
// then the other machines see the action pending. An identical unnamed
// payment made meanwhile on another machine is taken for a tap of the first
// and given its replay: on a fleet, name payments (idemretry.WithAction).
//
// A machine whose clock is behind the database's (by up to a day) judges key
// windows by the database's time; the settle time before Resolve and the
// duplicate window are judged by the earlier of the two. The settle time must
// still cover how far a machine's clock may run behind the database's: such
// a machine stores its keys with its own, earlier, time.
//
// The journal keeps no fingerprint secret ([journal.FingerprintKeeper]), so
// every fingerprint in it is a SHA-256: a secret in the table would let
// whoever reads it (a replica, a backup, an analyst) craft a body that passes
// for another.
//
// # Setup
//
// You own db; [Journal.Close] leaves it open. Tell the journal the window you
// give the Transport, [WithKeyWindow](w) with idemretry.WithKeyWindow(w), and
// use [WithGrace] if the clocks of your machines may disagree by more than a
// day. Call [Journal.Expire] on a schedule. [Open] refuses a bad option (a
// nil db, a bad table name, a key window that is not positive, a negative
// grace) with [ErrInvalidOption].
//
// The table records its id mode in a line of its comment
// (idemretry.sqljournal.action_ids=plain or =sha256); the first Open that may
// create tables adds it, keeping any comment already there. A table opened
// only [WithoutCreateTable] and still empty accepts either mode until it is
// marked: add that line to its comment when you create it by hand, and the
// columns added since the first version (on PostgreSQL 10 and older,
// adding key_form rewrites the table under its lock):
//
//	ALTER TABLE idemretry_actions ADD COLUMN lease_holder text, ADD COLUMN lease_until timestamptz;
//	ALTER TABLE idemretry_actions ADD COLUMN key_form smallint NOT NULL DEFAULT 0;
//
// The tests run against a real server: eval "$(bash .ci/postgres.sh)" starts
// a throwaway one, then go -C sqljournal test ./...
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
