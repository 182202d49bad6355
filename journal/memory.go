package journal

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"
)

// DefaultRetention is how long the journals of this module keep a done
// record: the default key window (24 h) plus a day of grace, so that a
// repeat within the window always finds its key.
const DefaultRetention = 48 * time.Hour

// Memory is a Journal that keeps records in memory only. Keys survive
// retries and goroutines but not a restart of the process: use it in tests,
// or for actions whose outcome an application can always check. It is safe
// for concurrent use.
//
// A done record is dropped once its retention (DefaultRetention, or
// MemoryRetention) has passed since it was reserved, measured on the
// monotonic clock of this process, so a wall clock set forward cannot make
// it vanish early. Pending and outcome-unknown records are kept until
// Forget. Expired records are swept as new ones are reserved, so memory
// stays bounded by the actions of one retention period.
type Memory struct {
	mu        sync.Mutex
	closed    bool
	records   map[string]memRecord
	retention time.Duration
	now       func() time.Time
	swept     time.Time
}

type memRecord struct {
	Record
	added time.Time // when reserved, on now
}

// A MemoryOption configures a Memory journal.
type MemoryOption func(*Memory)

// MemoryRetention sets how long a done record is kept (default
// DefaultRetention); it must be at least the Transport's key window, and
// positive (a zero or negative d keeps the default).
func MemoryRetention(d time.Duration) MemoryOption {
	return func(j *Memory) {
		if d > 0 {
			j.retention = d
		}
	}
}

// MemoryClock replaces time.Now, for tests and simulations.
func MemoryClock(now func() time.Time) MemoryOption {
	return func(j *Memory) {
		if now != nil {
			j.now = now
		}
	}
}

// NewMemory returns an empty Memory journal.
func NewMemory(opts ...MemoryOption) *Memory {
	j := &Memory{records: make(map[string]memRecord), retention: DefaultRetention, now: time.Now}
	for _, o := range opts {
		if o != nil {
			o(j)
		}
	}
	j.swept = j.now()
	return j
}

// sweep drops expired done records, at most once per tenth of the
// retention.
func (j *Memory) sweep(now time.Time) {
	if now.Sub(j.swept) < j.retention/10 {
		return
	}
	j.swept = now
	for id, r := range j.records {
		if r.State == StateDone && now.Sub(r.added) >= j.retention {
			delete(j.records, id)
		}
	}
}

// Reserve implements Journal.
func (j *Memory) Reserve(ctx context.Context, rec Record, mode ReserveMode) (Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, false, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return Record{}, false, ErrClosed
	}
	now := j.now()
	j.sweep(now)
	if old, ok := j.records[rec.ActionID]; ok && (mode == ReuseAny || old.State != StateDone) &&
		(old.State != StateDone || now.Sub(old.added) < j.retention) {
		return old.Record, false, nil
	}
	j.records[rec.ActionID] = memRecord{rec, now}
	return rec, true, nil
}

// Update implements Journal.
func (j *Memory) Update(ctx context.Context, rec Record) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return ErrClosed
	}
	old, ok := j.records[rec.ActionID]
	if !ok || old.Key != rec.Key {
		// Another key means another action under the same id (replaced,
		// or forgotten and created again): not the one being updated.
		return fmt.Errorf("update %q: %w", rec.ActionID, ErrNotFound)
	}
	if old.State != StateDone { // done is final
		old.State, old.Status = rec.State, rec.Status
	}
	old.Attempts = max(old.Attempts, rec.Attempts)
	j.records[rec.ActionID] = old
	return nil
}

// Unfinished implements Journal.
func (j *Memory) Unfinished(ctx context.Context) ([]Record, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return nil, ErrClosed
	}
	var out []Record
	for _, r := range j.records {
		if r.State == StatePending || r.State == StateUnknown {
			out = append(out, r.Record)
		}
	}
	sort.Slice(out, func(a, b int) bool {
		if !out[a].CreatedAt.Equal(out[b].CreatedAt) {
			return out[a].CreatedAt.Before(out[b].CreatedAt)
		}
		return out[a].ActionID < out[b].ActionID
	})
	return out, nil
}

// Forget implements Journal.
func (j *Memory) Forget(ctx context.Context, actionID string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return ErrClosed
	}
	delete(j.records, actionID)
	return nil
}

// Close implements Journal. It is safe to call more than once.
func (j *Memory) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.closed = true
	return nil
}

var _ Journal = (*Memory)(nil)
