package idemretry

// MakesKeyedFingerprints reports whether t gives a named action's large
// body a keyed fingerprint: its journal keeps a secret, AES-GCM is allowed
// (not GODEBUG=fips140=only) and the CPU runs it in hardware. Elsewhere the
// keyed-form tests expect the plain form.
func MakesKeyedFingerprints(t *Transport) bool { return keyedHardware && t.fpKey.ok }
