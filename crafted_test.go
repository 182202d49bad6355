package idemretry_test

// A journal that returns what its storage holds, unchecked (one of
// someone else's): the Transport never sends a record that
// journal.CheckRecord refuses (issue 26, item 14).

import (
	"context"
	"errors"
	"math"
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
