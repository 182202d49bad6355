package journal

import (
	"context"
	"fmt"
	"sort"
	"sync"
)

// Memory is a Journal that keeps records in memory only. Keys survive
// retries and goroutines but not a restart of the process: use it in tests,
// or for actions whose outcome an application can always check. It is safe
// for concurrent use. Expired records are never dropped.
type Memory struct {
	mu      sync.Mutex
	closed  bool
	records map[string]Record
}

// NewMemory returns an empty Memory journal.
func NewMemory() *Memory {
	return &Memory{records: make(map[string]Record)}
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
	if old, ok := j.records[rec.ActionID]; ok && (mode == ReuseAny || old.State != StateDone) {
		return old, false, nil
	}
	j.records[rec.ActionID] = rec
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
			out = append(out, r)
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
