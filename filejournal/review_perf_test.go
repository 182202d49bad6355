package filejournal

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/require"
)

// Adversarial review of the performance series 3f631c7..6ff9f26 (wrap only
// on error; a created record returned with the caller's key string; Update
// in place; one lookup in Reserve; parseUUID by table). These tests try to
// make the journal's index, its live-bytes estimate or the keys it returns
// diverge from what a read or a replay of the file gives.

// reviewCheckIndex checks the index's invariants under mu: every ref of m
// is distinct and not on the slab's free list; a slot flagged custom has a
// non-empty key in custom and custom holds nothing else; live is the sum of
// the encoded sizes of the records in m.
func reviewCheckIndex(j *Journal) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	free := make(map[ref]bool, len(j.slots.free))
	for _, r := range j.slots.free {
		free[r] = true
	}
	seen := make(map[ref]string, len(j.m))
	var sum int64
	for id, h := range j.m {
		if free[h] {
			return fmt.Errorf("%q: ref %d is on the free list", id, h)
		}
		if other, dup := seen[h]; dup {
			return fmt.Errorf("%q and %q share ref %d", id, other, h)
		}
		seen[h] = id
		sl := j.slots.at(h)
		if sl.custom != (j.custom[id] != "") {
			return fmt.Errorf("%q: slot custom %v, custom map %q", id, sl.custom, j.custom[id])
		}
		r := j.recOf(id, &h)
		sum += r.size()
	}
	for id := range j.custom {
		if h, ok := j.m[id]; !ok || !j.slots.at(h).custom {
			return fmt.Errorf("stale custom key %q of %q", j.custom[id], id)
		}
	}
	if sum != j.live {
		return fmt.Errorf("live %d, records' size %d", j.live, sum)
	}
	return nil
}

// reviewUnexpired returns the index's unexpired records, by stored id, and
// the sum of their sizes.
func reviewUnexpired(j *Journal) (map[string]journal.Record, int64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	now := j.now()
	out := make(map[string]journal.Record, len(j.m))
	var live int64
	for id, h := range j.m {
		if j.expired(&h, now) {
			continue
		}
		r := j.recOf(id, &h)
		live += r.size()
		out[id] = r.record(id)
	}
	return out, live
}

// keyForms returns, for a canonical UUID u, keys that spell it in forms
// other than the one formatUUID writes, and near misses of that form.
func keyForms(u string) []string {
	up := strings.ToUpper(u)
	mixed := []byte(u)
	for i := range mixed {
		if i%2 == 0 {
			mixed[i] = strings.ToUpper(string(mixed[i]))[0]
		}
	}
	return []string{
		u,
		up,
		string(mixed),
		"{" + u + "}",
		"urn:uuid:" + u,
		strings.ReplaceAll(u, "-", ""),
		u[:8] + u[9:13] + "-" + u[8:9] + u[13:], // a dash moved: still 36 bytes
		u[:35] + "g",                            // not hex
		u[:35] + "G",
		u[:8] + "_" + u[9:], // not a dash where one goes
	}
}

// TestReviewCreatedKeyReadsBackAsReturned: the key a creating Reserve
// returns (the caller's string, not the stored bytes formatted) is the key
// every later read returns, in this run and after a reopen, for UUIDs
// spelled any way and near misses of the canonical form, with and without
// hashed ids; Update takes it, and not another spelling of the same UUID.
func TestReviewCreatedKeyReadsBackAsReturned(t *testing.T) {
	for _, hashed := range []bool{false, true} {
		t.Run(fmt.Sprintf("hashed=%v", hashed), func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			o := testOpts()
			o.hashed = hashed
			j, _ := mustOpen(t, dir, o)
			var recs []journal.Record
			add := func(key string) {
				e := entry(fmt.Sprintf("a-%d", len(recs)))
				e.Key = key
				got, created, err := j.Reserve(ctx, e, journal.ReuseAny)
				require.NoError(t, err)
				require.True(t, created)
				require.Equal(t, key, got.Key)
				again, created, err := j.Reserve(ctx, e, journal.ReuseAny)
				require.NoError(t, err)
				require.False(t, created)
				require.Equal(t, got.Key, again.Key, "a read returns another key than the creating Reserve")
				recs = append(recs, got)
			}
			for range 8 {
				for _, k := range keyForms(newKey()) {
					add(k)
				}
			}
			// Random near misses: one byte of a canonical UUID replaced by
			// any visible ASCII byte.
			r := rand.New(rand.NewPCG(1, 2))
			for range 300 {
				b := []byte(newKey())
				b[r.IntN(len(b))] = byte(0x21 + r.IntN(0x7e-0x21+1))
				add(string(b))
			}
			require.NoError(t, reviewCheckIndex(j))
			for _, rec := range recs {
				var k [16]byte
				if parseUUID(rec.Key, &k) {
					require.Equal(t, rec.Key, formatUUID(&k), "parseUUID took a key formatUUID would not write")
				}
				// Another spelling of the same UUID is another key.
				if up := strings.ToUpper(rec.Key); up != rec.Key {
					other := rec
					other.Key, other.Attempts = up, 9
					require.ErrorIs(t, j.Update(ctx, other), journal.ErrNotFound)
				}
				if lo := strings.ToLower(rec.Key); lo != rec.Key {
					other := rec
					other.Key, other.Attempts = lo, 9
					require.ErrorIs(t, j.Update(ctx, other), journal.ErrNotFound)
				}
				upd := rec
				upd.Attempts = 200 // crosses a varint boundary: an in-place change of size
				require.NoError(t, j.Update(ctx, upd))
			}
			require.NoError(t, reviewCheckIndex(j))
			before := j.stats()
			require.NoError(t, j.Close())

			j, _ = mustOpen(t, dir, o)
			defer j.Close()
			require.NoError(t, reviewCheckIndex(j))
			require.Equal(t, before.LiveBytes, j.stats().LiveBytes)
			unf, err := j.Unfinished(ctx)
			require.NoError(t, err)
			byID := map[string]string{}
			for _, u := range unf {
				byID[u.ActionID] = u.Key
			}
			for _, rec := range recs {
				got, created, err := j.Reserve(ctx, rec, journal.ReuseAny)
				require.NoError(t, err)
				require.False(t, created)
				require.Equal(t, rec.Key, got.Key)
				require.Equal(t, 200, got.Attempts)
				listed := rec.ActionID
				if hashed {
					listed = journal.Digest(rec.ActionID)
				}
				require.Equal(t, rec.Key, byID[listed])
			}
		})
	}
}

// TestReviewIndexConsistentUnderChurn: many goroutines create (both modes,
// any state, keys switching between UUIDs, other spellings of UUIDs and
// custom strings), update in place, forget, compact (by hand and by
// themselves, the file being kept small) and expire records (a fake clock
// jumping past the retention) on a few shared ids. Throughout, the index
// keeps its invariants (no stale custom key, live is the records' size, no
// ref shared or freed); after a reopen the unexpired records and their live
// bytes are those the closed journal held.
func TestReviewIndexConsistentUnderChurn(t *testing.T) {
	for _, hashed := range []bool{false, true} {
		t.Run(fmt.Sprintf("hashed=%v", hashed), func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			o, clk, _ := hourClock()
			o.hashed = hashed
			o.compactMin = 4096 // compact by itself, often
			o.flushEvery = time.Millisecond
			j, _ := mustOpen(t, dir, o)

			ids := make([]string, 24)
			for i := range ids {
				ids[i] = fmt.Sprintf("churn-%d", i)
			}
			keyOf := func(r *rand.Rand) string {
				u := newKey()
				switch r.IntN(4) {
				case 0:
					return strings.ToUpper(u)
				case 1:
					return "custom-" + u[:r.IntN(30)+1]
				}
				return u
			}
			var (
				wg      sync.WaitGroup
				errMu   sync.Mutex
				errs    []error
				stopped = make(chan struct{})
			)
			fail := func(err error) {
				errMu.Lock()
				errs = append(errs, err)
				errMu.Unlock()
			}
			const workers = 4
			for g := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(g), 7))
					for i := 0; i < 2500; i++ {
						id := ids[r.IntN(len(ids))]
						switch op := r.IntN(10); {
						case op < 4:
							e := journal.Record{ActionID: id, Key: keyOf(r), CreatedAt: clk.Now(),
								State: journal.State(1 + r.IntN(3)), Attempts: r.IntN(300), Status: r.IntN(600)}
							copy(e.Fingerprint[:], id)
							mode := journal.ReuseAny
							if r.IntN(2) == 0 {
								mode = journal.ReusePending
							}
							got, created, err := j.Reserve(ctx, e, mode)
							if err != nil {
								fail(err)
								return
							}
							if created && got.Key != e.Key {
								fail(fmt.Errorf("created %s with key %q, returned %q", id, e.Key, got.Key))
							}
						case op < 8:
							sid := j.storedID(id)
							cur, ok, err := j.get(sid)
							if err != nil {
								fail(err)
								return
							}
							if !ok {
								continue
							}
							cur.ActionID = id
							cur.Attempts = []int{1, 127, 128, 16383, 16384, 20000}[r.IntN(6)]
							cur.Status = r.IntN(600)
							if r.IntN(4) == 0 {
								cur.State = journal.StateDone
							}
							if err := j.Update(ctx, cur); err != nil && !errors.Is(err, journal.ErrNotFound) {
								fail(err)
								return
							}
						case op < 9:
							if err := j.Forget(ctx, id); err != nil {
								fail(err)
								return
							}
						default:
							if err := reviewCheckIndex(j); err != nil {
								fail(err)
								return
							}
						}
					}
				}()
			}
			bg := make(chan struct{})
			go func() {
				defer close(bg)
				for i := 0; ; i++ {
					select {
					case <-stopped:
						return
					case <-time.After(3 * time.Millisecond):
					}
					if i%3 == 0 {
						clk.Set(clk.Now().Add(2 * time.Hour)) // done records expire
					}
					if err := j.Compact(ctx); err != nil {
						fail(err)
						return
					}
				}
			}()
			wg.Wait()
			close(stopped)
			<-bg
			errMu.Lock()
			require.Empty(t, errs)
			errMu.Unlock()
			require.NoError(t, reviewCheckIndex(j))
			want, wantLive := reviewUnexpired(j)
			require.NoError(t, j.Close())

			j, _ = mustOpen(t, dir, o)
			defer j.Close()
			require.NoError(t, reviewCheckIndex(j))
			got, gotLive := reviewUnexpired(j)
			require.Equal(t, want, got, "the records read back differ from those the journal held")
			require.Equal(t, wantLive, gotLive, "live bytes after replay differ")
		})
	}
}

// TestReviewSizeIsEncodedSize: rec.size, by which Reserve, the in-place
// Update, Forget and replay keep the live bytes that compaction is judged
// by, is documented as the record's encoded size: the length appendOp
// writes for its upsert. (Outside the series: size counts one byte more
// than is written, since 9a7365d.)
func TestReviewSizeIsEncodedSize(t *testing.T) {
	for _, r := range []rec{
		{id: "a", created: 1_700_000_000_000, seen: 5, attempts: 1, status: 200},
		{id: strings.Repeat("x", 200), custom: "custom-key", created: -1, seen: 1 << 40, attempts: 20000, status: 65535},
		{id: "b", state: journal.StateDone},
	} {
		require.Equal(t, int64(len(appendOp(nil, &op{kind: opUpsert, r: r}))), r.size(), "size of %+v", r)
	}
}
