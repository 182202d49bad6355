package idemretry_test

// hW1's review: double taps, named and unnamed, over the default file
// journal and a restart, with the callers' deadlines, cancels and
// http.Client timeouts landing anywhere around the server's answers, and
// bodies at and around the keyed fingerprint's 512 bytes and its 64 KiB
// chunk, sent with and without GetBody.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// tapLedger is deadlineLedger's semantics, keeping for each payload the keys
// it was sent under, and refusing (as a test failure) the start of a
// charge of a payload under one key while another key's charge of the
// same payload is under way: one tap pair, two payments.
type tapLedger struct {
	mu       sync.Mutex
	rnd      *rand.Rand
	stored   map[string]int
	inflight map[string]bool
	charging map[[32]byte]string // payload -> the key whose charge runs
	keys     map[[32]byte]map[string]bool
	charges  map[string]int
	overlaps []string
}

func (l *tapLedger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	sum := sha256.Sum256(b)
	key := r.Header.Get("Idempotency-Key")
	l.mu.Lock()
	if l.keys[sum] == nil {
		l.keys[sum] = map[string]bool{}
	}
	l.keys[sum][key] = true
	if st, ok := l.stored[key]; ok {
		l.mu.Unlock()
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(st)
		return
	}
	if l.inflight[key] {
		l.mu.Unlock()
		w.WriteHeader(http.StatusConflict)
		return
	}
	delay := time.Duration(l.rnd.IntN(25)) * time.Millisecond
	if l.rnd.IntN(8) == 0 {
		l.mu.Unlock()
		time.Sleep(delay)
		w.WriteHeader(http.StatusServiceUnavailable) // not processed
		return
	}
	if other, ok := l.charging[sum]; ok {
		l.overlaps = append(l.overlaps, fmt.Sprintf("payload %x: charge under %s began while %s's ran", sum[:4], key, other))
	}
	l.charging[sum] = key
	l.inflight[key] = true
	l.mu.Unlock()
	time.Sleep(delay)
	l.mu.Lock()
	delete(l.inflight, key)
	if l.charging[sum] == key {
		delete(l.charging, sum)
	}
	l.charges[key]++
	l.stored[key] = http.StatusCreated
	l.mu.Unlock()
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, `{"charge":"ok"}`)
}

// tapBody is the body of payload i: sizes at and around the keyed
// fingerprint's threshold and its chunk.
func tapBody(i int) []byte {
	sizes := []int{100, 511, 512, 513, 64 << 10, 64<<10 + 1}
	b := bytes.Repeat([]byte{'a' + byte(i)}, sizes[i%len(sizes)])
	copy(b, fmt.Sprintf(`{"p":%d}`, i))
	return b
}

// Found in review hw1 (03eab9b; was TestHW1TapsAroundDeadlinesAndARestart).
func TestFlightTapsAroundDeadlinesAndARestart(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	l := &tapLedger{rnd: rand.New(rand.NewPCG(seed, 1)), stored: map[string]int{}, inflight: map[string]bool{},
		charging: map[[32]byte]string{}, keys: map[[32]byte]map[string]bool{}, charges: map[string]int{}}
	srv := newServer(t, l.ServeHTTP)
	dir := t.TempDir()
	const payloads = 6
	const slack = 2 * time.Second // a noisy 2-core machine

	phase := func(tr *idemretry.Transport, phase int) {
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for p := range 2 * payloads { // payloads 0-5 named, 6-11 unnamed
			for g := range 3 { // three tappers each
				wg.Add(1)
				go func() {
					defer wg.Done()
					rnd := rand.New(rand.NewPCG(seed, uint64(1000*phase+10*p+g)))
					body := tapBody(p % payloads)
					if p >= payloads {
						body = append(body, 'u') // unnamed: another payload
					}
					for range 8 {
						ctx := context.Background()
						if p < payloads {
							ctx = idemretry.WithAction(ctx, fmt.Sprintf("pay:%d", p))
						}
						var cancel context.CancelFunc = func() {}
						c := &http.Client{Transport: tr}
						d := time.Duration(1+rnd.IntN(40)) * time.Millisecond
						switch rnd.IntN(4) {
						case 0:
							ctx, cancel = context.WithTimeout(ctx, d)
						case 1:
							ctx, cancel = context.WithCancel(ctx)
							stop := time.AfterFunc(d, cancel)
							defer stop.Stop()
						case 2:
							c.Timeout = d
						default:
							d = time.Hour
						}
						var rd io.Reader = bytes.NewReader(body) // GetBody
						if rnd.IntN(2) == 0 {
							rd = struct{ io.Reader }{bytes.NewReader(body)} // no GetBody: buffered
						}
						req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/pay", rd)
						start := time.Now()
						resp, err := c.Do(req)
						if el := time.Since(start); el > d+idemretry.OutcomeGrace+slack {
							errs <- fmt.Errorf("payload %d: returned %v after a %v bound", p, el, d)
						}
						if resp != nil {
							_, _ = io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
						}
						cancel()
						var ae *idemretry.ActionError
						if errors.As(err, &ae) && (errors.Is(err, idemretry.ErrFingerprintMismatch) || errors.Is(err, idemretry.ErrFingerprintUncheckable)) {
							errs <- fmt.Errorf("payload %d: the same payload refused: %v", p, err)
						}
					}
				}()
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
	for ph := range 2 { // a restart between the phases
		tr, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir),
			idemretry.WithBackOff(constant(5*time.Millisecond)), idemretry.WithRetryBudget(0, 0))
		require.NoError(t, err)
		phase(tr, ph)
		require.NoError(t, tr.Close())
	}
	checkNoPackageGoroutines(t)

	l.mu.Lock()
	defer l.mu.Unlock()
	for _, o := range l.overlaps {
		t.Error(o)
	}
	for p := range payloads {
		sum := sha256.Sum256(tapBody(p))
		if n := len(l.keys[sum]); n > 1 {
			t.Errorf("named action pay:%d went out under %d keys", p, n)
		}
	}
	for k, n := range l.charges {
		if n > 1 {
			t.Errorf("key %s charged %d times", k, n)
		}
	}
}
