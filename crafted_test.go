package idemretry_test

// A journal that returns what its storage holds, unchecked (one of
// someone else's): the Transport never sends a record that
// journal.CheckRecord refuses (issue 26, item 14).

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// craftingJournal is a Memory whose Reserve returns the record it holds
// changed by craft, as a journal that does not check what it reads back
// returns a damaged one.
type craftingJournal struct {
	*journal.Memory
	craft func(*journal.Record)
}

func (j craftingJournal) Reserve(ctx context.Context, rec journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	got, created, err := j.Memory.Reserve(ctx, rec, mode)
	if err == nil {
		j.craft(&got)
	}
	return got, created, err
}

// attemptsOverMax is one over journal.MaxAttempts, a variable so that the
// test compiles where an int is 32 bits (it converts to a negative int
// there: no int is over journal.MaxAttempts).
var attemptsOverMax int64 = journal.MaxAttempts + 1

// A record with an empty key went out with no Idempotency-Key at all, one
// with "a b" as it is; one whose attempts or creation time are out of
// bounds could never be recorded, or judged. Each is refused with
// journal.ErrCorruptRecord, nothing sent, as the journal created it or as
// it returned it again.
func TestTransportSendsNoUncheckedRecord(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		craft func(*journal.Record)
	}{
		{"empty key", func(r *journal.Record) { r.Key = "" }},
		{"key with a space", func(r *journal.Record) { r.Key = "a b" }},
		{"negative attempts", func(r *journal.Record) { r.Attempts = -1 }},
		{"attempts past the bound", func(r *journal.Record) { r.Attempts = int(attemptsOverMax) }},
		{"negative status", func(r *journal.Record) { r.Status = -1 }},
		{"state zero", func(r *journal.Record) { r.State = 0 }},
		{"creation time MinInt64 ms", func(r *journal.Record) { r.CreatedAt = time.UnixMilli(math.MinInt64) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newPayServer(t)
			tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(craftingJournal{journal.NewMemory(), tc.craft}))
			require.NoError(t, err)
			defer tr.Close()
			for _, try := range []string{"first", "again"} {
				resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:crafted"), srv.URL, `{"amount":1}`))
				if resp != nil {
					resp.Body.Close()
				}
				t.Logf("%s: %v", try, err)
				require.ErrorIs(t, err, journal.ErrCorruptRecord, "%s request: status %v", try, resp)
				require.False(t, errors.Is(err, journal.ErrInvalidRecord), "the caller gave nothing invalid")
			}
			require.Empty(t, srv.seen(), "a request was sent with the crafted record")
		})
	}
}

// listCraftingJournal is a Memory whose Get, and Unfinished unless
// getOnly, return the records it holds changed by craft, as a journal
// that does not check what it reads back lists a damaged one, or reads
// one back damaged.
type listCraftingJournal struct {
	*journal.Memory
	craft   func(*journal.Record)
	getOnly bool
}

func (j listCraftingJournal) Unfinished(ctx context.Context) ([]journal.Record, error) {
	recs, err := j.Memory.Unfinished(ctx)
	for i := range recs {
		if !j.getOnly {
			j.craft(&recs[i])
		}
	}
	return recs, err
}

func (j listCraftingJournal) Get(ctx context.Context, id string) (journal.Record, bool, error) {
	rec, found, err := j.Memory.Get(ctx, id)
	if found {
		j.craft(&rec)
	}
	return rec, found, err
}

// resolveCounter rebuilds every action as a payment to url and counts the
// records it is asked to resolve; it says each may be forgotten (the
// provider knows no charge under rec.Key: the app pays again).
type resolveCounter struct {
	url      string
	mu       sync.Mutex
	resolved []journal.Record
}

func (r *resolveCounter) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	return http.NewRequestWithContext(ctx, http.MethodPost, r.url, strings.NewReader(`{"amount":1}`))
}

func (r *resolveCounter) Resolve(_ context.Context, rec journal.Record) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resolved = append(r.resolved, rec)
	return true, nil
}

// Resume never hands Resolve a listed record that journal.CheckRecord
// refuses, nor forgets its action: Resolve asks the provider about
// rec.Key, and a damaged key ("", "a b") is one the provider knows no
// charge under, so the app would pay again an action charged under its
// real key. Nor does it rebuild and send a pending one. Each is left as it
// is, its result's Err journal.ErrCorruptRecord; so is an outcome-unknown
// one whose record, read again before Resolve, is damaged. Before: Resolve
// was asked about key "" and the action forgotten; the pending one was
// refused as journal.ErrInvalidRecord, as if the app had passed it.
func TestResumeResolvesNoUncheckedRecord(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		craft   func(*journal.Record)
		getOnly bool
	}{
		{"empty key", func(r *journal.Record) { r.Key = "" }, false},
		{"key with a space", func(r *journal.Record) { r.Key = "a b" }, false},
		{"negative attempts", func(r *journal.Record) { r.Attempts = -1 }, false},
		{"negative attempts when read again", func(r *journal.Record) { r.Attempts = -1 }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newPayServer(t)
			clk := newFakeClock()
			mem := journal.NewMemory()
			ctx := context.Background()
			// An outcome-unknown action whose key window and settle time
			// have passed: Resolve's to reconcile.
			unknown := journal.Record{ActionID: "pay:unknown", Key: "k-unknown", CreatedAt: clk.Now().Add(-48 * time.Hour), State: journal.StatePending}
			_, _, err := mem.Reserve(ctx, unknown, journal.ReuseAny)
			require.NoError(t, err)
			unknown.State = journal.StateUnknown
			require.NoError(t, mem.Update(ctx, unknown))
			want := 1
			if !tc.getOnly {
				// A pending one, to resend: charged, its answer lost.
				srv.commitThenDrop[1] = true
				leftPending(t, mem, post(t, idemretry.WithAction(ctx, "pay:pending"), srv.URL, `{"amount":1}`))
				want = 2
			}

			tr := transportOver(t, listCraftingJournal{mem, tc.craft, tc.getOnly}, idemretry.WithClock(clk))
			app := &resolveCounter{url: srv.URL}
			res, err := tr.Resume(ctx, app, 0)
			require.NoError(t, err)
			require.Len(t, res, want)
			for _, r := range res {
				t.Logf("%s: forgotten %v, sent %v, %v", r.Record.ActionID, r.Forgotten, r.Sent, r.Err)
			}
			require.Empty(t, app.resolved, "Resolve was asked about a damaged record")
			require.Len(t, srv.seen(), want-1, "a request was sent again")
			for _, r := range res {
				require.ErrorIs(t, r.Err, journal.ErrCorruptRecord, "%s", r.Record.ActionID)
				require.False(t, r.Forgotten, "%s", r.Record.ActionID)
			}
			left, err := mem.Unfinished(ctx)
			require.NoError(t, err)
			require.Len(t, left, want, "every action is kept, for a person to see")
		})
	}
}

// A record at the bound of its attempts (journal.MaxAttempts, which every
// journal stores and the conformance suite checks) still takes its
// outcome: a resend answered 503 then 201 is recorded done, its attempts
// staying at the bound, and the next request of the action gets the
// server's replay. Where an int is 32 bits the count wrapped around to
// -2147483647: Update refused the outcome, kept in memory, and every later
// request of the action was refused ("its last outcome (done, status 201)
// is not yet in the journal") until the process ended.
func TestAttemptsAtTheBoundTakeTheirOutcome(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.commitThenDrop[1] = true // charged, its answer lost
	srv.script = func(n int, w http.ResponseWriter, _ *http.Request) bool {
		if n == 2 {
			status(http.StatusServiceUnavailable)(w)
			return true
		}
		return false
	}
	mem := journal.NewMemory()
	ctx := idemretry.WithAction(context.Background(), "pay:bound")
	const body = `{"amount":1}`
	leftPending(t, mem, post(t, ctx, srv.URL, body))
	rec, found, err := mem.Get(ctx, "pay:bound")
	require.NoError(t, err)
	require.True(t, found)
	rec.Attempts = journal.MaxAttempts
	require.NoError(t, mem.Update(ctx, rec))

	tr := transportOver(t, mem, idemretry.WithBackOff(constant(time.Millisecond)))
	resp := roundTrip(t, tr, post(t, ctx, srv.URL, body))
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	got, _, err := mem.Get(ctx, "pay:bound")
	require.NoError(t, err)
	require.Equal(t, journal.StateDone, got.State, "the outcome is recorded")
	require.Equal(t, journal.MaxAttempts, got.Attempts, "attempts stay at the bound")
	resp = roundTrip(t, tr, post(t, ctx, srv.URL, body))
	require.True(t, idemretry.IsReplay(resp), "the next request of the action is answered by the server")
	require.Equal(t, 1, srv.chargeCount())
}
