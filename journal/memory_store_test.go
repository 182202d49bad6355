package journal

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
	"time"
)

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
			j := NewMemory(MemoryClock(clk.Now), MemoryRetention(time.Hour))
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
					var want []Record
					for _, m := range model {
						if m.rec.State != StateDone {
							want = append(want, m.rec)
						}
					}
					got, err := j.Unfinished(ctx)
					if err != nil {
						t.Fatal(err)
					}
					sortRecords(want)
					if len(got) != len(want) {
						t.Fatalf("step %d: %d unfinished, want %d", step, len(got), len(want))
					}
					for i := range got {
						if got[i] != want[i] {
							t.Fatalf("step %d: unfinished %+v, want %+v", step, got[i], want[i])
						}
					}
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
	j := NewMemory(MemoryClock(clk.Now), MemoryRetention(time.Hour))
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
