package sqljournal

import (
	"fmt"
	"math"
	"unicode/utf8"

	"github.com/idemretry/idemretry/journal"

	"github.com/idemretry/idemretry"
)

// checkID refuses a stored action id the table cannot hold as given:
// PostgreSQL text takes neither NUL bytes nor invalid UTF-8, and the file
// journal's length limit keeps ids portable between the two journals.
// Hashed ids always pass.
func checkID(id string) error {
	switch {
	case id == "" || len(id) > journal.MaxActionID:
		return fmt.Errorf("%w: action id of %d bytes (1-%d allowed)", journal.ErrInvalidRecord, len(id), journal.MaxActionID)
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: action id is not valid UTF-8", journal.ErrInvalidRecord)
	}
	for i := 0; i < len(id); i++ {
		if id[i] == 0 {
			return fmt.Errorf("%w: action id holds a NUL byte", journal.ErrInvalidRecord)
		}
	}
	return nil
}

// checkProgress refuses what Update stores and no Transport writes, before
// it reaches the table, so that readers never meet it.
func checkProgress(rec journal.Record) error {
	switch {
	case rec.State < journal.StatePending || rec.State > journal.StateUnknown:
		return fmt.Errorf("%w: state %d", journal.ErrInvalidRecord, rec.State)
	case rec.Attempts < 0 || rec.Attempts > math.MaxInt32:
		return fmt.Errorf("%w: attempts %d", journal.ErrInvalidRecord, rec.Attempts)
	case rec.Status < 0 || rec.Status > math.MaxInt32:
		return fmt.Errorf("%w: status %d", journal.ErrInvalidRecord, rec.Status)
	}
	return nil
}

// checkRecord adds the key's rule to checkProgress: 1 to 255 visible ASCII
// characters, which every UUID and every key a caller may set satisfy.
func checkRecord(rec journal.Record) error {
	k := rec.Key
	if k == "" || len(k) > idemretry.MaxKeyLength {
		return fmt.Errorf("%w: key of %d characters (1-%d allowed)", journal.ErrInvalidRecord, len(k), idemretry.MaxKeyLength)
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return fmt.Errorf("%w: key character %q at %d", journal.ErrInvalidRecord, k[i], i)
		}
	}
	return checkProgress(rec)
}
