package payments

import (
	"fmt"
	"time"
)

// Intent is one payment a client means to make exactly once.
type Intent struct {
	ID     string
	Client int
	Amount int
	body   []byte // the same bytes on every attempt and every restart

	// Filled in by the client that owns it.
	start   time.Time // first attempt began (virtual)
	end     time.Time // succeeded or gave up (virtual)
	ok      bool
	crashed bool // its client was killed during it
}

func newIntent(client, index int) *Intent {
	id := fmt.Sprintf("pi_%03d_%02d", client, index)
	amount := 1000 + 10*index
	return &Intent{
		ID: id, Client: client, Amount: amount,
		body: fmt.Appendf(nil, `{"intent":%q,"amount":%d,"currency":"eur"}`, id, amount),
	}
}

// actionID is the idemretry action of an intent: one per thing the user
// meant to do once.
func (in *Intent) actionID() string { return "pay:" + in.ID }
