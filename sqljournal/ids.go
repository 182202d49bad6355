package sqljournal

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// digestPrefix marks a stored action id that is a SHA-256 digest.
const digestPrefix = "sha256:"

// storedID is the action id as the table holds it. With hashing, an id that
// already has the digest form is taken as is, so that ids read back from
// Unfinished can be passed to Forget; another id of that form is a SHA-256
// preimage, which nobody can make on purpose.
func (j *Journal) storedID(id string) string {
	if !j.cfg.hashIDs || isDigestID(id) {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return digestPrefix + hex.EncodeToString(sum[:])
}

func isDigestID(id string) bool {
	h, ok := strings.CutPrefix(id, digestPrefix)
	if !ok || len(h) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(h); i++ {
		if c := h[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
