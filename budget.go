package idemretry

import "sync"

// Defaults of the retry budget (WithRetryBudget), after gRPC's retry
// throttling (10 tokens, ratio 0.1) and the SRE book's per-client budget of
// about 10 % of the load.
const (
	// DefaultBudgetTokens is the budget's capacity, and what it starts with:
	// how many retries a burst of failures may make before the budget
	// limits them.
	DefaultBudgetTokens = 10
	// DefaultBudgetRatio is what each first attempt puts back into the
	// budget: in a total outage, retries add at most this share (plus the
	// capacity) to the first attempts.
	DefaultBudgetRatio = 0.1
)

// budget is a Transport's retry budget: a token bucket that every first
// attempt fills by ratio, up to capacity, and every retry drains by one. A
// retry that finds less than one token is refused: its action is parked
// (ErrParked) with its key, to be resent later. Isolated failures find the
// bucket full and get every retry; a fleet in a total outage soon finds it
// empty and adds about ratio retries per first attempt. The zero budget
// (capacity 0) allows every retry.
type budget struct {
	capacity, ratio float64
	mu              sync.Mutex
	tokens          float64
}

func newBudget(capacity, ratio float64) *budget {
	return &budget{capacity: capacity, ratio: ratio, tokens: capacity}
}

// deposit credits one first attempt.
func (b *budget) deposit() {
	if b.capacity == 0 {
		return
	}
	b.mu.Lock()
	b.tokens = min(b.capacity, b.tokens+b.ratio)
	b.mu.Unlock()
}

// withdraw takes one retry's token, and reports whether there was one.
func (b *budget) withdraw() bool {
	if b.capacity == 0 {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
