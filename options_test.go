package idemretry_test

// Options that say what they do: where the journal is, and which methods
// carry a key (issue 30, item 3).

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// stateHome points the default journal directory (filejournal.DefaultDir)
// at a fresh directory, and returns it.
func stateHome(t *testing.T) string {
	t.Helper()
	home := t.TempDir()
	t.Setenv("XDG_STATE_HOME", home)
	t.Setenv("HOME", home)
	t.Setenv("LocalAppData", home)
	return home
}

// requireEmptyDir requires that dir holds nothing: no journal was made there.
func requireEmptyDir(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, entries, "nothing made in %s", dir)
}

// WithJournalDir("") (an environment variable left empty, say) and
// WithJournal(nil) are refused: they used to open the default journal in
// the home directory.
func TestJournalOptionEmptyRefused(t *testing.T) {
	var nilMemory *journal.Memory
	for name, o := range map[string]idemretry.Option{
		`WithJournalDir("")`:       idemretry.WithJournalDir(""),
		"WithJournal(nil)":         idemretry.WithJournal(nil),
		"WithJournal(nil *Memory)": idemretry.WithJournal(nilMemory),
		`WithJournalDir(" ")`:      idemretry.WithJournalDir(" "),
	} {
		t.Run(name, func(t *testing.T) {
			home := stateHome(t)
			t.Chdir(home)
			tr, err := idemretry.NewTransport(nil, o)
			if err == nil {
				tr.Close()
			}
			requireEmptyDir(t, home)
			require.ErrorIs(t, err, idemretry.ErrInvalidOption)
			wantPrefixOnce(t, err)
		})
	}
}

// A relative journal directory is refused, as mobile's NewClient refuses
// it: the keys of unfinished payments must not depend on the directory a
// process happens to be started in.
func TestJournalDirRelativeRefused(t *testing.T) {
	cwd := t.TempDir()
	t.Chdir(cwd)
	for _, dir := range []string{"state", "./state", filepath.Join("..", filepath.Base(cwd), "state")} {
		_, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir))
		require.ErrorIs(t, err, idemretry.ErrInvalidOption, dir)
		assert.Contains(t, err.Error(), "absolute", dir)
	}
	requireEmptyDir(t, cwd)
}

// The journal is named once: a second WithJournalDir or WithJournal is
// refused instead of replacing the first in silence.
func TestJournalGivenTwiceRefused(t *testing.T) {
	t.Parallel()
	a, b := t.TempDir(), t.TempDir()
	for name, opts := range map[string][]idemretry.Option{
		"two dirs":        {idemretry.WithJournalDir(a), idemretry.WithJournalDir(b)},
		"one dir twice":   {idemretry.WithJournalDir(a), idemretry.WithJournalDir(a)},
		"two journals":    {inMemory(), inMemory()},
		"journal and dir": {inMemory(), idemretry.WithJournalDir(a)},
	} {
		tr, err := idemretry.NewTransport(nil, opts...)
		if err == nil {
			tr.Close()
		}
		require.ErrorIs(t, err, idemretry.ErrInvalidOption, name)
	}
	requireEmptyDir(t, a)
	requireEmptyDir(t, b)
}

// WithKeyedMethods adds to POST and PATCH: with PUT added, a POST still
// carries a key, and WithRequireAction still guards it. It used to replace
// the list, so that the POST left without a key.
func TestKeyedMethodsAddToPostAndPatch(t *testing.T) {
	srv := newPayServer(t)
	tr, _, _ := newTestTransport(t, idemretry.WithKeyedMethods(http.MethodPut), idemretry.WithRequireAction())

	err := sendErr(tr, post(t, context.Background(), srv.URL, "x"))
	require.ErrorIs(t, err, idemretry.ErrActionRequired, "an unnamed POST is still guarded")
	require.Empty(t, srv.seen(), "nothing sent")

	for _, m := range []string{http.MethodPost, http.MethodPatch, http.MethodPut} {
		req, err := http.NewRequestWithContext(idemretry.WithAction(context.Background(), "order-1:"+m), m, srv.URL, strings.NewReader("x"))
		require.NoError(t, err)
		roundTrip(t, tr, req)
	}
	require.Len(t, srv.seen(), 3)
	for _, s := range srv.seen() {
		assert.NotEmpty(t, s.Key, "%s carries a key", s.Method)
	}
}

// A method name is an upper-case HTTP token: "get" or "Post", which net/http
// would send as methods of their own, are refused, as are names that are
// not tokens. So is a method both keyed and unkeyed.
func TestKeyedMethodsBadNamesRefused(t *testing.T) {
	t.Parallel()
	for name, o := range map[string]idemretry.Option{
		"lower case":        idemretry.WithKeyedMethods("get"),
		"mixed case":        idemretry.WithKeyedMethods("Post"),
		"empty":             idemretry.WithKeyedMethods(""),
		"space":             idemretry.WithKeyedMethods("PO ST"),
		"comma list":        idemretry.WithKeyedMethods("PUT,DELETE"),
		"unkeyed lower":     idemretry.WithUnkeyedMethods("post"),
		"unkeyed not token": idemretry.WithUnkeyedMethods("POST\n"),
	} {
		_, err := idemretry.NewTransport(nil, inMemory(), o)
		require.ErrorIs(t, err, idemretry.ErrInvalidOption, name)
		wantPrefixOnce(t, err)
	}
	_, err := idemretry.NewTransport(nil, inMemory(), idemretry.WithKeyedMethods(http.MethodPut), idemretry.WithUnkeyedMethods(http.MethodPut))
	require.ErrorIs(t, err, idemretry.ErrInvalidOption, "PUT both keyed and unkeyed")
	_, err = idemretry.NewTransport(nil, inMemory(), idemretry.WithUnkeyedMethods(http.MethodPost), idemretry.WithKeyedMethods(http.MethodPost))
	require.ErrorIs(t, err, idemretry.ErrInvalidOption, "POST both unkeyed and keyed")

	tr, err := idemretry.NewTransport(nil, inMemory(), idemretry.WithKeyedMethods(), idemretry.WithKeyedMethods("PURGE", http.MethodDelete))
	require.NoError(t, err, "no method adds nothing; an extension method is a token")
	require.NoError(t, tr.Close())
}

// WithUnkeyedMethods is the one way to send POST or PATCH without a key: it
// is then sent once, never retried, and WithRequireAction does not apply.
func TestUnkeyedMethodsSentOnceWithoutKey(t *testing.T) {
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool { status(503)(w); return true }
	tr, _, _ := newTestTransport(t, idemretry.WithUnkeyedMethods(http.MethodPost), idemretry.WithRequireAction())
	roundTrip(t, tr, post(t, context.Background(), srv.URL, "x"))
	assert.Equal(t, []string{""}, keysOf(srv.seen()), "sent once, without a key")

	req, err := http.NewRequest(http.MethodPatch, srv.URL, strings.NewReader("x"))
	require.NoError(t, err)
	require.ErrorIs(t, sendErr(tr, req), idemretry.ErrActionRequired, "PATCH is still keyed")
	assert.Len(t, srv.seen(), 1)
}

func TestInvalidOptions(t *testing.T) {
	t.Parallel()
	j := inMemory()
	for name, o := range map[string]idemretry.Option{
		"zero window":       idemretry.WithKeyWindow(0),
		"negative cap":      idemretry.WithMaxRetryAfter(-time.Second),
		"empty header":      idemretry.WithKeyHeader(""),
		"header with colon": idemretry.WithKeyHeader("Idempotency:Key"),
		"header with space": idemretry.WithKeyHeader("Idempotency Key"),
		"negative buffer":   idemretry.WithMaxBufferedBody(-1),
		"negative retries":  idemretry.WithMaxRetries(-1),
		"negative share":    idemretry.WithMaxSharedResponse(-1),
		"zero jtimeout":     idemretry.WithJournalTimeout(0),
	} {
		_, err := idemretry.NewTransport(nil, j, o)
		assert.ErrorIs(t, err, idemretry.ErrInvalidOption, name)
	}
	_, err := idemretry.NewTransport(nil, j, idemretry.WithKeyHeader("X-Idempotency-Key"), nil)
	assert.NoError(t, err, "a nil Option is skipped")
	_, err = idemretry.NewTransport(nil, j, idemretry.WithBackOff(nil), idemretry.WithRetryPolicy(nil),
		idemretry.WithClock(nil), idemretry.WithKeyGenerator(nil))
	assert.NoError(t, err, "a nil function restores the default")
}

// A method that carries no key and is not idempotent by definition is sent
// once: retrying it without a key could perform it twice.
func TestUnkeyedUnsafeMethodSentOnce(t *testing.T) {
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool { status(503)(w); return true }
	tr, _, _ := newTestTransport(t, idemretry.WithUnkeyedMethods(http.MethodPost))
	roundTrip(t, tr, post(t, context.Background(), srv.URL, "x"))
	assert.Equal(t, []string{""}, keysOf(srv.seen()))

	req, err := http.NewRequest(http.MethodPut, srv.URL, strings.NewReader("x"))
	require.NoError(t, err)
	roundTrip(t, tr, req)
	assert.Len(t, srv.seen(), 1+idemretry.DefaultMaxRetries+1, "PUT is idempotent: retried")
}

// WithKeyHeader refuses a header HTTP gives a meaning of its own: net/http
// sends Host and Content-Length from the request's fields and never as
// given, a proxy drops the hop-by-hop ones, an Expect the server does not
// know fails the request, and a Content-* header or a credential would be
// replaced by the key (and the request's own value, "application/json"
// say, taken for its key: one key for every payment). Accepted, the key
// never reached the server, or was not the action's.
func TestKeyHeaderWithAMeaningOfItsOwnRefused(t *testing.T) {
	t.Parallel()
	names := []string{"Host", "Content-Length", "Transfer-Encoding", "Trailer", "Connection", "Keep-Alive",
		"Proxy-Connection", "TE", "Upgrade", "Expect", "Content-Type", "content-encoding", "Authorization",
		"Proxy-Authorization", "Cookie"}
	for _, name := range names {
		var mu sync.Mutex
		var got string
		srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			got = r.Header.Get(name)
			mu.Unlock()
			w.WriteHeader(http.StatusCreated)
		})
		j := journal.NewMemory()
		tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(j), idemretry.WithKeyHeader(name))
		if err == nil {
			req := post(t, idemretry.WithAction(context.Background(), "pay:1"), srv.URL, `{"amount":1}`)
			req.Header.Set("Content-Type", "application/json")
			resp, rerr := tr.RoundTrip(req)
			if rerr == nil {
				resp.Body.Close()
			}
			rec, _, _ := j.Get(context.Background(), "pay:1")
			mu.Lock()
			t.Errorf("WithKeyHeader(%q) accepted: the server saw %q under it, the action's key is %q (%v)", name, got, rec.Key, rerr)
			mu.Unlock()
			require.NoError(t, tr.Close())
			continue
		}
		assert.ErrorIs(t, err, idemretry.ErrInvalidOption, name)
		wantPrefixOnce(t, err)
	}
	for _, name := range []string{"Idempotency-Key", "X-Idempotency-Key", "Idempotency-Token"} {
		tr, err := idemretry.NewTransport(nil, inMemory(), idemretry.WithKeyHeader(name))
		require.NoError(t, err, name)
		require.NoError(t, tr.Close())
	}
}
