package idemretry_test

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemretry/idemretry/internal/paytest"
	idemretry "github.com/idemretry/idemretry/mobile"
)

// TestMain checks for leaked goroutines, and runs 4 tests per CPU at once
// unless -test.parallel says otherwise: the tests mostly wait (for
// timeouts, held answers, child processes), so the default of one per CPU
// leaves the CPUs idle.
func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		if err := flag.Set("test.parallel", strconv.Itoa(4*runtime.GOMAXPROCS(0))); err != nil {
			panic(err)
		}
	}
	goleak.VerifyTestMain(m)
}

// open returns a Client on a new journal directory, closed at the end of
// the test, and the directory.
func open(t *testing.T, opts *idemretry.Options) (*idemretry.Client, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "idemretry")
	c, err := idemretry.NewClient(dir, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c, dir
}

// payment returns a POST of amount to srv's /charges, named actionID.
func payment(srv *payServer, actionID, amount string) *idemretry.Request {
	r := idemretry.NewRequest("POST", srv.URL+"/charges")
	r.Headers.Set("Content-Type", "application/json")
	r.Body = []byte(`{"amount":` + amount + `}`)
	r.ActionID = actionID
	return r
}

// kindOf returns err's kind, failing the test if err is nil or its message
// names what a Kotlin or Swift developer does not have (mobileWordsOnly).
func kindOf(t *testing.T, err error) int32 {
	t.Helper()
	require.Error(t, err)
	mobileWordsOnly(t, idemretry.FailureOf(err).Message)
	return idemretry.ErrorKind(err)
}

// mobileWordsOnly fails the test if msg names an identifier of the Go API
// that the mobile API does not have (WithAction, WithLockWait, Transport,
// ...: every exported name of the packages mobile wraps, but its own), or
// Go's context (a "context deadline exceeded" is the app's TimeoutMillis).
func mobileWordsOnly(t *testing.T, msg string) {
	t.Helper()
	goWordsOnce.Do(func() { goWords, goWordsErr = loadGoWords() })
	require.NoError(t, goWordsErr)
	if ws := goWords.FindAllString(msg, -1); ws != nil {
		t.Errorf("the message names %q, which the mobile API does not have: %s", ws, msg)
	}
}

var (
	goWordsOnce sync.Once
	goWords     *regexp.Regexp
	goWordsErr  error
)

// loadGoWords returns a pattern matching, as words, every exported
// top-level identifier of the root, journal and filejournal packages that
// is not one of this package's, and a few Go names besides.
func loadGoWords() (*regexp.Regexp, error) {
	// exported returns the exported top-level names of the Go files
	// (tests aside) in dirs, whatever their build tags.
	exported := func(dirs ...string) (map[string]bool, error) {
		names := map[string]bool{}
		for _, dir := range dirs {
			files, err := filepath.Glob(filepath.Join(dir, "*.go"))
			if err != nil {
				return nil, err
			}
			for _, file := range files {
				if strings.HasSuffix(file, "_test.go") {
					continue
				}
				f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.SkipObjectResolution)
				if err != nil {
					return nil, err
				}
				for _, d := range f.Decls {
					for _, name := range declNames(d) {
						if ast.IsExported(name) {
							names[name] = true
						}
					}
				}
			}
		}
		if len(names) == 0 {
			return nil, fmt.Errorf("no exported names in %s", dirs)
		}
		return names, nil
	}
	mobile, err := exported(".")
	if err != nil {
		return nil, err
	}
	wrapped, err := exported("..", "../journal", "../filejournal")
	if err != nil {
		return nil, err
	}
	words := []string{"context", "RoundTrip", "RoundTripper", "GetBody", "GODEBUG", "ctx"}
	for name := range wrapped {
		if !mobile[name] {
			words = append(words, name)
		}
	}
	sort.Strings(words)
	return regexp.Compile(`\b(` + strings.Join(words, "|") + `)\b`)
}

// declNames returns the names a top-level declaration declares (none for
// a method).
func declNames(d ast.Decl) []string {
	var names []string
	switch d := d.(type) {
	case *ast.FuncDecl:
		if d.Recv == nil {
			names = append(names, d.Name.Name)
		}
	case *ast.GenDecl:
		for _, spec := range d.Specs {
			switch spec := spec.(type) {
			case *ast.TypeSpec:
				names = append(names, spec.Name.Name)
			case *ast.ValueSpec:
				for _, n := range spec.Names {
					names = append(names, n.Name)
				}
			}
		}
	}
	return names
}

// rebuildWith adapts a function to Rebuilder.
type rebuildWith func(actionID string) (*idemretry.Request, error)

func (f rebuildWith) Rebuild(actionID string) (*idemretry.Request, error) { return f(actionID) }

// maybePaid sends payment actionID (amount) while the server holds its
// answer, so that it ends KindMaybeProcessed after the server charged it,
// closes the Client (the app is gone) and returns the key charged.
func maybePaid(t *testing.T, srv *payServer, dir string, req *idemretry.Request) string {
	t.Helper()
	srv.setAfterCommit(holdUntilGone)
	c, err := idemretry.NewClient(dir, nil)
	require.NoError(t, err)
	req.TimeoutMillis = 1500
	_, err = c.Send(req)
	require.Equal(t, idemretry.KindMaybeProcessed, kindOf(t, err), "%v", err)
	key := <-srv.committed
	require.NoError(t, c.Close())
	srv.setAfterCommit(nil)
	return key
}

// chargedAnswerLost pays action through c, the server charging it and then
// holding the answer past the Send's timeout: KindMaybeProcessed. It
// returns the payment's key, and leaves the server answering again.
func chargedAnswerLost(t *testing.T, srv *payServer, c *idemretry.Client, action string) string {
	t.Helper()
	srv.setAfterCommit(holdUntilGone)
	r := payment(srv, action, "100")
	r.TimeoutMillis = 1500
	_, err := c.Send(r)
	require.Equal(t, idemretry.KindMaybeProcessed, kindOf(t, err), "%v", err)
	srv.setAfterCommit(nil)
	return idemretry.FailureOf(err).Key
}

// payServer is the shared payment server (internal/paytest: Stripe's
// idempotency semantics and a ledger) on loopback: a POST without an
// Idempotency-Key is refused (400); a new key is charged once and its
// answer stored; a known key with the same payload gets the stored answer
// again with Idempotent-Replayed: true; with another payload, 422; while
// its charge is in progress, 409. A charge answers 200 {"charge":"ch_N"}
// with two X-Multi headers; any other method is answered 200 "pong".
type payServer struct {
	*httptest.Server
	pay *paytest.Server
	mu  sync.Mutex
	// before, if set, answers a request itself (returning true) before
	// the idempotency layer sees it: an outage, say.
	before func(w http.ResponseWriter, r *http.Request) bool
	// afterCommit, if set, runs once a new key's charge is committed and
	// its answer stored, and may withhold the answer (returning true): hold
	// it until the client is gone, or cut the connection.
	afterCommit func(w http.ResponseWriter, r *http.Request) bool
	// committed receives the key of every charge committed, if not full.
	committed chan string
}

type seenRequest struct {
	Key    string // the Idempotency-Key header as sent
	Header http.Header
	Body   string
}

func newPayServer(t *testing.T) *payServer {
	t.Helper()
	s := &payServer{committed: make(chan string, 64)}
	s.pay = paytest.New(
		paytest.WithMethods(http.MethodPost),
		paytest.WithStatus(http.StatusOK),
		paytest.WithAnswerBody(func(c paytest.Charge) []byte { return []byte(`{"charge":"` + c.ID + `"}`) }),
		paytest.WithBefore(func(_ int, w http.ResponseWriter, r *http.Request) bool {
			s.mu.Lock()
			before := s.before
			s.mu.Unlock()
			if before != nil && before(w, r) {
				return true
			}
			if r.Method != http.MethodPost {
				w.Header().Set("X-Server", "pay")
				w.WriteHeader(http.StatusOK)
				_, _ = io.WriteString(w, "pong")
				return true
			}
			return false
		}),
		paytest.WithAfterCharge(func(_ int, w http.ResponseWriter, r *http.Request) bool {
			select {
			case s.committed <- r.Header.Get(paytest.KeyHeader):
			default:
			}
			s.mu.Lock()
			afterCommit := s.afterCommit
			s.mu.Unlock()
			if afterCommit != nil && afterCommit(w, r) {
				return true
			}
			w.Header().Add("X-Multi", "b")
			w.Header().Add("X-Multi", "a")
			return false
		}))
	s.Server = httptest.NewServer(s.pay)
	t.Cleanup(s.Close)
	return s
}

func (s *payServer) setBefore(f func(w http.ResponseWriter, r *http.Request) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.before = f
}

func (s *payServer) setAfterCommit(f func(w http.ResponseWriter, r *http.Request) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.afterCommit = f
}

// holdUntilGone withholds the answer until the client goes away.
func holdUntilGone(w http.ResponseWriter, r *http.Request) bool {
	<-r.Context().Done()
	return true
}

// cutConnection closes the connection without an answer.
func cutConnection(w http.ResponseWriter, r *http.Request) bool {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err == nil {
		_ = conn.Close()
	}
	return true
}

// snapshot returns the requests seen and the charges per key (as sent).
func (s *payServer) snapshot() ([]seenRequest, map[string]int) {
	var reqs []seenRequest
	for _, r := range s.pay.Requests() {
		reqs = append(reqs, seenRequest{Key: r.Header.Get(paytest.KeyHeader), Header: r.Header, Body: string(r.Body)})
	}
	charges := map[string]int{}
	for _, c := range s.pay.Charges() {
		charges[c.Header.Get(paytest.KeyHeader)]++
	}
	return reqs, charges
}

func (s *payServer) requestCount() int { return len(s.pay.Requests()) }

// aheadClock is the system clock moved forward by d; without a NewTimer,
// its waits run on the system's timers.
type aheadClock struct{ d time.Duration }

func (c aheadClock) Now() time.Time { return time.Now().Add(c.d) }
