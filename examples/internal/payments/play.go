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
	return playWhileDisturbed(ctx, func(play int) (*Result, error) {
		if base != "" && play > 1 {
			cfg.JournalDir = base + "-replay" + string(rune('0'+play))
			os.RemoveAll(cfg.JournalDir)
		}
		res, err := Run(ctx, cfg)
		if err == nil {
			res.Plays = play
		}
		return res, err
	})
}

// playWhileDisturbed calls run with the play's number, from 1, and again while the
// machine disturbed the play, up to MaxPlays in all or until ctx ends. It
// returns the last play, or the first error.
func playWhileDisturbed[R interface{ Disturbed() bool }](ctx context.Context, run func(play int) (R, error)) (R, error) {
	for play := 1; ; play++ {
		res, err := run(play)
		if err != nil || !res.Disturbed() || play >= MaxPlays || ctx.Err() != nil {
			return res, err
		}
	}
}
