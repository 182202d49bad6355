package payments

import (
	"context"
	"os"
	"time"
)

// MaxPlays bounds how often Play replays a run the machine stalled.
const MaxPlays = 3

// StallLimit is the longest machine stall, in virtual time, a run may
// suffer and still count: half the client's attempt timeout, so that a
// stall alone cannot time an attempt out.
func (c Config) StallLimit() time.Duration { return min(c.AttemptTimeout, 2*time.Second) / 2 }

// Disturbed reports whether the machine stalled the run for longer than
// its configuration's StallLimit.
func (r *Result) Disturbed() bool { return r.Stall > r.StallLimit }

// Play runs cfg, and runs it again (up to MaxPlays in all, with a fresh
// journal directory each time) while the machine stalls it past the
// limit. It returns the last play; Result.Plays says how many it took.
func Play(ctx context.Context, cfg Config) (*Result, error) {
	base := cfg.JournalDir
	for play := 1; ; play++ {
		if base != "" && play > 1 {
			cfg.JournalDir = base + "-replay" + string(rune('0'+play))
			os.RemoveAll(cfg.JournalDir)
		}
		res, err := Run(ctx, cfg)
		if err != nil {
			return nil, err
		}
		res.Plays = play
		if !res.Disturbed() || play >= MaxPlays || ctx.Err() != nil {
			return res, nil
		}
	}
}
