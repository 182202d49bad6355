package paytest_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry/internal/paytest"
)

// pay sends one POST to url over real HTTP and returns its status, its
// body and whether it was a replay.
func pay(t *testing.T, url, key, intent, body string) (int, string, bool) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/payments", strings.NewReader(body))
	require.NoError(t, err)
	if key != "" {
		req.Header.Set(paytest.KeyHeader, key)
	}
	if intent != "" {
		req.Header.Set(paytest.IntentHeader, intent)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b), resp.Header.Get("Idempotent-Replayed") == "true"
}

func TestServerChargesOnceAndReplays(t *testing.T) {
	s := paytest.New()
	srv := httptest.NewServer(s)
	defer srv.Close()

	st1, body1, replay1 := pay(t, srv.URL, "k1", "order-1", `{"amount":100}`)
	st2, body2, replay2 := pay(t, srv.URL, `"k1"`, "order-1", `{"amount":100}`) // the quoted form is the same key
	require.Equal(t, http.StatusCreated, st1)
	require.False(t, replay1)
	require.Equal(t, st1, st2)
	require.True(t, replay2)
	require.Equal(t, body1, body2, "the stored answer, replayed")
	a, ok := paytest.ParseAnswer([]byte(body1))
	require.True(t, ok)
	require.Equal(t, paytest.Answer{Charge: "ch_1", Intent: "order-1", Key: "k1"}, a)

	require.Len(t, s.Charges(), 1)
	require.Len(t, s.ChargesOf("order-1"), 1)
	require.Len(t, s.ChargesUnder("k1"), 1)
	reqs := s.Requests()
	require.Len(t, reqs, 2)
	require.Equal(t, paytest.Charged, reqs[0].Outcome)
	require.Equal(t, paytest.Replayed, reqs[1].Outcome)
	require.Equal(t, "ch_1", reqs[1].Charge)

	t.Run("WithMethods", func(t *testing.T) {
		for _, tc := range []struct {
			opts []paytest.Option
			want paytest.Outcome
		}{{nil, paytest.NotAllowed}, {[]paytest.Option{paytest.WithMethods(http.MethodPut)}, paytest.Charged}} {
			s := paytest.New(tc.opts...)
			srv := httptest.NewServer(s)
			req, err := http.NewRequest(http.MethodPut, srv.URL+"/v1/payments", strings.NewReader("x"))
			require.NoError(t, err)
			req.Header.Set(paytest.KeyHeader, "k1")
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			srv.Close()
			require.Equal(t, tc.want, s.Requests()[0].Outcome)
			if tc.want == paytest.NotAllowed {
				require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
				require.Empty(t, s.Charges())
			} else {
				require.Len(t, s.ChargesUnder("k1"), 1)
			}
		}
	})

	t.Run("WithAnswerBody", func(t *testing.T) {
		s := paytest.New(paytest.WithAnswerBody(func(c paytest.Charge) []byte { return []byte(c.ID + " " + c.Key) }))
		srv := httptest.NewServer(s)
		defer srv.Close()
		_, body1, _ := pay(t, srv.URL, "k1", "", `{"amount":100}`)
		_, body2, replay2 := pay(t, srv.URL, "k1", "", `{"amount":100}`)
		_, body3, _ := pay(t, srv.URL, "k2", "", `{"amount":100}`)
		require.Equal(t, "ch_1 k1", body1)
		require.Equal(t, body1, body2, "the stored answer, replayed")
		require.True(t, replay2)
		require.Equal(t, "ch_2 k2", body3)
	})
}

func TestServerRefusesAnotherBodyUnderAKey(t *testing.T) {
	s := paytest.New()
	srv := httptest.NewServer(s)
	defer srv.Close()

	pay(t, srv.URL, "k1", "", `{"amount":100}`)
	st, body, _ := pay(t, srv.URL, "k1", "", `{"amount":999}`)
	require.Equal(t, http.StatusUnprocessableEntity, st)
	require.Contains(t, body, "Idempotency-Key is already used")
	require.Len(t, s.Charges(), 1)
	require.Equal(t, paytest.Mismatch, s.Requests()[1].Outcome)
}

func TestServerAnswers409WhileTheKeyIsInFlight(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	s := paytest.New(paytest.WithProcessing(func(n int, r *http.Request) {
		if n == 1 {
			close(arrived)
			<-release
		}
	}))
	srv := httptest.NewServer(s)
	defer srv.Close()

	first := make(chan int)
	go func() {
		st, _, _ := pay(t, srv.URL, "k1", "", "x")
		first <- st
	}()
	<-arrived
	st, body, _ := pay(t, srv.URL, "k1", "", "x")
	require.Equal(t, http.StatusConflict, st)
	require.Contains(t, body, "idempotency_key_in_use")
	close(release)
	require.Equal(t, http.StatusCreated, <-first)
	st, _, replay := pay(t, srv.URL, "k1", "", "x")
	require.Equal(t, http.StatusCreated, st)
	require.True(t, replay)
	require.Len(t, s.Charges(), 1)

	t.Run("WithFailure", func(t *testing.T) {
		arrived, release := make(chan struct{}), make(chan struct{})
		s := paytest.New(paytest.WithProcessing(func(n int, r *http.Request) {
			if n == 1 {
				close(arrived)
				<-release
			}
		}), paytest.WithFailure(func(n int, r *http.Request) (int, bool) {
			return http.StatusServiceUnavailable, n == 1
		}))
		srv := httptest.NewServer(s)
		defer srv.Close()

		first := make(chan int)
		go func() {
			st, _, _ := pay(t, srv.URL, "k1", "", "x")
			first <- st
		}()
		<-arrived
		st, _, _ := pay(t, srv.URL, "k1", "", "x")
		require.Equal(t, http.StatusConflict, st, "the failing charge holds its key while it runs")
		close(release)
		require.Equal(t, http.StatusServiceUnavailable, <-first)
		require.Empty(t, s.Charges())
		st, _, replay := pay(t, srv.URL, "k1", "", "x")
		require.Equal(t, http.StatusCreated, st, "the key was released: a new charge")
		require.False(t, replay)
		require.Len(t, s.ChargesUnder("k1"), 1)
		outcomes := []paytest.Outcome{}
		for _, r := range s.Requests() {
			outcomes = append(outcomes, r.Outcome)
		}
		require.Equal(t, []paytest.Outcome{paytest.Failed, paytest.InFlight, paytest.Charged}, outcomes)
	})
}

func TestServerForgetsKeysAfterItsWindow(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	s := paytest.New(paytest.WithClock(clock), paytest.WithKeyWindow(time.Hour))
	srv := httptest.NewServer(s)
	defer srv.Close()

	pay(t, srv.URL, "k1", "", "x")
	advance(59 * time.Minute)
	_, _, replay := pay(t, srv.URL, "k1", "", "x")
	require.True(t, replay, "within the window: replayed")
	advance(time.Minute)
	_, _, replay = pay(t, srv.URL, "k1", "", "x")
	require.False(t, replay, "past the window: the key is forgotten, a new charge")
	require.Len(t, s.ChargesUnder("k1"), 2)
}

func TestServerWithoutAKey(t *testing.T) {
	s := paytest.New()
	srv := httptest.NewServer(s)
	defer srv.Close()
	st, _, _ := pay(t, srv.URL, "", "", "x")
	require.Equal(t, http.StatusBadRequest, st)
	require.Empty(t, s.Charges())

	k := paytest.New(paytest.WithKeylessCharges())
	srv2 := httptest.NewServer(k)
	defer srv2.Close()
	pay(t, srv2.URL, "", "", "x")
	pay(t, srv2.URL, "", "", "x")
	require.Len(t, k.ChargesOf("x"), 2, "a keyless charge is made every time")
}

func TestServerAnswerLostAfterTheCharge(t *testing.T) {
	s := paytest.New(paytest.WithAfterCharge(func(n int, w http.ResponseWriter, r *http.Request) bool {
		return n == 1 && paytest.HijackAndClose(w)
	}))
	srv := httptest.NewServer(s)
	defer srv.Close()

	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/payments", strings.NewReader("x"))
	require.NoError(t, err)
	req.Header.Set(paytest.KeyHeader, "k1")
	_, err = http.DefaultClient.Do(req)
	require.Error(t, err, "the answer was cut")
	require.Len(t, s.Charges(), 1, "the charge stands")
	_, _, replay := pay(t, srv.URL, "k1", "", "x")
	require.True(t, replay)
	require.Len(t, s.Charges(), 1)
}

func TestServerBeforeAnswersItself(t *testing.T) {
	s := paytest.New(paytest.WithBefore(func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n > 2 {
			return false
		}
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		return true
	}))
	for i, want := range []int{503, 503, 201} {
		req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader("x"))
		req.Header.Set(paytest.KeyHeader, "k1")
		w := httptest.NewRecorder() // in memory: no server, no socket
		s.ServeHTTP(w, req)
		require.Equal(t, want, w.Code, "request %d", i+1)
	}
	reqs := s.Requests()
	require.Equal(t, paytest.Answered, reqs[0].Outcome)
	require.Equal(t, paytest.Charged, reqs[2].Outcome)
	require.Len(t, s.Charges(), 1)
}

func TestServerConcurrentRequestsOfOneKeyChargeOnce(t *testing.T) {
	s := paytest.New(paytest.WithProcessing(func(int, *http.Request) { time.Sleep(time.Millisecond) }))
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader("x"))
			req.Header.Set(paytest.KeyHeader, "k1")
			s.ServeHTTP(httptest.NewRecorder(), req)
		}()
	}
	wg.Wait()
	require.Len(t, s.Charges(), 1)
	var charged, other int
	for _, r := range s.Requests() {
		if r.Outcome == paytest.Charged {
			charged++
		} else {
			other++
		}
	}
	require.Equal(t, 1, charged)
	require.Equal(t, 31, other)
}
