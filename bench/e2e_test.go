package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/idemretry/idemretry/internal/procstat"
)

// The end-to-end driver sends what it counts: every action it reports
// reached the server as one request, and each idemretry action, named or
// not, as a new action with a key no other request carried. An unnamed
// action that repeated an earlier body would be the same action (its
// fingerprint), not a new one, and would not show as a new key.
func TestE2EDriverSendsDistinctActions(t *testing.T) {
	for _, name := range E2ENames {
		t.Run(name, func(t *testing.T) {
			srv := NewRecordingServer(SmallBody)
			_, got := driveAlone(t, name, srv, 4)
			if got.Actions < 4 {
				t.Fatalf("%d actions in 100 ms from 4 goroutines", got.Actions)
			}
			if srv.Requests() != got.Actions {
				t.Errorf("server answered %d requests, driver counted %d actions", srv.Requests(), got.Actions)
			}
			keys := srv.Keys()
			if name == NetHTTP {
				if len(keys) != 0 {
					t.Errorf("net/http sent %d Idempotency-Keys", len(keys))
				}
				return
			}
			if int64(len(keys)) != got.Actions {
				t.Errorf("%d distinct keys for %d actions", len(keys), got.Actions)
			}
			for k, n := range keys {
				if n != 1 {
					t.Errorf("key %s sent %d times", k, n)
				}
			}
			if bad := srv.BadBodies(); bad > 0 {
				t.Errorf("%d bodies arrived damaged", bad)
			}
		})
	}
}

// Measure runs every participant, the probe too, and reports what each did;
// the probe's file holds one ProbeBytes write per probe action counted.
func TestE2EMeasureEveryParticipant(t *testing.T) {
	names := append(append([]string{}, E2ENames...), ProbeName, ProbeThenNetHTTP, ProbeHandoffThenNetHTTP)
	e, err := NewE2E(names)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	got, err := e.Measure(2, 40*time.Millisecond, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	var sent int64
	for _, name := range names {
		s := got[name]
		if s.Actions == 0 || s.Elapsed < 40*time.Millisecond || s.PerSecond() <= 0 || s.PerAction() <= 0 {
			t.Errorf("%s: %+v", name, s)
		}
		// The process's CPU time is read where procstat can (Unix): some
		// was used, and no more than every core busy throughout.
		if procstat.CPUTime() > 0 && (s.CPU <= 0 || s.CPUPerAction() <= 0 || s.CPUUse() <= 0 || s.CPUUse() > float64(runtime.NumCPU())+0.5) {
			t.Errorf("%s: CPU %v for %d actions in %v (%.2f cores busy)", name, s.CPU, s.Actions, s.Elapsed, s.CPUUse())
		}
		if name != ProbeName {
			sent += s.Actions
		}
	}
	// The warm-up sends too, uncounted: at least what was counted arrived.
	if e.srv.Requests() < sent {
		t.Errorf("server answered %d requests, Measure counted %d", e.srv.Requests(), sent)
	}
	fi, err := os.Stat(filepath.Join(e.Dir(), ProbeName, "probe"))
	if err != nil {
		t.Fatal(err)
	}
	if n := fi.Size() / ProbeBytes; n < got[ProbeName].Actions || fi.Size()%ProbeBytes != 0 {
		t.Errorf("probe file of %d bytes for %d counted syncs of %d bytes", fi.Size(), got[ProbeName].Actions, ProbeBytes)
	}
}

// The sync-then-request floor does both, in turn, for each action it
// counts: one probe write and one plain request (no key) per action.
func TestE2EProbeThenNetHTTPSyncsAndSends(t *testing.T) {
	srv := NewRecordingServer(SmallBody)
	e, got := driveAlone(t, ProbeThenNetHTTP, srv, 1)
	if got.Actions == 0 || len(got.Latencies) != int(got.Actions) {
		t.Fatalf("%d actions, %d latencies", got.Actions, len(got.Latencies))
	}
	if srv.Requests() != got.Actions || len(srv.Keys()) != 0 || srv.BadBodies() != 0 {
		t.Errorf("%d actions: server answered %d requests, %d keys, %d bad bodies",
			got.Actions, srv.Requests(), len(srv.Keys()), srv.BadBodies())
	}
	fi, err := os.Stat(filepath.Join(e.Dir(), ProbeThenNetHTTP, "probe"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != got.Actions*ProbeBytes {
		t.Errorf("probe file of %d bytes for %d actions of %d bytes", fi.Size(), got.Actions, ProbeBytes)
	}
}

// The handed-over sync's floor does both too, for each action it counts:
// one probe write, made by its syncer's goroutine, and one plain request.
// Close stops that goroutine.
func TestE2EProbeHandoffThenNetHTTPSyncsAndSends(t *testing.T) {
	srv := NewRecordingServer(SmallBody)
	var s *syncer
	t.Cleanup(func() { // after driveAlone's, which closes e
		select {
		case <-s.done:
		default:
			t.Error("the syncer's goroutine runs on after Close")
		}
	})
	e, got := driveAlone(t, ProbeHandoffThenNetHTTP, srv, 2)
	s = e.actors[ProbeHandoffThenNetHTTP].(handoffThenPost).s
	if got.Actions == 0 {
		t.Fatal("no actions")
	}
	if srv.Requests() != got.Actions || len(srv.Keys()) != 0 || srv.BadBodies() != 0 {
		t.Errorf("%d actions: server answered %d requests, %d keys, %d bad bodies",
			got.Actions, srv.Requests(), len(srv.Keys()), srv.BadBodies())
	}
	fi, err := os.Stat(filepath.Join(e.Dir(), ProbeHandoffThenNetHTTP, "probe"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != got.Actions*ProbeBytes {
		t.Errorf("probe file of %d bytes for %d actions of %d bytes", fi.Size(), got.Actions, ProbeBytes)
	}
}

// Unique payloads differ from each other only in their first 20 bytes.
func TestUniquePayload(t *testing.T) {
	a, b := uniquePayload(SmallBody, 7), uniquePayload(SmallBody, 1234567890123)
	if len(a) != SmallBody || len(b) != SmallBody {
		t.Fatalf("lengths %d, %d", len(a), len(b))
	}
	if bytes.Equal(a, b) || !bytes.Equal(a[20:], b[20:]) || !bytes.Equal(a[20:], payload(SmallBody)[20:]) {
		t.Errorf("payloads %q..., %q...", a[:24], b[:24])
	}
	if string(a[:20]) != "00000000000000000007" {
		t.Errorf("stamp %q", a[:20])
	}
}

// driveAlone drives the participant name alone against srv from
// goroutines for 100 ms; its e2e is closed with the test.
func driveAlone(t *testing.T, name string, srv *Server, goroutines int) (*E2E, Sample) {
	t.Helper()
	e, err := newE2E([]string{name}, srv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Error(err)
		}
	})
	got, err := drive(e.actors[name], goroutines, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	return e, got
}
