// Package filejournal is the file-backed journal.Journal that idemretry's
// NewClient and NewTransport use by default: one directory per program, one
// append-only file with group commit, crash recovery and compaction, and an
// exclusive lock so that one Journal at a time writes it.
//
//	j, err := filejournal.Open(dir, filejournal.WithHashedIDs())
//	...
//	t, err := idemretry.NewTransport(nil, idemretry.WithJournal(j))
//
// (idemretry.WithJournalDir(dir, opts...) has the Transport open, own and
// close it instead.) What follows is how it keeps its promises: the files,
// the format, the rule recovery relies on. A change of the on-disk format
// goes here (format.go, record.go, scan.go) and into this description.
//
// # Where, and who owns it
//
// By default the directory is $XDG_STATE_HOME/idemretry/<program> (else
// ~/.local/state/idemretry/<program>) on Linux, ~/Library/Application
// Support/idemretry/<program> on macOS, and %LocalAppData%\idemretry\<program>
// on Windows ([DefaultDir]). Android and iOS apps pass their private files
// directory (there is no default there). Pass a directory of its own, for
// example filepath.Join(appFilesDir, "idemretry"): Open narrows an existing
// directory, journal or LOCK with wider permissions to 0700 and 0600 when the
// process owns it. One owned by another user is left as it is, listed in
// Recovery().ModeNotOwned and logged.
//
// One owner at a time: a second Open, in this process or another, fails at
// once with [ErrLocked], or waits up to [WithLockWait]. A process that dies
// releases the lock. If the directory is deleted or replaced while the
// Journal is open, the next new action fails before anything is sent with an
// error wrapping [ErrRemoved] and journal.ErrClosed, as do Sync and Close;
// open a journal again to go on. The same holds if LOCK is deleted while the
// Journal is open (a cleaner of old files in a temporary directory, say): do
// not delete LOCK.
//
// # What it stores
//
// Per action: the action id (or its SHA-256, with [WithHashedIDs]), the key
// and the form it was first sent in (bare or quoted), the request
// fingerprint, the creation time, the state (pending, done,
// outcome-unknown), the attempts and the final status. Never bodies, headers
// or credentials; action ids must not carry personal data. Done records are
// kept until the key window plus the grace ([WithKeyWindow], [WithGrace]; 24
// h each) have passed both by the clock and by the time the Journal has
// itself seen pass while open, so a clock that was wrong when a payment was
// made, then corrected, never makes it forget the payment. Pending and
// outcome-unknown records are kept until Forget: forgetting them would let a
// new key be minted for an action that may have happened.
//
// fingerprint.key holds the secret of the keyed fingerprints, made once at
// the first Open (mode 0600, like the journal). Back it up with the journal
// or not at all: whoever reads it can craft a body that passes for another
// under the same action. Damaged or unreadable, it is left as it is and the
// Journal works on without it, with SHA-256 fingerprints
// (Recovery.FingerprintSecretErr). Deleted while the Journal is open, it is
// made again of the same secret within a second of the next write, and at
// Close. Deleted while the Journal is closed, a new one is made at Open
// (Recovery.FingerprintSecretMade). Either way an action recorded with a
// keyed fingerprint under the old secret is refused
// (idemretry.ErrFingerprintUncheckable), nothing sent, until its key window
// ends; then it is outcome-unknown and goes to Resume's Resolve.
//
// # Cost
//
// One write and one fdatasync before an action's first send, shared by
// concurrent creators (group commit: before taking a batch, the committer
// lets the goroutines that are ready to run go first, so callers a batch has
// just released join the next one). Later updates are written lazily, within
// a second ([WithFlushInterval]) or at Close, and wake no goroutine. The
// exception: the Transport syncs the done of an action named by its request's
// fingerprint (and of a 307/308 hop of one), because after a crash a
// deliberate repeat of that payment would otherwise find it pending, reuse
// its key and be given the first payment's replay. That sync joins the next
// batch with everyone else's writes. A record takes 77 bytes on disk and
// about 120-140 bytes of memory; reopening a journal of a million records
// takes about a second (bench/README.md).
//
// # Damage
//
// A crash in the middle of a write leaves a torn tail, which is copied aside
// and cut off on the next Open. A record is acknowledged when Reserve
// returns, after its sync; a damaged last frame looks exactly like a torn
// one, and is treated the same. Damage to acknowledged data makes Open (and
// so idemretry.NewClient) fail with a [*CorruptionError] ([ErrCorrupt])
// naming the file and offset, and nothing on disk is changed. A frame written
// twice (an exact copy) is skipped and reported in Recovery().Duplicates;
// stray bytes between intact frames are reported as corruption, never cut
// with the frames after them. Reconcile with the server, then reopen with
// [WithSalvage] (what was lost is listed in Recovery().Salvaged, with the
// actions it names, which Unfinished then names beside the intact records),
// or move the directory away.
//
// # Layout
//
//	<dir>/LOCK          never renamed; locked (internal/lockfile) while open,
//	                    and holding the holder's process id (for ErrLocked)
//	<dir>/journal       the active file
//	<dir>/journal.tmp   exists only while a compaction (or the journal's
//	                    creation) writes and renames it
//	<dir>/journal.torn.*     torn tails cut off by recovery (a few newest kept)
//	<dir>/journal.corrupt.*  whole files set aside by a salvage (a few kept)
//	<dir>/journal.aside.tmp  exists only while such a copy is written; it is
//	                         renamed to its name once complete and synced
//	<dir>/fingerprint.key    the secret of keyed request fingerprints
//	                         (Journal.FingerprintSecret): "idemretry
//	                         fingerprint key 1\n", 32 random bytes, and the
//	                         CRC-32C of both (little-endian), 64 bytes; made
//	                         once (fingerprint.key.new, synced, renamed, the
//	                         directory synced), never rewritten; made again
//	                         of the same secret if deleted while the Journal
//	                         is open (fingerprint.key.tmp, the same way); a
//	                         whole fingerprint.key.tmp is taken by Open when
//	                         fingerprint.key is missing (one it cannot read
//	                         is left), and removed when fingerprint.key
//	                         reads whole
//
// A copy aside is never left empty or partial under a copy's name, and the
// newest few of each kind are kept. A torn tail that cannot be copied (a
// full disk) is cut all the same, and Recovery.TornCopyErr says why there
// is no copy: the copy is for diagnosis,
// the tail holds no acknowledged record, and no frame could be appended
// after it. A salvage whose copy of the damaged file cannot be written
// fails: that copy is the only trace of the records it would drop.
//
// # Format, version 1.1
//
// A 32-byte file header (magic, version, flags, a random 32-bit generation,
// the sequence number of the first frame, a CRC32C of the header), then one
// frame per group-commit batch:
//
//	masked CRC32C (4) | payload length (4) | sequence (8) | payload
//
// The CRC is Castagnoli, seeded with the file's generation (so a frame left
// over from an older file never validates in a newer one) and covers length,
// sequence and payload; it is masked as LevelDB does so that a CRC of data
// holding CRCs is not degenerate. Sequences rise by one per frame and continue
// across compactions. A payload is a record count then records (see
// record.go): full-state upserts (with the observed time at the record's
// creation, see WithKeyWindow), deletes (Forget), the end of a compaction
// snapshot (its record count and the clock), the clock's high-water mark,
// and the observed time. Header flag flagSeen says the file holds observed
// times: a version that does not know them refuses the file as
// incompatible, and so does this one a file without the flag (written
// before observed times): journal.ErrIncompatible. An upsert without its
// observed time is malformed.
//
// Since version 1.1 an upsert records its key's form (journal.KeyForm:
// unrecorded, bare or quoted, the form the key was first sent in) in two
// bits of its flags, and header flag flagKeyForm says so. A release of
// version 1.0 does not know the flag: it refuses a 1.1 file with
// journal.ErrIncompatible (its Open fails), so it can neither take the
// forms for damage nor send a key in the form its WithQuotedKey says
// rather than the one recorded. A 1.0 file is read with every form
// unrecorded (the Transport sends those in its WithQuotedKey form, as 1.0
// did) and rewritten as 1.1 (a compaction) by Open before anything is
// appended to it; if that fails (a full disk), Open fails and the file is
// left as it was. Going back to a 1.0 release thus needs the journal's
// directory emptied, once its unfinished actions are reconciled.
// Replaying full-state upserts is idempotent, which lets a compaction
// snapshot and later appends overlap harmlessly. Replay applies the rule
// that Update follows: an upsert of a done record's action with the same
// key changes its attempts only (done is final), so a stale update written
// after done cannot undo it on restart. So a batch writes every new record
// (Reserve) as a delete of its action then an upsert, whatever the index
// holds: replay never takes a new record for an update of an earlier one
// with the same key (a caller's key used again once its done record
// expired), even where the file still holds that earlier record. Expired
// records leave the index only with their deletes on the way (queued when
// Open or Reserve drops them) or once a compaction's snapshot without them
// has replaced the file.
//
// # The rule recovery relies on
//
// The committer never writes frame s+1 before the sync of frame s returned.
// So a damaged frame followed, anywhere later, by a valid frame with sequence
// >= s+2 must have been synced and acknowledged: that is corruption of
// acknowledged data, and opening fails with a *CorruptionError unless salvage
// was asked for. A damaged frame with nothing valid after it is a torn tail
// (a crash during its write): it is copied aside, cut off and synced. A
// damaged final frame cannot be told from a torn write; like etcd, LevelDB,
// RocksDB and SQLite, recovery treats it as torn. After a crash that is
// right: a torn frame's records were never acknowledged, because
// acknowledgement follows the sync. If instead the disk damaged a final frame
// that had been synced, its records are lost; the copy set aside and
// Recovery.TornTail are how that shows.
//
// A valid frame whose sequence was already applied is not the next frame:
// it is a copy. An exact copy of the applied frame (a write repeated below
// the file system) holds nothing new: it is skipped, the frames after it are
// read as usual, Recovery.Duplicates counts it, and Open rewrites the journal
// without it. Anything else out of sequence is damage. So is a stretch of
// bytes that is no frame followed by the intact next frame: nothing is lost,
// but the file is not what the writer wrote, and opening fails with a
// *CorruptionError whose FirstLostSeq is 0 (salvage skips the bytes and
// keeps the frame). Copies or damage with no new frame after them are a torn
// tail; cutting them loses nothing acknowledged. The search for a later
// frame starts at the next expected sequence, so an intact frame is never
// cut with the damage before it. It tries every byte offset, and checks a
// long candidate's CRC from running CRC registers of the file rather than
// over its bytes (crcprefix.go), so that its cost stays a small multiple
// of the file's size whatever the damaged bytes hold.
//
// # journal.tmp at recovery
//
// A compaction (and the creation of a new journal) writes journal.tmp,
// syncs it, renames it over journal and makes the rename durable: a
// directory fsync on unix, MoveFileEx with MOVEFILE_WRITE_THROUGH on
// Windows. Where a rename cannot be made durable, a power loss may undo it
// while keeping the batches appended afterwards to the renamed file: they
// are then under journal.tmp, acknowledged. So Open never deletes a
// journal.tmp that may hold them. It adopts journal.tmp (syncs it, then
// renames it over journal durably) when journal.tmp is a complete snapshot
// (valid header, valid frames up to an end record that counts the records
// before it, then only valid batch frames, apart from a torn tail) and
// either journal is missing or journal.tmp's base sequence is past
// journal's last valid sequence. Sequences continue across files and a
// compaction starts its file at journal's next sequence, so journal.tmp is
// then the newer file. Otherwise it removes journal.tmp, after syncing
// journal: an incomplete journal.tmp never replaced anything, and one whose
// base journal's frames reach was left by a compaction that failed, its
// removal lost. If journal's header is unreadable, journal.tmp is left in
// place and Open reports the damage. Frames after journal.tmp's end record
// were appended to it as the journal (its rename was lost), after it was
// synced whole: damage in such a journal.tmp, anywhere, with a valid frame
// after it, is damage to acknowledged data, and when journal.tmp would be
// adopted, Open fails with a *CorruptionError naming journal.tmp and
// changes nothing (salvage adopts it, then salvages it). Damage in a
// journal.tmp with nothing after its end record is not: a compaction that
// crashed before its sync can leave its output with holes, and such a
// journal.tmp is removed.
//
// # A journal removed while open
//
// Appends to a file whose directory was removed (or renamed, or replaced)
// succeed and sync, into an inode nobody will open again: records
// acknowledged from then on vanish at the next start, and their actions
// could be sent under a second key. So the committer checks, after each
// batch's sync and before acknowledging it, that the journal's path still
// names the file it writes (one stat, compared with os.SameFile); Sync with
// nothing to write, Close and compaction check too; a compaction checks
// again just before its rename, so that a directory replaced while it wrote
// journal.tmp (one that may hold another process's journal, under its own
// lock) is neither renamed into nor, after a failed rename, appended to by
// path, and the journal.tmp it made there is removed. On a mismatch the
// Journal stops with an error wrapping ErrRemoved.
//
// LOCK deleted while open (or deleted and made again) takes the lock with
// it: the next Open, in any process, locks a new LOCK and opens the same
// journal. So before writing each batch, and before a compaction's rename,
// the committer checks that LOCK is still the file it locked (one stat):
// on a mismatch the Journal stops with an error wrapping ErrRemoved, having
// written nothing more, and the other Journal has the file to itself. A removal between the check and
// the next batch cannot be seen by that batch's waiters, who were
// acknowledged before it; the next batch fails.
//
// # A full disk
//
// A batch whose write or sync fails (ENOSPC, EDQUOT, EIO) is not
// acknowledged: its waiters get an error wrapping journal.ErrUnavailable and
// the file system's error, so the Transport refuses the payments it was to
// reserve, before sending them. The batch is undone in memory: its new
// records are dropped (those they were to replace are put back), its other
// operations go back to the head of the queue. The descriptor that failed is
// never written or synced again. Then the file is repaired: opened afresh,
// cut back to where the failed batch began (frames of it synced before the
// failure included: none was acknowledged), the cut synced; at once, or,
// should that fail too, before the next write. So while the disk stays full
// every call that must write is refused, at the cost of one failed write
// each (and, with updates queued, one attempt per flush interval, at most a
// hundred a second); reads, Updates and Reserves of recorded actions go on
// from memory. The first call after space returns succeeds, with no reopen,
// and carries the queued updates; so does Close. Acknowledged records are
// never touched: they lie before the cut. A crash while the disk is full
// loses only the queued updates (lazy, see Journal), unless frames of the
// failed batch had reached the disk and the crash came before the cut (or
// the cut failed): its refused records may then come back, as those of a
// Reserve cut short by its context may. Open cuts a failed batch's partial
// frame as a torn tail, and opens even while the disk is still full (without
// the tail's copy). A compaction that fails for lack of space leaves the
// journal as it was; the automatic one tries again a minute later.
//
// # Where this departs from the project's recommended design, and why
//
//   - Expiry drops only done records. Pending and unknown ones are kept until
//     Forget: dropping one would let the transport mint a new key for an
//     action whose outcome is unknown.
//   - A done record expires only when its retention is over both by the
//     clock and by the observed time: the time the Journal has seen pass
//     since the record's creation, on the monotonic clock, while open
//     (persisted at most a minute behind with batches, at Close, hourly and
//     in snapshots). A wall clock that was wrong when a record was made, or
//     jumps while the journal is closed, thus never expires a record early;
//     the price is that an application rarely open keeps its done records
//     for much longer than the retention in real time (see WithKeyWindow).
//   - The clock's high-water mark is persisted (with batches and in
//     snapshots), so a clock set back, even across a restart, revives no
//     expired record. A mark more than the grace (WithGrace) ahead of the
//     clock is not believed (the clock ran ahead and was corrected; expiring
//     by it would drop done records early). The retention of done records is
//     the key window plus the same grace (WithKeyWindow): one bound.
//   - A torn tail's bytes are copied aside, not the whole file: torn tails
//     follow any crash during a write, and copying a large journal each time
//     would be costly. A salvage copies the whole damaged file.
//   - The end record holds the snapshot's record count and clock; its last
//     sequence is implicit (the end record's own frame).
//   - Open reads the file through one window of about 1.3 MiB (the largest
//     frame and 256 KiB), twice: once to count the live records, so that the
//     index is sized once, then to verify and replay them. It never holds the
//     whole file; the index it keeps takes about 140 bytes a record.
//   - A batch larger than maxPayload is written as several frames, each
//     synced before the next is written, to keep the rule above.
//   - A failed write or sync poisons its descriptor, not the Journal: the
//     Journal reopens the file itself, cuts off the failed batch and goes
//     on (see "A full disk"), where the design has the application reopen
//     the journal. A long-running process thus recovers when space
//     returns, without losing the updates it had queued.
package filejournal
