package sqljournal

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/idemretry/idemretry/journal"
)

// checkID refuses an action id, as the table would hold it (its digest
// form when ids are hashed), that the table cannot hold: one outside
// journal.CheckRecord's 1 to journal.MaxActionID bytes, and what
// PostgreSQL text adds to that rule: no NUL byte, valid UTF-8. Hashed ids
// always pass. The rest of a record is judged by journal.CheckRecord and
// journal.CheckProgress.
func checkID(id string) error {
	switch {
	case id == "" || len(id) > journal.MaxActionID:
		return fmt.Errorf("%w: action id of %d bytes (1-%d allowed)", journal.ErrInvalidRecord, len(id), journal.MaxActionID)
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: action id is not valid UTF-8", journal.ErrInvalidRecord)
	case strings.IndexByte(id, 0) >= 0:
		return fmt.Errorf("%w: action id holds a NUL byte", journal.ErrInvalidRecord)
	}
	return nil
}
