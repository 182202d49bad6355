package idemretry_test

// hW1's review: what the caller is told against what the journal records,
// on the default path (unnamed requests, the file journal), when the
// caller's deadline, cancel or http.Client.Timeout lands anywhere around
// the server's answer. A caller told "pending" (an error, or a give-up)
// must find the same key on its next identical request; a caller given a
// final answer must find a new one (a deliberate repeat is a new payment).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// deadlineLedger is a loopback payment server with Stripe's semantics (a key is
// charged once; a repeat replays; a repeat while the charge runs is 409),
// whose charges take a random few milliseconds, so that answers land
// around the clients' deadlines.
type deadlineLedger struct {
	mu       sync.Mutex
	stored   map[string]int // key -> status
	inflight map[string]bool
	charges  map[string]int // key -> charges
	rnd      *rand.Rand
}

func newDeadlineLedger(seed uint64) *deadlineLedger {
	return &deadlineLedger{stored: map[string]int{}, inflight: map[string]bool{}, charges: map[string]int{},
		rnd: rand.New(rand.NewPCG(seed, 7))}
}

func (l *deadlineLedger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	key := r.Header.Get("Idempotency-Key")
	l.mu.Lock()
	if st, ok := l.stored[key]; ok {
		l.mu.Unlock()
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(st)
		io.WriteString(w, `{"replayed":true}`)
		return
	}
	if l.inflight[key] {
		l.mu.Unlock()
		w.WriteHeader(http.StatusConflict)
		return
	}
	delay := time.Duration(l.rnd.IntN(25)) * time.Millisecond
	fail := l.rnd.IntN(8) == 0
	slowBody := l.rnd.IntN(4) == 0
	l.inflight[key] = true
	l.mu.Unlock()
	time.Sleep(delay)
	if fail {
		// Not processed: nothing stored.
		l.mu.Lock()
		delete(l.inflight, key)
		l.mu.Unlock()
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	l.mu.Lock()
	delete(l.inflight, key)
	l.charges[key]++
	l.stored[key] = http.StatusCreated
	l.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	if slowBody {
		// The body arrives across the deadline.
		io.WriteString(w, `{"charge":`)
		w.(http.Flusher).Flush()
		time.Sleep(10 * time.Millisecond)
	}
	io.WriteString(w, `"ok"}`)
}

// keyOfAnswer returns the key an outcome carried: the response's request's
// header, or the ActionError's key; "" when neither says.
func keyOfAnswer(resp *http.Response, err error) string {
	if resp != nil && resp.Request != nil {
		return resp.Request.Header.Get("Idempotency-Key")
	}
	var ae *idemretry.ActionError
	if errors.As(err, &ae) {
		return ae.Key
	}
	return ""
}

// Found in review hw1 (03eab9b; was TestHW1WhatTheCallerIsToldIsWhatTheNextTapFinds).
func TestOutcomeToldIsWhatTheNextTapFinds(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	ledger := newDeadlineLedger(seed)
	srv := newServer(t, ledger.ServeHTTP)
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tr, err := idemretry.NewTransport(base, idemretry.WithJournalDir(t.TempDir()),
		idemretry.WithBackOff(constant(5*time.Millisecond)), idemretry.WithRetryBudget(0, 0))
	require.NoError(t, err)
	defer func() { require.NoError(t, tr.Close()) }()
	client := &http.Client{Transport: tr}

	const payers, rounds = 4, 30
	var nPending, nFinal atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, payers)
	for p := range payers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(seed, uint64(p)))
			body := fmt.Sprintf(`{"payer":%d,"amount":100}`, p)
			var (
				prevKey     string
				prevPending bool
				prevWhat    string
			)
			for i := range rounds {
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				c := client
				mode := rnd.IntN(4)
				d := time.Duration(1+rnd.IntN(35)) * time.Millisecond
				switch mode {
				case 0:
					ctx, cancel = context.WithTimeout(ctx, d)
				case 1:
					ctx, cancel = context.WithCancel(ctx)
					stop := time.AfterFunc(d, cancel)
					defer stop.Stop()
				case 2:
					c = &http.Client{Transport: tr, Timeout: d}
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/pay", strings.NewReader(body))
				resp, err := c.Do(req)
				key := keyOfAnswer(resp, err)
				pending := true
				what := fmt.Sprintf("round %d mode %d after %v: ", i, mode, d)
				if resp != nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					reason := idemretry.GiveUpReason(resp)
					pending = reason != nil
					what += fmt.Sprintf("%d (give-up %v)", resp.StatusCode, reason)
				} else {
					what += fmt.Sprintf("error %v", err)
				}
				cancel()
				if key != "" && prevKey != "" {
					switch {
					case prevPending && key != prevKey:
						errs <- fmt.Errorf("payer %d: %s left the action pending under %s, yet %s carried %s", p, prevWhat, prevKey, what, key)
						return
					case !prevPending && key == prevKey:
						errs <- fmt.Errorf("payer %d: %s was final under %s, yet the deliberate repeat %s carried it again", p, prevWhat, prevKey, what)
						return
					}
				}
				if key != "" {
					prevKey, prevPending, prevWhat = key, pending, what
					if pending {
						nPending.Add(1)
					} else {
						nFinal.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	t.Logf("%d outcomes final, %d pending", nFinal.Load(), nPending.Load())
	for err := range errs {
		t.Error(err)
	}
	ledger.mu.Lock()
	defer ledger.mu.Unlock()
	for k, n := range ledger.charges {
		if n > 1 {
			t.Errorf("key %s charged %d times", k, n)
		}
	}
}
