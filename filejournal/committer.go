package filejournal

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/idemretry/idemretry/journal"
)

// run is the committer goroutine. It alone writes and syncs the file, so
// batch s+1 is never written before the sync of batch s returned, which is
// what recovery's torn-or-corrupt rule relies on.
//
// It waits on one channel, wake: everything that has work for it (a durable
// waiter, Close, Compact, and its timers, which are time.AfterFunc) sets a
// flag under mu (j.ev) and then signals wake, and it reads the flags after
// each wake-up. A receive on one channel is what a batch costs it to wait
// for; a select over six cases, one per source, cost 6,500 instructions
// more per action at concurrency 1, one batch each (callgrind: 181,651
// against 175,159 per action end to end).
func (j *Journal) run() {
	defer close(j.done)
	c := j.newCommitter()
	defer c.stopTimers()
	for {
		<-j.wake
		j.opts.hooks.fail(fpWake)
		// Let the goroutines that are ready to run do so before the batch
		// is taken: under load, those are the callers that a batch just
		// released, about to queue their next Reserve or Sync, and they
		// join this batch instead of each starting a small one of its own
		// (at 64 concurrent actions end to end, 3 times fewer, 3 times
		// larger batches: fewer syncs, and less of the CPU held in them).
		// With nothing else ready to run, as at concurrency 1, it returns
		// at once.
		runtime.Gosched()
		ev, durable := j.takeEvents()
		// Compactions asked for before Close are done before it.
		for _, reply := range ev.compact {
			reply <- j.compactAsked()
		}
		if ev.stop {
			j.closeErr = j.stopNow()
			j.mu.Lock()
			c.flush.Stop()
			j.mu.Unlock()
			return
		}
		if ev.secret {
			c.secretArmed = false
			_, _ = j.keepSecret(time.Now(), true) // tried again at the next check
		}
		if ev.expiry {
			c.expire()
		}
		// Woken for a durable waiter (a lazy-only queue waits for the
		// flush timer, which enqueue armed), or by the flush timer.
		if durable || ev.flush {
			c.commit(ev.flush)
		}
	}
}

// committer is the state of the committer goroutine's loop (see run).
type committer struct {
	j      *Journal
	flush  *time.Timer // the lazy-flush timer (see Journal.flushTimer)
	expiry *time.Timer // when to look for expired records
	// compactBackoff: no automatic compaction before, after one failed.
	compactBackoff time.Time
	// secretDue is a check of fingerprint.key that a batch found too soon
	// after the last one (keepSecret), armed for when it is due.
	secretDue   *time.Timer
	secretArmed bool
}

func (j *Journal) newCommitter() *committer {
	j.mu.Lock()
	c := &committer{j: j, flush: j.flushTimer(), expiry: time.AfterFunc(j.opts.expiryEvery, j.postExpiry)}
	j.mu.Unlock()
	// Open has just read or made fingerprint.key: the first check is a
	// secretCheckEvery later, not at the first batch, where it would race
	// whatever the caller does as soon as that batch is acknowledged (a
	// removal of the directory: os.RemoveAll failed, "directory not
	// empty", on the fingerprint.key.tmp made meanwhile).
	j.secretChecked = time.Now()
	return c
}

func (c *committer) stopTimers() {
	c.expiry.Stop()
	if c.secretDue != nil {
		c.secretDue.Stop()
	}
}

// takeEvents returns the events posted since the last call, and whether a
// durable waiter is queued.
func (j *Journal) takeEvents() (events, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	ev, durable := j.ev, j.durable
	j.ev = events{}
	if ev.flush {
		j.flushArmed = false
	}
	return ev, durable
}

// compactAsked writes the queue and compacts, for Compact, and returns its
// answer: the error, as journal.ErrClosed when the Journal stopped (now or
// before), as any other call on it returns, by which callers know to
// reopen; as journal.ErrUnavailable when a write failed, as for a batch.
func (j *Journal) compactAsked() error {
	err := j.commitQueued(true)
	if err == nil {
		err = j.compact()
	}
	if err == nil {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.poison != nil {
		return j.usable()
	}
	if !errors.Is(err, journal.ErrUnavailable) {
		err = fmt.Errorf("%w: %w", journal.ErrUnavailable, err)
	}
	return err
}

// expire writes the observed time when due, and compacts when a record
// has expired (a failure before the rename changes nothing); then it arms
// the next look.
func (c *committer) expire() {
	j := c.j
	j.queueSeen(seenMarkEvery)
	if j.commitQueued(true) == nil && j.hasExpired() {
		_ = j.compact()
	}
	c.expiry.Reset(j.opts.expiryEvery)
}

// commit writes the queue's batch (a lazy-only one when flush is set), and
// after a batch that succeeded checks fingerprint.key when due (a failure
// is tried again at the next check, and at Close, which reports it) and
// compacts when worth it (a failure waits a minute before the next try).
func (c *committer) commit(flush bool) {
	j := c.j
	if err := j.commitQueued(flush); err != nil {
		return // its waiters have the error; the next batch tries again
	}
	now := time.Now()
	if wait, _ := j.keepSecret(now, false); wait > 0 && !c.secretArmed {
		c.secretArmed = true
		if c.secretDue == nil {
			c.secretDue = time.AfterFunc(wait, j.postSecret)
		} else {
			c.secretDue.Reset(wait)
		}
	}
	if now.After(c.compactBackoff) && j.needsCompaction() {
		if err := j.compact(); err != nil {
			c.compactBackoff = time.Now().Add(time.Minute)
		}
	}
}

// events is what the committer has been asked to do since it last looked,
// besides a durable batch (Journal.durable): set under mu, then wake is
// signalled (post).
type events struct {
	stop    bool         // Close
	compact []chan error // Compact calls, each waiting for its reply
	flush   bool         // the lazy-flush timer fired
	expiry  bool         // time to look for expired records
	secret  bool         // a fingerprint.key check is due
}

// post records an event for the committer and wakes it.
func (j *Journal) post(set func(*events)) {
	j.mu.Lock()
	set(&j.ev)
	j.mu.Unlock()
	j.signal()
}

// postFlush, postExpiry and postSecret post the timers' events.
func (j *Journal) postFlush()  { j.post(func(e *events) { e.flush = true }) }
func (j *Journal) postExpiry() { j.post(func(e *events) { e.expiry = true }) }
func (j *Journal) postSecret() { j.post(func(e *events) { e.secret = true }) }

// stopNow is the committer's last work, for Close: the queued operations
// written and synced, fingerprint.key kept, the file closed. It returns
// what Close reports.
func (j *Journal) stopNow() error {
	j.queueSeen(seenMarkClose)
	err := j.commitQueued(true)
	if err == nil {
		// A failed batch whose cut failed too, with nothing left to write
		// since: cut it off now, if that can be done (else Open cuts it,
		// as a torn tail; it holds nothing acknowledged).
		_ = j.repair()
	}
	var secretErr error
	if err == nil {
		_, secretErr = j.keepSecret(time.Time{}, true)
	}
	if err == nil && j.f != nil {
		err = j.checkPresent()
	}
	if err == nil && secretErr != nil {
		// The journal is whole; its secret is what is at stake. Close's
		// wrap says "journal close" once.
		err = secretErr
	}
	if j.f != nil {
		if cerr := j.f.Close(); err == nil && cerr != nil {
			err = cerr // Close's wrap says "journal close" once
		}
		j.f = nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.poison != nil {
		// What stopped the Journal, now or earlier.
		err = fmt.Errorf("%w: %w", journal.ErrClosed, j.poison)
	}
	return err
}

// commitQueued takes the queue as one batch, writes and syncs it, and
// acknowledges its waiters. Lazy-only queues are written only when force is
// set. On failure every waiter gets the error, and the batch is undone in
// memory (see failBatch): the Journal goes on, and tries again with the
// next batch. It returns the batch's error.
func (j *Journal) commitQueued(force bool) error {
	ops, b, err := j.takeBatch(force)
	if b == nil {
		return err
	}
	err = j.writeBatch(ops)
	j.mu.Lock()
	j.settle(b, ops, err)
	j.mu.Unlock()
	close(b.done)
	return b.err
}

// takeBatch takes the queue as the batch to write, with the clock marks
// due, and returns it with its operations; nil if there is nothing to
// write (lazy-only queues only when force is set), with the error that
// stopped the Journal, if any.
func (j *Journal) takeBatch(force bool) ([]op, *batch, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.poison != nil {
		return nil, nil, j.poison
	}
	if len(j.queue) == 0 || (!j.durable && !force) {
		return nil, nil, nil
	}
	ops, b := j.queue, j.cur
	j.queue, j.cur, j.durable = j.spare, newBatch(), false
	j.spare = nil
	j.writing = b // Sync waits for it while it is written and synced
	if j.high > j.savedHigh {
		// Persist the clock's high-water mark, so that a clock set back
		// before a restart cannot revive a record that had expired.
		ops = append(ops, op{kind: opClock, clock: j.high})
		j.savedHigh = j.high
	}
	if obs := j.obsNs / 1e6; obs-j.savedObs >= seenMarkEvery.Milliseconds() {
		// And the observed time, now and then: what a crash loses of it
		// only makes done records expire that much later.
		ops = append(ops, op{kind: opSeen, clock: obs})
		j.savedObs = obs
	}
	return ops, b, nil
}

// writeBatch writes ops and syncs them. It writes nothing once another
// Journal may have the file (see lockHeld), nor before the file is fit for
// it after a failure (see repair), and succeeds only for what went to the
// journal the directory names (see present). A failure has the file
// repaired: cut back to where the batch began, its frames synced before
// the failure included, since none of it was acknowledged; at once, or,
// should that fail too, before the next write.
func (j *Journal) writeBatch(ops []op) error {
	size, seq := j.size, j.nextSeq
	err := j.lockHeld()
	if err == nil {
		err = j.repair()
	}
	if err == nil {
		err = j.writeOps(ops)
	}
	if err == nil {
		err = j.present()
	}
	if err != nil {
		j.broken, j.size, j.nextSeq = err, size, seq
		if !errors.Is(err, ErrRemoved) { // never cut a file another may own
			// At once, not at the next write: a crash meanwhile would
			// replay the batch's synced frames. Should it fail, the next
			// write tries again.
			_ = j.repair()
		}
		return err
	}
	j.opts.hooks.fail(fpAfterSync)
	return nil
}

// settle ends batch b, whose operations ops were written with the outcome
// err: on success it is acknowledged; a failure that may have lost the
// journal (ErrRemoved: another Journal may have the directory now) stops
// the Journal; any other failure (a full disk, an I/O error) fails the
// batch alone (see failBatch). Callers hold mu.
func (j *Journal) settle(b *batch, ops []op, err error) {
	switch {
	case err == nil:
	case j.poison != nil || errors.Is(err, ErrRemoved):
		j.poisonLocked(err)
		b.err = fmt.Errorf("%w: %w", journal.ErrClosed, j.poison)
	default:
		j.failBatch(b, ops)
		b.err = fmt.Errorf("%w: %w", journal.ErrUnavailable, err)
	}
	for _, id := range b.ids {
		if j.inflight[id] == b {
			delete(j.inflight, id)
		}
	}
	for _, id := range b.dels {
		if j.deleting[id] == b {
			delete(j.deleting, id)
		}
	}
	j.sizeSeen = j.size
	j.writing = nil
	if err == nil && cap(ops) <= maxSpareOps {
		clear(ops) // let the records' ids go
		j.spare = ops[:0]
	}
}

// failBatch undoes in memory batch b, whose write failed, so that the index
// is again what the file holds (once the repair has cut off all of b) plus
// what the queue will write, and a refused Reserve changes nothing: the
// records b created, which its waiters were told were not stored, are
// dropped with their operations, however long the disk stays full, and the
// records they replaced are put back (the file still holds them); b's
// other operations go back to the head of the queue, to be written with
// the next batch (the updates it carried are not lost), and the removals
// among them wait on that batch; its clock marks are written anew. Then,
// with nothing durable queued, the flush timer is armed, so that the lazy
// updates are written once there is room again, whether or not a call
// comes. Callers hold mu.
func (j *Journal) failBatch(b *batch, ops []op) {
	refused := make(map[string]bool, len(b.ids))
	for _, id := range b.ids {
		if j.inflight[id] == b {
			refused[id] = true
		}
	}
	q := make([]op, 0, len(ops)+len(j.queue))
	keptDel := make(map[string]bool)
	for _, o := range ops {
		switch {
		case o.kind == opClock || o.kind == opSeen:
			continue
		case o.create && refused[o.r.id]:
			continue
		case o.kind == opDelete:
			keptDel[o.r.id] = true
		}
		q = append(q, o)
	}
	j.queue = append(q, j.queue...)
	j.savedHigh, j.savedObs = 0, 0 // the next batch carries both marks
	for _, id := range b.dels {
		if j.deleting[id] != b {
			continue
		}
		if keptDel[id] {
			j.deleting[id] = j.cur
			j.cur.dels = append(j.cur.dels, id)
		} else {
			delete(j.deleting, id) // dropped with its creation
		}
	}
	for id := range refused {
		delete(j.inflight, id)
		if _, ok := j.m[id]; !ok {
			continue // forgotten meanwhile: its delete is queued
		}
		j.del(id)
		if old, ok := b.replaced[id]; ok {
			j.insert(&old)
		}
	}
	if len(j.queue) > 0 && !j.durable && !j.flushArmed {
		j.flushArmed = true
		j.flushTimer().Reset(max(j.opts.flushEvery, retryEvery))
	}
}

// retryEvery is the shortest wait before lazy updates that a failed batch
// left queued are written again (the flush interval, if longer): a disk
// that stays full costs at most that many attempts a second.
const retryEvery = 10 * time.Millisecond

// repair makes the file fit for the next write after a failed one
// (broken): the descriptor the failure came through is closed and never
// written or synced again (after a failed fsync, a later one on the same
// descriptor may report synced data that was dropped: PostgreSQL's
// "fsyncgate"), and the file, opened afresh, is cut back to where the
// failed batch began (see writeBatch), the cut synced, so that nothing of
// that batch is left in it, neither for the next frame to follow nor for a
// restart to replay. What was acknowledged lies before that point, synced,
// and is not touched. Another file at the path
// (ErrRemoved) stops the Journal. Only the committer (or Open) calls it.
func (j *Journal) repair() error {
	if j.broken == nil {
		return nil
	}
	f, err := j.reopenActive()
	if errors.Is(err, ErrRemoved) {
		j.failCompaction(err) // another file at the path: stop
	}
	if err != nil {
		return err
	}
	_ = j.f.Close() // the descriptor that failed: its error adds nothing
	j.f, j.broken = f, nil
	return nil
}

// maxSpareOps bounds the queue buffer kept for reuse (see Journal.spare),
// so that a burst does not pin a huge one.
const maxSpareOps = 4096

// How far the observed time may run ahead of the last one written before a
// batch carries it, and before Close writes it.
const (
	seenMarkEvery = time.Minute
	seenMarkClose = time.Second
)

// queueSeen reads the clock and queues the observed time, lazily, if it is
// at least atLeast past the last one written.
func (j *Journal) queueSeen(atLeast time.Duration) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.poison != nil {
		return
	}
	j.observe(j.opts.now())
	if obs := j.obsNs / 1e6; obs-j.savedObs >= atLeast.Milliseconds() {
		j.enqueue(op{kind: opSeen, clock: obs}, false)
		j.savedObs = obs
	}
}

// poisonLocked records the first failure and fails the current batch, whose
// operations will never be written. Callers hold mu.
func (j *Journal) poisonLocked(err error) {
	if j.poison != nil {
		return
	}
	j.poison = fmt.Errorf("journal failed, reopen to recover: %w", err)
	cur := j.cur
	j.queue, j.cur, j.durable = nil, newBatch(), false
	cur.err = fmt.Errorf("%w: %w", journal.ErrClosed, j.poison)
	close(cur.done)
}

// writeOps writes ops as frames of at most maxPayload bytes of payload,
// syncing after each frame, so a huge batch keeps the one-unsynced-frame
// rule.
func (j *Journal) writeOps(ops []op) error {
	w := &j.fw // its scratch buffers are reused from batch to batch
	if w.emit == nil {
		w.emit = j.emitFrame
	}
	w.gen, w.seq = j.gen, j.nextSeq
	err := w.write(ops...)
	if cap(w.frame) > 4*maxPayload || cap(w.recs) > 4*maxPayload || cap(w.payload) > 4*maxPayload {
		w.frame, w.recs, w.payload = nil, nil, nil // do not pin huge buffers
	}
	w.recs, w.count = w.recs[:0], 0 // after a failure, nothing carries over
	return err
}

// emitFrame writes one frame of a batch and syncs it.
func (j *Journal) emitFrame(frame []byte) error {
	j.opts.hooks.fail(fpBeforeWrite)
	if _, err := j.f.Write(frame); err != nil {
		return pathError("write", j.path, err)
	}
	j.opts.hooks.fail(fpAfterWrite)
	if err := j.f.Sync(); err != nil {
		return pathError("sync", j.path, err)
	}
	j.nextSeq++
	j.size += int64(len(frame))
	return nil
}
