package idemretry_test

// The release of a lease at the end of a RoundTrip, and who waits for it
// (found by the review of 5a75ef1, which cut the release at OutcomeGrace).

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// slowReleaseLeaser is a Leaser over Memory that keeps one lease per
// action as a database would (holder and end), and whose Release takes
// slow to complete (a database under load); a Release whose context ends
// first does not happen, as a cancelled query does not.
type slowReleaseLeaser struct {
	*journal.Memory
	slow time.Duration

	mu       sync.Mutex
	holder   map[string]string
	until    map[string]time.Time
	released atomic.Int32
	cut      atomic.Int32
}

func (j *slowReleaseLeaser) Lease(ctx context.Context, id, holder string, ttl time.Duration) (bool, time.Time, error) {
	if err := ctx.Err(); err != nil {
		return false, time.Time{}, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	now := time.Now()
	if h, ok := j.holder[id]; ok && h != holder && now.Before(j.until[id]) {
		return false, j.until[id], nil
	}
	j.holder[id], j.until[id] = holder, now.Add(ttl)
	return true, j.until[id], nil
}

func (j *slowReleaseLeaser) Release(ctx context.Context, id, holder string) error {
	select {
	case <-time.After(j.slow):
	case <-ctx.Done():
		j.cut.Add(1)
		return ctx.Err()
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.holder[id] == holder {
		delete(j.holder, id)
		delete(j.until, id)
	}
	j.released.Add(1)
	return nil
}

// A leader cancelled while its attempt is on the wire: a joiner (this
// Transport, context fine) carries the action on. The leader's Release
// takes 400 ms, past OutcomeGrace but within the release's own second: it
// completes, so the joiner is not left waiting for its own Transport's
// lease to end (the TTL, 30 s by default) as if another machine held it.
//
// Found in the second review of leases (5062b32; was TestReviewJoinerWaitsForItsOwnTransportsReleaseCutByOutcomeGrace).
func TestLeaseJoinerWaitsForItsOwnTransportsReleaseCutByOutcomeGrace(t *testing.T) {
	joinerCarriesOn(t, 400*time.Millisecond)
}

// The same when the leader's Release never completes (its second runs out:
// a database that is down): the lease stays held in the journal, by the
// leader's holder, for its TTL (30 s). The joiner, in the same Transport,
// re-enters it instead of waiting for it as for another machine's (issue
// 26, item 13).
func TestLeaseJoinerReentersALeaseWhoseReleaseFailed(t *testing.T) {
	joinerCarriesOn(t, time.Hour)
}

// joinerCarriesOn: a leader cancelled while its attempt is on the wire,
// whose Release takes slow, and a joiner of its flight that carries the
// action on (see TestLeaseJoinerWaitsForItsOwnTransportsReleaseCutByOutcomeGrace).
func joinerCarriesOn(t *testing.T, slow time.Duration) {
	srv := newSlowPayServer(t, 2*time.Second)
	j := &slowReleaseLeaser{Memory: journal.NewMemory(), slow: slow,
		holder: map[string]string{}, until: map[string]time.Time{}}
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(j))
	require.NoError(t, err)
	defer tr.Close()
	lctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leader := sendAsync(tr, post(t, idemretry.WithAction(lctx, "pay:r3-own"), srv.URL, `{"amount":1}`))
	<-srv.arrived // the leader's attempt is on the wire
	// Time for the joiner's retries of the 409 the server answers while the
	// leader's charge runs (2 s), on a loaded machine; well short of the
	// lease's TTL (30 s), which the joiner would wait for with the bug.
	jctx, jcancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer jcancel()
	var jresp *http.Response
	joiner := make(chan error, 1)
	go func() {
		resp, err := tr.RoundTrip(post(t, idemretry.WithAction(jctx, "pay:r3-own"), srv.URL, `{"amount":1}`))
		jresp = resp
		if resp != nil {
			resp.Body.Close()
		}
		joiner <- err
	}()
	time.Sleep(200 * time.Millisecond) // the joiner joins the flight
	cancel()
	require.ErrorIs(t, <-leader, context.Canceled)
	var jerr error
	select {
	case jerr = <-joiner:
	case <-time.After(25 * time.Second):
		t.Fatal("joiner still running 25 s on")
	}
	t.Logf("releases completed %d, cut %d", j.released.Load(), j.cut.Load())
	require.NoError(t, jerr, "the joiner, whose context is fine, waited for the lease of its own Transport's finished RoundTrip")
	require.Equal(t, http.StatusCreated, jresp.StatusCode)
}

// The release is still bounded while the caller's context is fine (no
// deadline, a far one, or a far one without Done): the journal timeout and
// 1 s, not the caller's deadline. It runs after RoundTrip has returned,
// and Close waits for it.
//
// Found in the second review of leases (5062b32; was TestReviewReleaseBoundedWhileTheCallerIsFine).
func TestLeaseReleaseBoundedWhileTheCallerIsFine(t *testing.T) {
	for _, tc := range healthyContexts(time.Hour) {
		t.Run(tc.name, func(t *testing.T) {
			srv := newPayServer(t)
			j := &hangingRelease{Memory: journal.NewMemory()}
			tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(j))
			require.NoError(t, err)
			defer tr.Close()
			ctx, cancel := tc.ctx()
			defer cancel()
			start := time.Now()
			resp, err := tr.RoundTrip(post(t, idemretry.WithAction(ctx, "pay:r3-bounded"), srv.URL, `{"amount":1}`))
			took := time.Since(start)
			require.NoError(t, err)
			resp.Body.Close()
			require.Zero(t, j.ended.Load(), "RoundTrip returned (after %v) once the release had ended", took)
			closeStart := time.Now()
			require.NoError(t, tr.Close())
			closed := time.Since(closeStart)
			require.Equal(t, int32(1), j.releases.Load())
			require.Equal(t, int32(1), j.ended.Load(), "Close returned before the release under way ended")
			require.Less(t, closed, 4*time.Second, "the release outlived its second")
		})
	}
}
