// Package brokenrand replaces crypto/rand.Reader, in its init, with a
// Reader that always fails, as a program (or a test helper it imports) may
// do before idemretry is initialised. It exists for the test beside it.
package brokenrand

import (
	"crypto/rand"
	"errors"
)

// ErrNoEntropy is what the Reader returns.
var ErrNoEntropy = errors.New("brokenrand: no entropy")

type failing struct{}

func (failing) Read([]byte) (int, error) { return 0, ErrNoEntropy }

func init() { rand.Reader = failing{} }
