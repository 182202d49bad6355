package idemretry_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/idemretry/idemretry/journal"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/filejournal"
)

// Issue 7, item 14: the journal directory deleted under a running process.
// The next new action is refused before anything is sent (its key could not
// be kept), Close reports it, and after a restart the action goes out once,
// under one key.
func TestJournalDirectoryRemovedUnderTransport(t *testing.T) {
	srv := newPayServer(t)
	dir := filepath.Join(t.TempDir(), "journal")
	tr, err := idemretry.NewTransport(&http.Transport{}, idemretry.WithJournalDir(dir))
	require.NoError(t, err)
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:1"), srv.URL, "a"))
	require.NoError(t, err)
	readAll(t, resp)

	require.NoError(t, os.RemoveAll(dir))
	ctx := idemretry.WithAction(context.Background(), "pay:2")
	resp, err = tr.RoundTrip(post(t, ctx, srv.URL, "b"))
	if err == nil {
		readAll(t, resp)
	}
	require.Error(t, err, "a new action was sent with a key kept in a deleted journal")
	assert.True(t, errors.Is(err, filejournal.ErrRemoved), "%v", err)
	assert.True(t, errors.Is(err, journal.ErrClosed), "%v", err)
	assert.Len(t, srv.seen(), 1, "nothing sent")
	err = tr.Close()
	assert.True(t, errors.Is(err, filejournal.ErrRemoved), "Close: %v", err)

	tr, err = idemretry.NewTransport(&http.Transport{}, idemretry.WithJournalDir(dir))
	require.NoError(t, err)
	defer tr.Close()
	resp, err = tr.RoundTrip(post(t, ctx, srv.URL, "b"))
	require.NoError(t, err)
	readAll(t, resp)
	reqs := srv.seen()
	require.Len(t, reqs, 2)
	assert.Equal(t, 2, srv.chargeCount())
}
