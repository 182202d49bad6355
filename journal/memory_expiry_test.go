package journal

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

type stepClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *stepClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *stepClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// Done records expire after the retention, pending ones never; the memory
// a long-lived process holds stays bounded by one retention period.
func TestMemoryExpiresDoneRecords(t *testing.T) {
	ctx := context.Background()
	clk := &stepClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	j := NewMemory(MemoryClock(clk.Now))
	reserve := func(id string, mode ReserveMode) (Record, bool) {
		r, created, err := j.Reserve(ctx, Record{ActionID: id, Key: "k-" + id + clk.Now().String(), CreatedAt: clk.Now(), State: StatePending}, mode)
		if err != nil {
			t.Fatal(err)
		}
		return r, created
	}
	done, _ := reserve("done", ReuseAny)
	done.State, done.Status = StateDone, 201
	if err := j.Update(ctx, done); err != nil {
		t.Fatal(err)
	}
	pending, _ := reserve("pending", ReuseAny)

	clk.Add(DefaultRetention - time.Minute)
	if r, created := reserve("done", ReuseAny); created || r.Key != done.Key {
		t.Fatalf("a done record vanished before its retention: created=%v", created)
	}
	clk.Add(2 * time.Minute)
	if _, created := reserve("done", ReuseAny); !created {
		t.Fatal("a done record outlived its retention")
	}
	clk.Add(365 * 24 * time.Hour)
	if r, created := reserve("pending", ReuseAny); created || r.Key != pending.Key {
		t.Fatal("a pending record expired")
	}

	for i := range 1000 {
		r, _ := reserve(fmt.Sprint("bulk-", i), ReuseAny)
		r.State = StateDone
		if err := j.Update(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	clk.Add(DefaultRetention + time.Hour)
	reserve("trigger", ReuseAny)
	j.mu.Lock()
	n := len(j.records)
	j.mu.Unlock()
	if n > 10 {
		t.Fatalf("%d records held after every done one expired", n)
	}
}
