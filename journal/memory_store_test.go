package journal

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
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
	j := NewMemory(WithClock(clk.Now))
	reserve := func(id string, mode ReserveMode) (Record, bool) {
		r, created, err := j.Reserve(ctx, Record{ActionID: id, Key: fmt.Sprintf("k-%s-%d", id, clk.Now().UnixNano()), CreatedAt: clk.Now(), State: StatePending}, mode)
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

// Memory keeps its records where the garbage collector does not scan them,
// indexed by a hash of the action id. Its answers must be those of a plain
// map of records whatever the ids' hashes do: here the hashes are cut to two
// bits, so that every lookup walks a chain of colliding ids, and a random
// run of Reserve, Update, Forget and expiry (which compacts the store) is
// checked against a model after every step.
func TestMemoryMatchesAModelWhenIdsCollide(t *testing.T) {
	for _, mask := range []uint64{0, 3, 1<<64 - 1} {
		t.Run(fmt.Sprintf("mask=%#x", mask), func(t *testing.T) {
			ctx := context.Background()
			clk := &stepClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
			j := NewMemory(WithClock(clk.Now), WithKeyWindow(time.Hour), WithGrace(0))
			j.mask = mask
			model := map[string]modelRec{}
			rng := rand.New(rand.NewPCG(1, mask))
			ids := make([]string, 300)
			for i := range ids {
				// Long ids, so that forgotten ones make the id text compact.
				ids[i] = fmt.Sprintf("pay:%d:%s", i, strings.Repeat("x", rng.IntN(600)))
			}
			keyN := 0
			swept := clk.Now()
			for step := range 6000 {
				id := ids[rng.IntN(len(ids))]
				switch op := rng.IntN(10); {
				case op < 4:
					if clk.Now().Sub(swept) >= time.Hour/10 { // the sweep Reserve makes
						swept = clk.Now()
						for id, m := range model {
							if m.rec.State == StateDone && clk.Now().Sub(m.added) >= time.Hour {
								delete(model, id)
							}
						}
					}
					keyN++
					mode := ReserveMode(rng.IntN(2))
					want := Record{ActionID: id, Key: fmt.Sprint("k", keyN), CreatedAt: clk.Now().Add(time.Duration(step) * time.Nanosecond),
						State: StatePending, Attempts: rng.IntN(3), Fingerprint: Fingerprint{byte(step)}}
					got, created, err := j.Reserve(ctx, want, mode)
					if err != nil {
						t.Fatal(err)
					}
					old, ok := model[id]
					keep := ok && (mode == ReuseAny || old.rec.State != StateDone) &&
						(old.rec.State != StateDone || clk.Now().Sub(old.added) < time.Hour)
					if keep {
						if created || got != old.rec {
							t.Fatalf("step %d: Reserve(%q) = %+v, created %v; want the existing %+v", step, id, got, created, old.rec)
						}
					} else {
						if !created || got != want {
							t.Fatalf("step %d: Reserve(%q) = %+v, created %v; want a new record", step, id, got, created)
						}
						model[id] = modelRec{want, clk.Now()}
					}
				case op < 7:
					m, ok := model[id]
					upd := Record{ActionID: id, Key: "none", State: State(1 + rng.IntN(3)), Attempts: rng.IntN(5), Status: 200 + rng.IntN(3)}
					if ok && rng.IntN(5) > 0 {
						upd.Key = m.rec.Key
					}
					if !updateModel(ctx, t, j, model, step, upd) {
						continue
					}
				case op < 8:
					if err := j.Forget(ctx, id); err != nil {
						t.Fatal(err)
					}
					delete(model, id)
				default:
					clk.Add(time.Duration(rng.IntN(20)) * time.Minute)
				}
				if step%25 == 0 {
					checkUnfinished(ctx, t, j, model, step)
				}
			}
			j.mu.Lock()
			defer j.mu.Unlock()
			if live := j.n - len(j.free); live != len(model) {
				t.Fatalf("%d entries in use for %d records", live, len(model))
			}
		})
	}
}

// modelRec is a record of the model a Memory is checked against, with when
// it was added.
type modelRec struct {
	rec   Record
	added time.Time
}

// updateModel makes the Update upd on j and on the model: an Update of a
// record the model does not hold under upd.Key must fail with ErrNotFound
// (and updateModel reports false); otherwise it must succeed, and a record
// not yet done takes upd's state and status, its attempts never going down.
func updateModel(ctx context.Context, t *testing.T, j *Memory, model map[string]modelRec, step int, upd Record) bool {
	t.Helper()
	m, ok := model[upd.ActionID]
	err := j.Update(ctx, upd)
	if !ok || upd.Key != m.rec.Key {
		if !errors.Is(err, ErrNotFound) {
			t.Fatalf("step %d: Update of a missing record: %v", step, err)
		}
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	if m.rec.State != StateDone {
		m.rec.State, m.rec.Status = upd.State, upd.Status
	}
	m.rec.Attempts = max(m.rec.Attempts, upd.Attempts)
	model[upd.ActionID] = m
	return true
}

// checkUnfinished fails unless j's Unfinished lists the model's records
// that are not done, oldest first, and returns what it listed.
func checkUnfinished(ctx context.Context, t *testing.T, j *Memory, model map[string]modelRec, step int) []Record {
	t.Helper()
	got, err := j.Unfinished(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var want []Record
	for _, m := range model {
		if m.rec.State != StateDone {
			want = append(want, m.rec)
		}
	}
	sortRecords(want)
	if len(got) != len(want) {
		t.Fatalf("step %d: %d unfinished, want %d", step, len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("step %d: unfinished[%d] %+v, want %+v", step, i, got[i], want[i])
		}
	}
	return got
}

func sortRecords(rs []Record) {
	sort.Slice(rs, func(a, b int) bool {
		if !rs[a].CreatedAt.Equal(rs[b].CreatedAt) {
			return rs[a].CreatedAt.Before(rs[b].CreatedAt)
		}
		return rs[a].ActionID < rs[b].ActionID
	})
}

// A record reads back as it was given: CreatedAt with its location and its
// monotonic clock reading, as the Transport's windows may compare them.
func TestMemoryReturnsCreatedAtAsGiven(t *testing.T) {
	ctx := context.Background()
	j := NewMemory()
	at := time.Now().In(time.FixedZone("X", 3600))
	rec := Record{ActionID: "a", Key: "k", CreatedAt: at, State: StatePending}
	if _, _, err := j.Reserve(ctx, rec, ReuseAny); err != nil {
		t.Fatal(err)
	}
	got, created, err := j.Reserve(ctx, Record{ActionID: "a", Key: "other", CreatedAt: time.Now(), State: StatePending}, ReuseAny)
	if err != nil || created {
		t.Fatal(err, created)
	}
	if got != rec {
		t.Fatalf("got %+v, want %+v", got, rec)
	}
	var nb NonBlocker = j
	if !nb.NeverBlocks(j) {
		t.Fatal("Memory says it may block")
	}
	// A journal that embeds a Memory inherits the method, not the claim.
	type wrapper struct{ *Memory }
	if w := (wrapper{j}); w.NeverBlocks(w) {
		t.Fatal("a claim inherited by a journal that embeds a Memory")
	}
	if other := NewMemory(); nb.NeverBlocks(other) {
		t.Fatalf("a claim for another journal %p %p", other, j)
	}
}

// After a busy period expires, the store shrinks: its entries and id text
// are moved together, and the records left are still found.
func TestMemoryShrinksAfterExpiry(t *testing.T) {
	for _, mask := range []uint64{255, 1<<64 - 1} {
		t.Run(fmt.Sprintf("mask=%#x", mask), func(t *testing.T) { shrinksAfterExpiry(t, mask) })
	}
}

func shrinksAfterExpiry(t *testing.T, mask uint64) {
	ctx := context.Background()
	clk := &stepClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	j := NewMemory(WithClock(clk.Now), WithKeyWindow(time.Hour), WithGrace(0))
	j.mask = mask
	var kept []Record
	for i := range 20000 {
		r, _, err := j.Reserve(ctx, Record{ActionID: fmt.Sprint("a", i), Key: fmt.Sprint("k", i), CreatedAt: clk.Now(), State: StatePending}, ReuseAny)
		if err != nil {
			t.Fatal(err)
		}
		if i%100 == 0 {
			kept = append(kept, r)
			continue
		}
		r.State, r.Status = StateDone, 201
		if err := j.Update(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	clk.Add(2 * time.Hour)
	if _, _, err := j.Reserve(ctx, Record{ActionID: "trigger", Key: "k", CreatedAt: clk.Now(), State: StatePending}, ReuseAny); err != nil {
		t.Fatal(err)
	}
	j.mu.Lock()
	n, text := j.n, j.size
	j.mu.Unlock()
	if n > 4*(len(kept)+1) || text > 4*(len(kept)+1)*16 {
		t.Fatalf("%d entries and %d bytes of text held for %d records", n, text, len(kept)+1)
	}
	for _, r := range kept {
		got, created, err := j.Reserve(ctx, Record{ActionID: r.ActionID, Key: "new", CreatedAt: clk.Now(), State: StatePending}, ReusePending)
		if err != nil || created || got != r {
			t.Fatalf("after shrinking: %+v, created %v, %v; want %+v", got, created, err, r)
		}
	}
}

// The paged Memory (from a review of it): a model run long enough, over enough ids, for
// both compactions (text at half unused, entries at the sweep when three
// quarters are unused) to run many times, with ids of the longest length,
// colliding hashes, and the records handed out earlier checked at the end
// against copies taken when they were returned (a Record aliasing chunk
// memory that a compaction reuses would have changed).
func TestMemoryModelThroughCompactions(t *testing.T) {
	for _, mask := range []uint64{0, 7, 1<<64 - 1} {
		t.Run(fmt.Sprintf("mask=%#x", mask), func(t *testing.T) {
			ctx := context.Background()
			clk := &stepClock{t: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)}
			const ret = time.Hour
			j := NewMemory(WithClock(clk.Now), WithKeyWindow(ret), WithGrace(0))
			j.mask = mask
			model := map[string]modelRec{}
			rng := rand.New(rand.NewPCG(7, mask))
			ids := make([]string, 2000)
			for i := range ids {
				n := rng.IntN(40)
				ids[i] = fmt.Sprintf("id-%d-%s", i, strings.Repeat("y", n))
				if i%500 == 0 { // the longest id a journal keeps
					ids[i] = fmt.Sprintf("id-%d-%s", i, strings.Repeat("y", MaxActionID))[:MaxActionID]
				}
			}
			type handed struct {
				got  Record
				copy Record
			}
			var kept []handed
			keep := func(r Record) {
				if rng.IntN(20) == 0 {
					c := r
					c.ActionID = strings.Clone(r.ActionID)
					c.Key = strings.Clone(r.Key)
					kept = append(kept, handed{r, c})
				}
			}
			swept := clk.Now()
			sweepModel := func() { // the sweep each Reserve makes
				if clk.Now().Sub(swept) >= ret/10 {
					swept = clk.Now()
					for id, m := range model {
						if m.rec.State == StateDone && clk.Now().Sub(m.added) >= ret {
							delete(model, id)
						}
					}
				}
			}
			var compactions, textCompactions int
			for step := range 20000 {
				id := ids[rng.IntN(len(ids))]
				if step%4000 == 3999 {
					// A busy period ends: most records done, then expired, so
					// that the next sweep leaves few entries and compacts them.
					for id, m := range model {
						if rng.IntN(10) == 0 {
							continue
						}
						m.rec.State, m.rec.Status = StateDone, 200
						if err := j.Update(ctx, m.rec); err != nil {
							t.Fatal(err)
						}
						model[id] = m
					}
					clk.Add(2 * ret)
				}
				switch op := rng.IntN(80); {
				case op < 36 || op == 79:
					sweepModel()
					key := fmt.Sprintf("k%d-%s", step, strings.Repeat("z", rng.IntN(30)))
					mode := ReserveMode(rng.IntN(2))
					want := Record{ActionID: id, Key: key, CreatedAt: clk.Now().Add(time.Duration(step)), State: StatePending,
						Attempts: rng.IntN(3), Fingerprint: Fingerprint{byte(step), byte(step >> 8)}}
					j.mu.Lock()
					n0, size0 := j.n, j.size
					j.mu.Unlock()
					got, created, err := j.Reserve(ctx, want, mode)
					if err != nil {
						t.Fatal(err)
					}
					j.mu.Lock()
					if j.n < n0 {
						compactions++
					}
					if j.size < size0 {
						textCompactions++
					}
					j.mu.Unlock()
					old, ok := model[id]
					reuse := ok && (mode == ReuseAny || old.rec.State != StateDone) &&
						(old.rec.State != StateDone || clk.Now().Sub(old.added) < ret)
					if reuse {
						if created || got != old.rec {
							t.Fatalf("step %d: Reserve(%.20q) = %+v, created %v; want the existing record", step, id, got, created)
						}
					} else {
						if !created || got != want {
							t.Fatalf("step %d: Reserve(%.20q) created %v; want a new record", step, id, created)
						}
						model[id] = modelRec{want, clk.Now()}
					}
					keep(got)
				case op < 56:
					m, ok := model[id]
					upd := Record{ActionID: id, Key: "other", State: State(1 + rng.IntN(3)), Attempts: rng.IntN(6), Status: 200 + rng.IntN(5)}
					if ok && rng.IntN(6) > 0 {
						upd.Key = m.rec.Key
					}
					if ok && rng.IntN(2) == 0 {
						upd.State = StateDone // most actions end done, so that sweeps have work
					}
					if !updateModel(ctx, t, j, model, step, upd) {
						continue
					}
				case op < 64:
					if err := j.Forget(ctx, id); err != nil {
						t.Fatal(err)
					}
					delete(model, id)
					// Forget then Reserve of the same id: a new record.
					if rng.IntN(2) == 0 {
						sweepModel()
						r := Record{ActionID: id, Key: fmt.Sprint("again", step), CreatedAt: clk.Now(), State: StatePending}
						got, created, err := j.Reserve(ctx, r, ReuseAny)
						if err != nil || !created || got != r {
							t.Fatalf("step %d: Reserve after Forget: %+v, %v, %v", step, got, created, err)
						}
						model[id] = modelRec{r, clk.Now()}
						keep(got)
					}
				case op < 68:
					clk.Add(time.Duration(rng.IntN(30)) * time.Minute)
				case op == 68:
					for _, r := range checkUnfinished(ctx, t, j, model, step) {
						keep(r)
					}
				}
			}
			for i, h := range kept {
				if h.got != h.copy {
					t.Fatalf("record %d handed out earlier changed: %.40q/%q, was %.40q/%q", i, h.got.ActionID, h.got.Key, h.copy.ActionID, h.copy.Key)
				}
			}
			// Every record of the model reads back exactly.
			for id, m := range model {
				if m.rec.State == StateDone && clk.Now().Sub(m.added) >= ret {
					continue // expired: replaced by the probe
				}
				got, created, err := j.Reserve(ctx, Record{ActionID: id, Key: "probe", CreatedAt: clk.Now(), State: StatePending}, ReuseAny)
				if err != nil || created || got != m.rec {
					t.Fatalf("%.20q: %+v created %v %v, want %+v", id, got, created, err, m.rec)
				}
			}
			if compactions == 0 || textCompactions == 0 {
				t.Fatalf("the run made %d entry and %d text compactions: it tests neither", compactions, textCompactions)
			}
			t.Logf("%d entry compactions, %d text compactions, %d records kept", compactions, textCompactions, len(kept))
		})
	}
}

// Concurrent callers on few ids, while the clock moves and records expire
// and are compacted away: run under -race. Each goroutine owns its ids, so
// it can check what it reads back.
func TestMemoryConcurrentWithSweeps(t *testing.T) {
	ctx := context.Background()
	clk := &stepClock{t: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)}
	j := NewMemory(WithClock(clk.Now), WithKeyWindow(time.Minute), WithGrace(0))
	j.mask = 15
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			for i := range 6000 {
				id := fmt.Sprintf("g%d-%d-%s", g, rng.IntN(400), strings.Repeat("q", rng.IntN(50)))
				r := Record{ActionID: id, Key: fmt.Sprintf("k%d-%d", g, i), CreatedAt: clk.Now(), State: StatePending}
				got, _, err := j.Reserve(ctx, r, ReusePending)
				if err != nil {
					errc <- err
					return
				}
				if got.ActionID != id || !strings.HasPrefix(got.Key, fmt.Sprintf("k%d-", g)) {
					errc <- fmt.Errorf("Reserve(%q) returned %q/%q", id, got.ActionID, got.Key)
					return
				}
				got.State, got.Status = StateDone, 201
				if err := j.Update(ctx, got); err != nil {
					errc <- err
					return
				}
				switch rng.IntN(10) {
				case 0:
					if err := j.Forget(ctx, id); err != nil {
						errc <- err
						return
					}
				case 1:
					clk.Add(7 * time.Second)
				case 2:
					if _, err := j.Unfinished(ctx); err != nil {
						errc <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if !j.NeverBlocks(j) || j.NeverBlocks(NewMemory()) || j.NeverBlocks(nil) {
		t.Fatal("NeverBlocks must be true for the journal itself only")
	}
}

// A done record reserved again after its retention: ReusePending and
// ReuseAny both get a new record; before it, ReuseAny keeps it. Update of
// the expired (swept) record by its old key is ErrNotFound.
func TestMemoryRetentionBoundary(t *testing.T) {
	ctx := context.Background()
	clk := &stepClock{t: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)}
	j := NewMemory(WithClock(clk.Now), WithKeyWindow(40*time.Minute), WithGrace(20*time.Minute)) // a retention of 1 h
	r := Record{ActionID: "a", Key: "k1", CreatedAt: clk.Now(), State: StatePending}
	if _, _, err := j.Reserve(ctx, r, ReuseAny); err != nil {
		t.Fatal(err)
	}
	r.State, r.Status = StateDone, 200
	if err := j.Update(ctx, r); err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Hour - time.Nanosecond)
	got, created, err := j.Reserve(ctx, Record{ActionID: "a", Key: "k2", CreatedAt: clk.Now(), State: StatePending}, ReuseAny)
	if err != nil || created || got.Key != "k1" || got.State != StateDone {
		t.Fatalf("within retention: %+v %v %v", got, created, err)
	}
	clk.Add(time.Nanosecond)
	got, created, err = j.Reserve(ctx, Record{ActionID: "a", Key: "k3", CreatedAt: clk.Now(), State: StatePending}, ReuseAny)
	if err != nil || !created || got.Key != "k3" {
		t.Fatalf("at retention: %+v %v %v", got, created, err)
	}
	if err := j.Update(ctx, r); !errors.Is(err, ErrNotFound) {
		t.Fatalf("update of the replaced record: %v", err)
	}
}

// A Memory keeps a done record for the key window plus the grace; a value
// it cannot use keeps the default, and a sum that would overflow keeps
// records "forever". MemoryRetention(d), deprecated, is a window of d
// without grace.
func TestMemoryRetentionOptions(t *testing.T) {
	for name, c := range map[string]struct {
		opts []MemoryOption
		want time.Duration
	}{
		"defaults":               {nil, DefaultRetention},
		"window and grace":       {[]MemoryOption{WithKeyWindow(time.Hour), WithGrace(time.Minute)}, time.Hour + time.Minute},
		"no grace":               {[]MemoryOption{WithGrace(0)}, DefaultKeyWindow},
		"zero window keeps":      {[]MemoryOption{WithKeyWindow(0)}, DefaultRetention},
		"negative grace keeps":   {[]MemoryOption{WithGrace(-time.Second)}, DefaultRetention},
		"overflow saturates":     {[]MemoryOption{WithKeyWindow(math.MaxInt64)}, math.MaxInt64},
		"MemoryRetention":        {[]MemoryOption{MemoryRetention(time.Hour)}, time.Hour},
		"later option overrides": {[]MemoryOption{MemoryRetention(time.Hour), WithGrace(time.Minute)}, time.Hour + time.Minute},
		"nil option skipped":     {[]MemoryOption{nil}, DefaultRetention},
	} {
		if got := NewMemory(c.opts...).retention; got != c.want {
			t.Errorf("%s: retention %v, want %v", name, got, c.want)
		}
	}
}
