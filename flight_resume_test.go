package idemretry_test

// Flights meeting Resume's hold of an action (holdFlight, unhold): the
// callers it refuses, and the flight that goes on from a landed one.

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

type forgettingReentrant struct {
	tr   *idemretry.Transport
	url  string
	body string
	err  error
}

func (p *forgettingReentrant) Rebuild(context.Context, journal.Record) (*http.Request, error) {
	return nil, errors.New("not used")
}

func (p *forgettingReentrant) Resolve(ctx context.Context, rec journal.Record) (bool, error) {
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(idemretry.WithAction(rctx, rec.ActionID), http.MethodPost, p.url, stringsReader(p.body))
	p.err = sendErr(p.tr, req)
	return true, nil // reconciled: forget it
}

// A request refused at once because Resume holds its action's flight
// (Resolve sends it) leaves nothing counted in a flight: no flight of the
// action stays in the air after Resume, and later requests of it are not
// taken for joiners of an earlier one. Found in the review of the flight
// that goes on from a landed one (the refused request stayed counted).
func TestFlightRefusedByResumesHoldLeavesNothingInTheAir(t *testing.T) {
	const window = time.Second
	const body = `{"order":"A"}`
	srv := newPayServer(t)
	mem := journal.NewMemory()
	pendingPayA(t, srv, mem, body)
	tr := transportOver(t, mem, idemretry.WithKeyWindow(window), idemretry.WithSettleTime(0), idemretry.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	time.Sleep(window + 300*time.Millisecond)
	require.ErrorIs(t, sendErr(tr, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body)), idemretry.ErrKeyWindowExpired)

	app := &forgettingReentrant{tr: tr, url: srv.URL, body: body}
	res, err := tr.Resume(ctx, app, 1)
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.ErrorIs(t, app.err, idemretry.ErrOutcomeUnknown)
	require.True(t, res[0].Forgotten, "%v", res[0].Err)

	assert.Equal(t, 0, idemretry.FlightJoiners(tr), "callers counted in flights in the air after Resume returned")

	// The action is forgotten: the journal holds no record of pay:A, and
	// nothing of it is in flight. An invalid key is then MaybeProcessed false.
	req := post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body)
	req.Header.Set("Idempotency-Key", "")
	req.Header["Idempotency-Key"] = []string{"a", "b"}
	err = sendErr(tr, req)
	require.ErrorIs(t, err, idemretry.ErrInvalidKey)
	var ae *idemretry.ActionError
	require.ErrorAs(t, err, &ae)
	assert.False(t, ae.MaybeProcessed, "invalidKeyOf finds a flight of pay:A in the air (the stale placeholder)")

	// Each later flight of pay:A counts the phantom joiner and puts a new
	// placeholder in the air when it lands.
	for i := 0; i < 3; i++ {
		resp := roundTrip(t, tr, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body))
		readAll(t, resp)
	}
	assert.Equal(t, 0, idemretry.FlightJoiners(tr), "after 3 more requests of pay:A")
}

type slowResolver struct{ d time.Duration }

func (slowResolver) Rebuild(context.Context, journal.Record) (*http.Request, error) {
	return nil, errors.New("not used")
}
func (s slowResolver) Resolve(context.Context, journal.Record) (bool, error) {
	time.Sleep(s.d)
	return false, nil
}

// A joiner of a flight whose leader stopped before it reserved goes again
// in the flight that goes on from it; Resume, resolving the action, waits
// for that one to land rather than hold it, and a caller that meets
// Resume's hold is refused at once, not kept waiting for the whole Resolve.
// Found in the review of the flight that goes on from a landed one.
func TestFlightJoinerGoingAgainIsRefusedByResumesHoldAtOnce(t *testing.T) {
	const window = time.Second
	const body = `{"order":"A"}`
	const resolve = 1500 * time.Millisecond
	srv := newPayServer(t)
	j := newStallingReserve(false)
	pendingPayA(t, srv, j, body)
	tr := transportOver(t, j, idemretry.WithKeyWindow(window), idemretry.WithSettleTime(0), idemretry.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	time.Sleep(window + 300*time.Millisecond)
	require.ErrorIs(t, sendErr(tr, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body)), idemretry.ErrKeyWindowExpired)

	j.arm()
	lctx, lcancel := context.WithCancel(ctx)
	lerr := sendAsync(tr, post(t, idemretry.WithAction(lctx, "pay:A"), srv.URL, body))
	<-j.entered // the leader stalls in its Reserve
	type timed struct {
		err  error
		took time.Duration
	}
	jout := make(chan timed, 1)
	go func() {
		jerr := sendAsync(tr, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body))
		<-jerr
	}()
	awaitJoiners(t, tr, 1)
	done := resumeAsync(ctx, tr, slowResolver{resolve}, 1)
	time.Sleep(300 * time.Millisecond) // Resume waits in holdFlight for the flight to land
	// the joiner's timing: a second joiner started now, to time it from the landing
	go func() {}()
	start := time.Now()
	jerr2 := sendAsync(tr, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body))
	awaitJoiners(t, tr, 2)
	lcancel()
	go func() { err := <-jerr2; jout <- timed{err, time.Since(start)} }()
	<-lerr
	got := <-jout
	<-done
	t.Logf("joiner: %v after %v", got.err, got.took)
	assert.Less(t, got.took, resolve, "a joiner waited for Resume's Resolve (%v)", got.took)
}
