package journal

import (
	"encoding/binary"
	"fmt"
	"time"
)

// run is the committer goroutine. It alone writes and syncs the file, so
// batch s+1 is never written before the sync of batch s returned, which is
// what recovery's torn-or-corrupt rule relies on.
func (s *Store) run() {
	defer close(s.done)
	flush := time.NewTimer(time.Hour)
	flush.Stop()
	armed := false
	expiry := time.NewTicker(s.opts.ExpiryInterval)
	defer expiry.Stop()
	var compactBackoff time.Time // after a failed automatic compaction
	for {
		stopping, flushDue := false, false
		select {
		case <-s.wake:
		case <-flush.C:
			armed, flushDue = false, true
		case <-s.stop:
			stopping = true
		case reply := <-s.compactCh:
			err := s.commitQueued(true)
			if err == nil {
				err = s.compact()
			}
			reply <- err
			continue
		case <-expiry.C:
			s.queueSeen(seenMarkEvery)
			if s.commitQueued(true) == nil && s.hasExpired() {
				_ = s.compact() // a failure before the rename changes nothing
			}
			continue
		}
		if stopping {
			s.queueSeen(seenMarkClose)
			err := s.commitQueued(true)
			if err == nil && s.f != nil {
				err = s.checkPresent()
			}
			if s.f != nil {
				if cerr := s.f.Close(); err == nil && cerr != nil {
					err = fmt.Errorf("journal: close: %w", cerr)
				}
				s.f = nil
			}
			s.mu.Lock()
			if s.poison != nil {
				// What stopped the Store, now or earlier.
				err = fmt.Errorf("%w: %w", s.opts.ErrClosed, s.poison)
			}
			s.mu.Unlock()
			s.closeErr = err
			flush.Stop()
			return
		}
		s.mu.Lock()
		lazyOnly := len(s.queue) > 0 && !s.durable
		s.mu.Unlock()
		if lazyOnly && !flushDue {
			if !armed {
				flush.Reset(s.opts.FlushInterval)
				armed = true
			}
			continue
		}
		if err := s.commitQueued(flushDue); err != nil {
			continue // the Store is poisoned; Close will report it
		}
		if time.Now().After(compactBackoff) && s.needsCompaction() {
			if err := s.compact(); err != nil {
				compactBackoff = time.Now().Add(time.Minute)
			}
		}
	}
}

// commitQueued takes the queue as one batch, writes and syncs it, and
// acknowledges its waiters. Lazy-only queues are written only when force is
// set. On failure the Store is poisoned and every waiter gets the error.
func (s *Store) commitQueued(force bool) error {
	s.mu.Lock()
	if s.poison != nil {
		err := s.poison
		s.mu.Unlock()
		return err
	}
	if len(s.queue) == 0 || (!s.durable && !force) {
		s.mu.Unlock()
		return nil
	}
	ops, b := s.queue, s.cur
	s.queue, s.cur, s.durable = nil, newBatch(), false
	s.writing = b // Sync waits for it while it is written and synced
	if s.high > s.savedHigh {
		// Persist the clock's high-water mark, so that a clock set back
		// before a restart cannot revive a record that had expired.
		ops = append(ops, op{kind: opClock, clock: s.high})
		s.savedHigh = s.high
	}
	if obs := s.obsNs / 1e6; obs-s.savedObs >= seenMarkEvery.Milliseconds() {
		// And the observed time, now and then: what a crash loses of it
		// only makes done records expire that much later.
		ops = append(ops, op{kind: opSeen, clock: obs})
		s.savedObs = obs
	}
	s.mu.Unlock()

	err := s.writeOps(ops)
	if err == nil {
		// Acknowledge only what went to the journal the directory names.
		err = s.present()
	}
	if err == nil {
		s.opts.Hooks.fail(FPAfterSync)
	}

	s.mu.Lock()
	if err != nil {
		s.poisonLocked(err)
		b.err = fmt.Errorf("%w: %w", s.opts.ErrClosed, s.poison)
	}
	for _, id := range b.ids {
		if s.inflight[id] == b {
			delete(s.inflight, id)
		}
	}
	for _, id := range b.dels {
		if s.deleting[id] == b {
			delete(s.deleting, id)
		}
	}
	s.sizeSeen = s.size
	s.writing = nil
	s.mu.Unlock()
	close(b.done)
	return err
}

// How far the observed time may run ahead of the last one written before a
// batch carries it, and before Close writes it.
const (
	seenMarkEvery = time.Minute
	seenMarkClose = time.Second
)

// queueSeen reads the clock and queues the observed time, lazily, if it is
// at least atLeast past the last one written.
func (s *Store) queueSeen(atLeast time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.poison != nil {
		return
	}
	s.observe(s.opts.Now())
	if obs := s.obsNs / 1e6; obs-s.savedObs >= atLeast.Milliseconds() {
		s.enqueue(op{kind: opSeen, clock: obs}, false)
		s.savedObs = obs
	}
}

// poisonLocked records the first failure and fails the current batch, whose
// operations will never be written. Callers hold mu.
func (s *Store) poisonLocked(err error) {
	if s.poison != nil {
		return
	}
	s.poison = fmt.Errorf("journal failed, reopen to recover: %w", err)
	cur := s.cur
	s.queue, s.cur, s.durable = nil, newBatch(), false
	cur.err = fmt.Errorf("%w: %w", s.opts.ErrClosed, s.poison)
	close(cur.done)
}

// writeOps writes ops as frames of at most MaxPayload bytes, syncing after
// each frame, so a huge batch keeps the one-unsynced-frame rule.
func (s *Store) writeOps(ops []op) error {
	var recs []byte
	count := 0
	flush := func() error {
		if count == 0 {
			return nil
		}
		payload := binary.AppendUvarint(make([]byte, 0, len(recs)+10), uint64(count))
		payload = append(payload, recs...)
		s.buf = appendFrame(s.buf[:0], s.gen, s.nextSeq, payload)
		recs, count = recs[:0], 0
		s.opts.Hooks.fail(FPBeforeWrite)
		if _, err := s.f.Write(s.buf); err != nil {
			return fmt.Errorf("write %s: %w", s.path, err)
		}
		s.opts.Hooks.fail(FPAfterWrite)
		if err := s.f.Sync(); err != nil {
			return fmt.Errorf("sync %s: %w", s.path, err)
		}
		s.nextSeq++
		s.size += int64(len(s.buf))
		if cap(s.buf) > 4*MaxPayload {
			s.buf = nil // do not pin a huge buffer
		}
		return nil
	}
	for i := range ops {
		n := len(recs)
		recs = appendOp(recs, &ops[i])
		if len(recs)+binary.MaxVarintLen64 > MaxPayload {
			recs = recs[:n]
			if err := flush(); err != nil {
				return err
			}
			recs = appendOp(recs, &ops[i])
		}
		count++
	}
	return flush()
}
