package sqljournal

import (
	"fmt"
	"strings"

	"github.com/idemretry/idemretry/journal"
)

// storedID is the action id as the table holds it: as given, or with
// WithHashedIDs its digest form (journal.Digest), which takes an id
// already in that form as it is, so that ids read back from Unfinished
// reach the same row.
func (j *Journal) storedID(id string) string {
	if j.cfg.hashIDs {
		return journal.Digest(id)
	}
	return id
}

// Id modes, as recorded in a table's comment.
const (
	modePlain  = "plain"
	modeSHA256 = "sha256"
	// markPrefix starts the line of a table's comment that records its id
	// mode: "idemretry.sqljournal.action_ids=plain" or "...=sha256".
	markPrefix = "idemretry.sqljournal.action_ids="
)

// idMode is the mode a journal with these options stores ids in.
func (c *config) idMode() string {
	if c.hashIDs {
		return modeSHA256
	}
	return modePlain
}

// markComment is the comment that records mode on a new table.
func markComment(mode string) string { return markPrefix + mode }

// parseMark finds the id mode recorded in a table's comment: a line that
// is markPrefix and a mode, alone but for surrounding blanks. A comment
// without such a line records nothing (found false). A mark line with a
// mode this version does not know, or two that disagree, is an error
// wrapping journal.ErrIncompatible: a newer version, or someone else, wrote
// it, and guessing could give an action two keys.
func parseMark(comment string) (mode string, found bool, err error) {
	for _, line := range strings.Split(comment, "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), markPrefix)
		if !ok {
			continue
		}
		if v != modePlain && v != modeSHA256 {
			return "", false, fmt.Errorf("%w: the table's comment records action ids of an unknown kind %q", journal.ErrIncompatible, v)
		}
		if found && v != mode {
			return "", false, fmt.Errorf("%w: the table's comment records two kinds of action ids, %s and %s", journal.ErrIncompatible, mode, v)
		}
		mode, found = v, true
	}
	return mode, found, nil
}

// modeOfIDs returns the mode stored ids show: plain if any is not in
// digest form (a hashing journal stores digests only), sha256 if all are,
// "" for none.
func modeOfIDs(ids []string) string {
	if len(ids) == 0 {
		return ""
	}
	for _, id := range ids {
		if !journal.IsDigest(id) {
			return modePlain
		}
	}
	return modeSHA256
}

// modeWords names a mode in an error message.
func modeWords(mode string) string {
	if mode == modeSHA256 {
		return "hashed (WithHashedIDs)"
	}
	return "plain"
}
