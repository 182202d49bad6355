package idemretry

import (
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
)

// judge's verdicts on sending an action's existing record: every state,
// within and past its key window, and a creation in the clock's future.
func TestReserveJudge(t *testing.T) {
	t.Parallel()
	const window = 24 * time.Hour
	at := func(s journal.State, age time.Duration) journal.Record {
		return journal.Record{State: s, CreatedAt: lifeT0.Add(-age)}
	}
	cases := []struct {
		name string
		rec  journal.Record
		want error
	}{
		{"pending, within its window", at(journal.StatePending, time.Hour), nil},
		{"done, within its window (the server replays)", at(journal.StateDone, time.Hour), nil},
		{"pending, just before its window ends", at(journal.StatePending, window-time.Millisecond), nil},
		{"pending, as its window ends", at(journal.StatePending, window), ErrKeyWindowExpired},
		{"pending, past its window", at(journal.StatePending, window+time.Hour), ErrKeyWindowExpired},
		{"done, past its window", at(journal.StateDone, window+time.Hour), ErrKeyWindowExpired},
		{"unknown, within its window", at(journal.StateUnknown, time.Hour), ErrOutcomeUnknown},
		{"unknown, past its window", at(journal.StateUnknown, window+time.Hour), ErrKeyWindowExpired},
		{"created within the skew allowed ahead", at(journal.StatePending, -maxClockSkew+time.Second), nil},
		{"created past the skew allowed ahead", at(journal.StatePending, -maxClockSkew-time.Second), ErrClockSkew},
		{"done, created in the clock's future", at(journal.StateDone, -2*maxClockSkew), ErrClockSkew},
		{"unknown, created in the clock's future", at(journal.StateUnknown, -2*maxClockSkew), ErrOutcomeUnknown},
	}
	for _, tc := range cases {
		if got := judge(tc.rec, lifeT0, window); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
