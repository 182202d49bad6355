package filejournal_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/filejournal"
	"github.com/idemretry/idemretry/journal"
)

// The default journal's fdatasync hangs (a disk that stopped answering)
// while the caller's context never ends (context.Background, as most apps
// send): the journal calls on the request path then share the journal
// timeout's timer (idemretry's journaltimeout.go), and these tests check
// that the shared bound cuts the file journal's waits, over loopback HTTP.

const hungJournalTimeout = 400 * time.Millisecond

// hungSyncRig is a Transport over a file journal whose syncs hang while
// hanging is set, and a server that counts the requests it got and keeps
// their keys.
type hungSyncRig struct {
	t       *testing.T
	srv     *httptest.Server
	tr      *idemretry.Transport
	j       *filejournal.Journal
	hanging atomic.Bool
	// hangOnRequest sets hanging when the server gets a request.
	hangOnRequest atomic.Bool
	hung          atomic.Int32 // syncs that waited for release
	release       chan struct{}
	once          sync.Once
	mu            sync.Mutex
	keys          []string
}

func newHungSyncRig(t *testing.T) *hungSyncRig {
	r := &hungSyncRig{t: t, release: make(chan struct{})}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		if r.hangOnRequest.Load() {
			r.hanging.Store(true)
		}
		r.mu.Lock()
		r.keys = append(r.keys, req.Header.Get(idemretry.DefaultKeyHeader))
		r.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(r.srv.Close)
	j, err := filejournal.Open(t.TempDir(), filejournal.WithSyncGate(func() bool {
		if r.hanging.Load() {
			r.hung.Add(1)
			return true
		}
		return false
	}, r.release))
	require.NoError(t, err)
	r.j = j
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	r.tr, err = idemretry.NewTransport(base, idemretry.WithJournal(j), idemretry.WithJournalTimeout(hungJournalTimeout))
	require.NoError(t, err)
	t.Cleanup(func() {
		r.unhang()
		assert.NoError(t, r.tr.Close())
		assert.NoError(t, r.j.Close())
	})
	return r
}

// unhang lets every hung sync, and every later one, go on.
func (r *hungSyncRig) unhang() {
	r.hanging.Store(false)
	r.once.Do(func() { close(r.release) })
}

func (r *hungSyncRig) sent() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.keys...)
}

// post sends a 1 KiB POST under context.Background (named when id is not
// empty) and returns the answer's status (0 on error), how long it took and the
// error.
func (r *hungSyncRig) post(id string) (int, time.Duration, error) {
	ctx := context.Background()
	if id != "" {
		ctx = idemretry.WithAction(ctx, id)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.srv.URL+"/pay", bytes.NewReader([]byte(strings.Repeat("p", 1024))))
	require.NoError(r.t, err)
	start := time.Now()
	resp, err := (&http.Client{Transport: r.tr}).Do(req)
	took := time.Since(start)
	if err != nil {
		return 0, took, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(r.t, resp.Body.Close())
	return resp.StatusCode, took, nil
}

// A reservation whose sync hangs: RoundTrip gives up by the journal timeout
// with journal.ErrUnavailable and sends nothing, named or not; once the disk
// answers again, the same request is sent once, under the key reserved then.
func TestHungSyncReserveCutByTheJournalTimeout(t *testing.T) {
	for _, id := range []string{"", "pay:hung-reserve"} {
		name := "unnamed"
		if id != "" {
			name = "named"
		}
		t.Run(name, func(t *testing.T) {
			r := newHungSyncRig(t)
			r.hanging.Store(true)
			status, took, err := r.post(id)
			require.Error(t, err, "status %d", status)
			assert.ErrorIs(t, err, journal.ErrUnavailable)
			assert.GreaterOrEqual(t, took, hungJournalTimeout*9/10, "the shared bound may end up to 1 %% early, no more")
			assert.Less(t, took, hungJournalTimeout+2*time.Second, "a hung sync held RoundTrip past the journal timeout")
			assert.Positive(t, r.hung.Load(), "the reservation's sync never hung: the test tested nothing")
			assert.Empty(t, r.sent(), "a request was sent before its key was durable")

			r.unhang()
			status, _, err = r.post(id)
			require.NoError(t, err)
			assert.Equal(t, http.StatusCreated, status)
			keys := r.sent()
			require.Len(t, keys, 1)
			assert.NotEmpty(t, keys[0])
			// The retry is the same action: it was sent under the key
			// reserved by the call that gave up, not a new one.
			if id != "" {
				rec, found, err := r.j.Get(context.Background(), id)
				require.NoError(t, err)
				require.True(t, found)
				assert.Equal(t, keys[0], rec.Key)
				assert.Equal(t, journal.StateDone, rec.State)
			}
		})
	}
}

// An unnamed action's "done" is synced before RoundTrip returns (README, "The
// key journal"). When that sync hangs, the answer is still returned, by the
// journal timeout, and the one request the server got is not sent again.
func TestHungSyncOfAnUnnamedDoneCutByTheJournalTimeout(t *testing.T) {
	r := newHungSyncRig(t)
	r.hangOnRequest.Store(true) // the reservation is synced: hang the syncs after it
	status, took, err := r.post("")
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, status)
	assert.GreaterOrEqual(t, took, hungJournalTimeout*9/10, "the done's sync did not hold RoundTrip: was it synced?")
	assert.Less(t, took, hungJournalTimeout+2*time.Second, "a hung sync held the answer past the journal timeout")
	assert.Positive(t, r.hung.Load(), "the done's sync never hung: the test tested nothing")
	assert.Len(t, r.sent(), 1)
}
