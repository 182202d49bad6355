package payments

import (
	"context"
	"testing"
	"time"
)

// small shrinks a configuration so that a run takes a fraction of a second
// (and stays meaningful under -race).
func small(cfg Config, f Flavour, dir string) Config {
	cfg.Flavour, cfg.Strategy = f, Strategies[0]
	cfg.Clients, cfg.Intents = 20, 4
	if cfg.Crashers > 0 {
		cfg.Crashers = 5
	}
	cfg.JournalDir = dir
	return cfg
}

func play(t *testing.T, cfg Config) *Result {
	t.Helper()
	res, err := Play(context.Background(), cfg)
	if err != nil {
		t.Fatalf("%s: %v", cfg.Flavour, err)
	}
	t.Logf("%s: charged 2+ %d (restarts %d of %d), %d requests, gave up %d, resumed %d",
		cfg.Flavour, res.Duplicates, res.RestartDuplicates, res.Crashes, res.Requests, res.GaveUp, res.Resumed)
	return res
}

// The claim the scenario exists for: across restarts, only keys kept in a
// durable journal avoid double charges; keys in memory die with the
// process, and so does their protection.
func TestRestartPhaseOnlyJournalAvoidsDuplicates(t *testing.T) {
	root := t.TempDir()
	for _, f := range Flavours {
		res := play(t, small(RestartConfig(7), f, root+"/"+f.String()))
		if res.Crashes != 5 {
			t.Errorf("%s: %d processes killed, want 5", f, res.Crashes)
		}
		if res.GaveUp != 0 {
			t.Errorf("%s: %d payments gave up in a run without faults", f, res.GaveUp)
		}
		if res.LostCharges != 0 {
			t.Errorf("%s: %d payments reported paid were never charged", f, res.LostCharges)
		}
		switch f {
		case FileJournal:
			if res.Duplicates != 0 {
				t.Errorf("%s: %d intents charged twice across restarts, want 0", f, res.Duplicates)
			}
			if res.Resumed != res.Crashes {
				t.Errorf("%s: journals listed %d unfinished actions on restart, want %d", f, res.Resumed, res.Crashes)
			}
			if res.Killed != res.Crashes || res.KilledResent != res.Killed {
				t.Errorf("%s: the server replayed the charged key of %d of %d killed payments (%d kills), want all",
					f, res.KilledResent, res.Killed, res.Crashes)
			}
		default:
			// A restart alone causes them: there are no other faults.
			if res.RestartDuplicates != res.Crashes || res.Duplicates != res.Crashes {
				t.Errorf("%s: %d duplicates (%d at restarts), want one per restart (%d)",
					f, res.Duplicates, res.RestartDuplicates, res.Crashes)
			}
		}
	}
}

// In the storm (lost answers, slow charges past the client's timeout, an
// outage, a capacity limit) a key per action is what prevents duplicates.
func TestStormKeysPreventDuplicates(t *testing.T) {
	root := t.TempDir()
	cfg := StormConfig(7)
	cfg.DropRate, cfg.SlowRate = 0.1, 0.1 // enough faulted intents in a small run
	for _, f := range []Flavour{Naive, KeyPerAttempt, MemoryKey, FileJournal} {
		keyed := f == MemoryKey || f == FileJournal // one key per action
		res := play(t, small(cfg, f, root+"/"+f.String()))
		if keyed && res.Duplicates != 0 {
			t.Errorf("%s: %d duplicates, want 0", f, res.Duplicates)
		}
		if !keyed && res.Duplicates == 0 {
			t.Errorf("%s: no duplicates, want some: answers were lost after commit", f)
		}
		if res.Status[503] == 0 || res.Late == 0 {
			t.Errorf("%s: faults did not show: %d 503s, %d late answers", f, res.Status[503], res.Late)
		}
	}
}

func TestClockScalesTimers(t *testing.T) {
	clk := NewClock(100)
	start, vstart := time.Now(), clk.Now()
	tm := clk.NewTimer()
	tm.Start(2 * time.Second)
	<-tm.C()
	tm.Stop()
	if real := time.Since(start); real < 15*time.Millisecond || real > time.Second {
		t.Errorf("a 2 s virtual wait took %v of wall time, want about 20 ms", real)
	}
	if v := clk.Now().Sub(vstart); v < 2*time.Second {
		t.Errorf("virtual time advanced %v during a 2 s wait", v)
	}
}

// Same seed, same duplicates: the crashes are chosen by the seed and fire
// at a commit, not at a time.
func TestRestartPhaseIsDeterministic(t *testing.T) {
	var got [2]*Result
	for i := range got {
		got[i] = play(t, small(RestartConfig(11), MemoryKey, ""))
	}
	a, b := got[0], got[1]
	if a.Duplicates != b.Duplicates || a.Extra != b.Extra || a.Crashes != b.Crashes || a.RestartDuplicates != b.RestartDuplicates {
		t.Errorf("same seed, different duplicates: %+v vs %+v", a, b)
	}
}
