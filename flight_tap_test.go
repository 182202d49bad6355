package idemretry_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// The one-tap pattern, with some joiners ending their own context about
// when the leader ends (some before, some after the landing), and late new
// requests of the tap: paid at most once, every caller gets an answer or an
// error (never nil, nil), and no caller stays counted in a flight.
func TestFlightOneTapWithEndingJoinersLeavesNothing(t *testing.T) { oneTapRounds(t, 0) }
func TestFlightOneTapWithLateArrivalsLeavesNothing(t *testing.T)  { oneTapRounds(t, 2) }

func oneTapRounds(t *testing.T, late int) {
	srv := newPayServer(t)
	j := newStallingReserve(false)
	tr := transportOver(t, j)
	const rounds, joiners = 30, 6
	for round := range rounds {
		body := fmt.Sprintf(`{"amount":10,"round":%d}`, round)
		roundTrip(t, tr, post(t, context.Background(), srv.URL, body))
		before := srv.chargeCount()
		j.arm()
		lctx, cancel := context.WithCancel(context.Background())
		lerr := make(chan error, 1)
		go func() {
			_, err := tr.RoundTrip(post(t, lctx, srv.URL, body))
			lerr <- err
		}()
		<-j.entered
		answers := make(chan string, joiners+late)
		cancels := make([]context.CancelFunc, joiners)
		for i := range joiners {
			jctx, jc := context.WithCancel(context.Background())
			cancels[i] = jc
			go func() {
				resp, err := tr.RoundTrip(post(t, jctx, srv.URL, body))
				switch {
				case err != nil:
					answers <- "err " + err.Error()
				case resp == nil:
					answers <- "NIL NIL"
				default:
					answers <- fmt.Sprint(resp.StatusCode, " ", readAll(t, resp))
				}
			}()
		}
		require.Eventually(t, func() bool { return idemretry.FlightJoiners(tr) == joiners }, 5*time.Second, time.Millisecond)
		for i := range joiners / 2 {
			go func() {
				time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
				cancels[i]()
			}()
		}
		cancel()
		// late arrivals while the joiners wake
		for range late {
			go func() {
				resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, body))
				switch {
				case err != nil:
					answers <- "err " + err.Error()
				case resp == nil:
					answers <- "NIL NIL"
				default:
					answers <- fmt.Sprint(resp.StatusCode, " ", readAll(t, resp))
				}
			}()
		}
		<-lerr
		var got []string
		for range joiners + late {
			got = append(got, <-answers)
		}
		for _, a := range got {
			require.NotEqual(t, "NIL NIL", a, "round %d: %q", round, got)
		}
		require.LessOrEqual(t, srv.chargeCount(), before+1+late, "round %d: charged %d times: %q", round, srv.chargeCount()-before, got)
		require.Eventually(t, func() bool { return idemretry.FlightJoiners(tr) == 0 }, 2*time.Second, time.Millisecond,
			"round %d: callers still counted: %d", round, idemretry.FlightJoiners(tr))
		for _, c := range cancels {
			c()
		}
	}
}
