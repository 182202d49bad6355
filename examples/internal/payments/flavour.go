package payments

import (
	"fmt"
	"strconv"
	"strings"
)

// Flavour is how a client handles Idempotency-Keys.
type Flavour int

const (
	// Naive retries with no key at all, on the endpoint that allows it.
	Naive Flavour = iota + 1
	// KeyPerAttempt sends a key, but a new one on every attempt: the common
	// mistake payment guides warn about. The server cannot tell retries apart.
	KeyPerAttempt
	// MemoryKey keeps one key per action in memory (idemretry with
	// NewMemoryJournal): what today's SDKs do. The key dies with the process.
	MemoryKey
	// FileJournal is idemretry with its file journal: the key survives a
	// restart.
	FileJournal
)

// Flavours lists every flavour in order.
var Flavours = []Flavour{Naive, KeyPerAttempt, MemoryKey, FileJournal}

func (f Flavour) String() string {
	switch f {
	case Naive:
		return "1 no key"
	case KeyPerAttempt:
		return "2 key per attempt"
	case MemoryKey:
		return "3 key in memory"
	case FileJournal:
		return "4 idemretry+journal"
	}
	return "Flavour(" + strconv.Itoa(int(f)) + ")"
}

// ParseFlavours reads a comma-separated list of flavour numbers, or "all".
func ParseFlavours(list string) ([]Flavour, error) {
	if strings.EqualFold(strings.TrimSpace(list), "all") {
		return Flavours, nil
	}
	var out []Flavour
	for _, s := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < int(Naive) || n > int(FileJournal) {
			return nil, fmt.Errorf("unknown flavour %q (want 1-4)", s)
		}
		out = append(out, Flavour(n))
	}
	return out, nil
}
