package filejournal_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/filejournal"
	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The file journal under a real idemretry Transport over loopback HTTP: a
// sync that hangs, a disk that fills.

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

// lockedBuffer is a bytes.Buffer safe for concurrent use: a logger's
// output.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// fullDiskRig is a Transport that owns a file journal on a 1 MiB tmpfs,
// and a payment server that keeps the key and body of every request it
// gets and answers 201; with hold set, it holds the next request until
// release, for the test to fill the disk meanwhile.
type fullDiskRig struct {
	t    *testing.T
	mnt  string
	dir  string
	srv  *httptest.Server
	tr   *idemretry.Transport
	logs *lockedBuffer

	mu      sync.Mutex
	keys    map[string]string // body -> key
	sent    map[string]int    // body -> requests
	hold    bool
	arrived chan struct{}
	release chan struct{}
}

func newFullDiskRig(t *testing.T) *fullDiskRig {
	r := &fullDiskRig{t: t, keys: map[string]string{}, sent: map[string]int{}, logs: &lockedBuffer{}}
	r.mnt = filejournal.SmallFSOf(t, "1m")
	r.dir = filepath.Join(r.mnt, "journal")
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.keys[string(body)] = req.Header.Get(idemretry.DefaultKeyHeader)
		r.sent[string(body)]++
		hold, arrived, release := r.hold, r.arrived, r.release
		r.hold = false
		r.mu.Unlock()
		if hold {
			close(arrived)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"id":"ch_%s"}`, body)
	}))
	t.Cleanup(r.srv.Close)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	var err error
	r.tr, err = idemretry.NewTransport(base, idemretry.WithJournalDir(r.dir),
		idemretry.WithLogger(slog.New(slog.NewTextHandler(r.logs, nil))))
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.tr.Close() }) // before the unmount, on a failure
	return r
}

// pay POSTs body (as the action id too, when named) and returns the
// answer's status, or the error.
func (r *fullDiskRig) pay(body string, named bool) (int, error) {
	ctx := context.Background()
	if named {
		ctx = idemretry.WithAction(ctx, "pay:"+body)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.srv.URL+"/charges", strings.NewReader(body))
	require.NoError(r.t, err)
	resp, err := (&http.Client{Transport: r.tr}).Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// payWhileTheDiskFills sends body (unnamed) and, while the server holds
// it, fills the disk: the file system first, then what the journal's last
// page still takes, by reserving actions never sent ("filler-N") through
// the journal until one is refused; then it queues updates of eight
// actions reserved before (never sent either), so that the next batch is
// larger than the one refused, and refused too, whatever room that page
// has left. It returns the answer's status and the actions reserved.
func (r *fullDiskRig) payWhileTheDiskFills(body string) (int, []string) {
	r.mu.Lock()
	r.hold, r.arrived, r.release = true, make(chan struct{}), make(chan struct{})
	arrived, release := r.arrived, r.release
	r.mu.Unlock()
	type answer struct {
		status int
		err    error
	}
	done := make(chan answer, 1)
	go func() {
		status, err := r.pay(body, false)
		done <- answer{status, err}
	}()
	<-arrived
	ctx := context.Background()
	j := r.tr.Journal()
	var spares []journal.Record
	for i := range 8 {
		rec := journal.Record{ActionID: fmt.Sprintf("spare-%d", i), Key: uuid.NewString(), CreatedAt: time.Now(), State: journal.StatePending}
		_, _, err := j.Reserve(ctx, rec, journal.ReuseAny)
		require.NoError(r.t, err)
		spares = append(spares, rec)
	}
	filejournal.Fill(r.t, r.mnt)
	var ids []string
	for i := 0; ; i++ {
		rec := journal.Record{ActionID: fmt.Sprintf("filler-%d", i), Key: uuid.NewString(),
			CreatedAt: time.Now(), State: journal.StatePending}
		if _, _, err := j.Reserve(ctx, rec, journal.ReuseAny); err != nil {
			require.ErrorIs(r.t, err, syscall.ENOSPC)
			break
		}
		ids = append(ids, rec.ActionID)
		require.Less(r.t, i, 1000, "the journal never filled the disk")
	}
	for _, rec := range spares {
		rec.Attempts = 1
		require.NoError(r.t, j.Update(ctx, rec))
		ids = append(ids, rec.ActionID)
	}
	close(release)
	a := <-done
	require.NoError(r.t, a.err)
	return a.status, ids
}

func (r *fullDiskRig) requests(body string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sent[body]
}

// Issue 30, item 4, through a Transport over loopback HTTP on a real full
// file system: before, every payment was refused from the moment the disk
// filled until a new Transport was built, Close failed, and the lazy done
// of the last payment was lost (listed pending after reopening). Now a
// payment is refused before sending while the disk is full, with
// journal.ErrUnavailable and ENOSPC; the next one after space returns is
// sent; Close succeeds, writing the outcome the Transport kept in memory
// because the journal refused it; and after reopening, every payment the
// server got is done.
func TestTransportRecoversFromAFullDisk(t *testing.T) {
	t.Parallel()
	r := newFullDiskRig(t)
	status, err := r.pay("first", false)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	// The last payment before the disk fills: its done is lazy (named).
	status, err = r.pay("last-before", true)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)

	// The disk fills while a payment named by its fingerprint is at the
	// server: its done, which the Transport syncs, is refused, and kept in
	// memory.
	status, fillers := r.payWhileTheDiskFills("during")
	require.Equal(t, http.StatusCreated, status, "the answer in hand is returned")
	assert.Contains(t, r.logs.String(), "kept in memory", "the done of the payment at the server was not refused: the test tested nothing")

	// While the disk is full: refused, nothing sent.
	for range 2 {
		_, err = r.pay("while-full", true)
		require.Error(t, err)
		assert.ErrorIs(t, err, journal.ErrUnavailable)
		assert.ErrorIs(t, err, syscall.ENOSPC)
		assert.NotErrorIs(t, err, journal.ErrClosed)
	}
	assert.Zero(t, r.requests("while-full"), "sent while its key could not be made durable")

	// Room again: the next payment goes, with no new Transport.
	filejournal.Unfill(t, r.mnt)
	status, err = r.pay("while-full", true)
	require.NoError(t, err, "refused after space returned")
	require.Equal(t, http.StatusCreated, status)
	assert.Equal(t, 1, r.requests("while-full"))
	status, err = r.pay("after", false)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	for _, id := range fillers {
		require.NoError(t, r.tr.Journal().Forget(context.Background(), id))
	}
	require.NoError(t, r.tr.Close())

	j, err := filejournal.Open(r.dir)
	require.NoError(t, err)
	defer j.Close()
	unfinished, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	assert.Empty(t, unfinished, "listed pending after reopening")
	recs := j.AllRecords()
	for _, body := range []string{"first", "last-before", "during", "while-full", "after"} {
		r.mu.Lock()
		key := r.keys[body]
		r.mu.Unlock()
		rec, ok := recs[key]
		if assert.True(t, ok, "%s: no record of the key the server got", body) {
			assert.Equal(t, journal.StateDone, rec.State, body)
			assert.Equal(t, http.StatusCreated, rec.Status, body)
		}
		assert.Equal(t, 1, r.requests(body), body)
	}
}
