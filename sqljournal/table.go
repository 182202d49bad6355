package sqljournal

import (
	"fmt"
	"hash/fnv"
	"strings"
)

// maxIdentLen leaves room under PostgreSQL's 63-byte identifier limit for
// the index names derived from the table's name ("_unfinished_idx"): a
// longer name would be truncated silently and two tables could then share
// an index name.
const maxIdentLen = 48

// table is a validated table name, ready to be put into SQL text.
type table struct {
	quoted string // "schema"."name" or "name"
	name   string // the unqualified name, for index names
}

// parseTable checks name against the rule documented on WithTable. Only
// names that pass it ever reach SQL text, and they are quoted as well.
func parseTable(name string) (table, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return table{}, fmt.Errorf("sqljournal: table name %q: more than one dot: %w", name, ErrInvalidOption)
	}
	for _, p := range parts {
		if !validIdent(p) {
			return table{}, fmt.Errorf("sqljournal: table name %q: want 1 to %d letters, digits or underscores, not starting with a digit: %w",
				name, maxIdentLen, ErrInvalidOption)
		}
	}
	q := make([]string, len(parts))
	for i, p := range parts {
		q[i] = `"` + p + `"`
	}
	return table{quoted: strings.Join(q, "."), name: parts[len(parts)-1]}, nil
}

func validIdent(s string) bool {
	if s == "" || len(s) > maxIdentLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// index returns the quoted name of one of the table's indexes. CREATE INDEX
// takes an unqualified name: the index lives in the table's schema.
func (t table) index(suffix string) string { return `"` + t.name + suffix + `"` }

// lockKey is the advisory-lock key that serialises schema creation for this
// table across processes.
func (t table) lockKey() int64 {
	h := fnv.New64a()
	h.Write([]byte("idemretry/sqljournal " + t.quoted))
	return int64(h.Sum64())
}
