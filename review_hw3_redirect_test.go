package idemretry_test

// hW3's review of the 307/308 hop of an unnamed payment (hW1's fix):
// what hopUnfinished takes for an unfinished hop.

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// hopFlakyJournal fails the update of a 307/308 hop's done while failHop
// is set: the journal (a database whose connection was cut, a full disk)
// did not take it, and the Transport keeps the outcome in memory.
type hopFlakyJournal struct {
	*journal.Memory
	failHop atomic.Bool
}

func (j *hopFlakyJournal) Update(ctx context.Context, rec journal.Record) error {
	if j.failHop.Load() && rec.State == journal.StateDone && strings.Contains(rec.ActionID, " redirect:") {
		return errDiskGone
	}
	return j.Memory.Update(ctx, rec)
}

// Guarantee 2: once the hop has its final answer, an identical request is
// a deliberate repeat: a new payment. The hop's done did not reach the
// journal at once (the Transport holds it, to write before the hop is sent
// again); the journal then heals. The repeat must be a new payment, not a
// tap of a hop the journal still lists as pending, answered with the first
// payment's replay and charged nothing.
func TestHW3RepeatAfterAHopWhoseDoneIsUnlandedIsANewPayment(t *testing.T) {
	srv := redirectingPayServer(t, http.StatusTemporaryRedirect, 0)
	j := &hopFlakyJournal{Memory: journal.NewMemory()}
	tr := transportOver(t, j)
	client := &http.Client{Transport: tr}

	j.failHop.Store(true)
	resp, err := client.Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":5}`))
	require.NoError(t, err)
	readAll(t, resp)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, 1, srv.chargeCount())

	j.failHop.Store(false) // the journal heals
	resp, err = client.Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":5}`))
	require.NoError(t, err)
	readAll(t, resp)
	assert.False(t, idemretry.IsReplay(resp), "the deliberate repeat was answered with the first payment's replay")
	assert.Equal(t, 2, srv.chargeCount(), "a deliberate repeat after the first payment finished was not charged: keys %v", keysOf(srv.seen()))
}
