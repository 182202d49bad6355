package idemretry

import "github.com/idemretry/idemretry/journal"

// MakesKeyedFingerprints reports whether t gives a named action's large
// body a keyed fingerprint: its journal keeps a secret, AES-GCM is allowed
// (not GODEBUG=fips140=only) and the CPU runs it in hardware. Elsewhere the
// keyed-form tests expect the plain form.
func MakesKeyedFingerprints(t *Transport) bool { return keyedHardware && t.fpKey.ok }

// JournalMakesKeyedFingerprints is MakesKeyedFingerprints of a Transport
// over j, without one.
func JournalMakesKeyedFingerprints(j journal.Journal) bool {
	k := fingerprintKey(j)
	return keyedHardware && k.ok
}

// FingerprintAESKey is the AES key t's keyed fingerprints are made with,
// derived from its journal's secret: what a forger would need.
func FingerprintAESKey(t *Transport) [16]byte { return t.fpKey.aes }

// KeyedMinBody is the least body a named action's keyed fingerprint is
// made for.
const KeyedMinBody = keyedMinBody

// FlightJoiners is how many callers wait in the flights of t's actions in
// the air: a test knows from it that a request has joined a flight.
func FlightJoiners(t *Transport) int {
	t.flights.mu.Lock()
	defer t.flights.mu.Unlock()
	n := 0
	for _, f := range t.flights.m {
		n += f.joiners
	}
	return n
}
