package sqljournal

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/idemretry/idemretry/journal"
)

// The parsers of outside input in this package, each checked against a
// reference written another way (a regular expression, the hash itself),
// with the properties the rest of the package relies on. Run one with
//
//	go test -run '^$' -fuzz FuzzTableName -fuzztime 30s

// tableRE is WithTable's documented rule.
var tableRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,47}(\.[A-Za-z_][A-Za-z0-9_]{0,47})?$`)

// FuzzTableName: parseTable accepts exactly the documented names, and what
// it puts into SQL is the name quoted, part by part, with nothing else.
func FuzzTableName(f *testing.F) {
	for _, s := range []string{DefaultTable, "payments.keys", "Keys", "_x", "a.b.c", "", ".", "a.", `a"b`, `a"."b`,
		"1a", "é", strings.Repeat("a", 48), strings.Repeat("a", 49), "a\x00", "a;drop table x", "a b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		tb, err := parseTable(name)
		if want := tableRE.MatchString(name); (err == nil) != want {
			t.Fatalf("parseTable(%q): %v, want accepted = %v", name, err, want)
		}
		if err != nil {
			if !errors.Is(err, ErrInvalidOption) || !strings.HasPrefix(err.Error(), "sqljournal: ") {
				t.Fatalf("parseTable(%q): %v, want an ErrInvalidOption with the package's prefix", name, err)
			}
			if tb != (table{}) {
				t.Fatalf("parseTable(%q) failed but returned %+v", name, tb)
			}
			return
		}
		parts := strings.Split(name, ".")
		quoted := make([]string, len(parts))
		for i, p := range parts {
			quoted[i] = `"` + p + `"`
		}
		if tb.quoted != strings.Join(quoted, ".") || tb.name != parts[len(parts)-1] {
			t.Fatalf("parseTable(%q) = %+v", name, tb)
		}
		// The names that reach SQL text: quoted identifiers of safe bytes,
		// within PostgreSQL's 63-byte limit (else it truncates silently).
		for _, ident := range []string{tb.quoted, tb.index("_unfinished_idx"), tb.index("_done_idx")} {
			for _, part := range strings.Split(ident, ".") {
				inner, ok := strings.CutPrefix(part, `"`)
				inner, ok2 := strings.CutSuffix(inner, `"`)
				if !ok || !ok2 || strings.ContainsAny(inner, `"`) || len(inner) > 63 {
					t.Fatalf("parseTable(%q): identifier %s", name, ident)
				}
			}
		}
		again, _ := parseTable(name)
		if again.lockKey() != tb.lockKey() {
			t.Fatalf("parseTable(%q): lock key not deterministic", name)
		}
	})
}

// digestRE is the digest form of a stored action id.
var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// FuzzActionID: with hashing, every id is stored as its digest form, which
// the table can hold, and an id already in that form (as Unfinished
// returns it) is stored as itself, so resuming a listed record reaches the
// same row; without hashing, ids are stored as given. The table's id mode
// is judged from such ids as the journal would have written them.
func FuzzActionID(f *testing.F) {
	sum := sha256.Sum256([]byte("pay:1"))
	for _, s := range []string{"pay:1", "", "sha256:", "sha256:" + hex.EncodeToString(sum[:]),
		"sha256:" + strings.ToUpper(hex.EncodeToString(sum[:])), "sha256:" + hex.EncodeToString(sum[:]) + "0",
		"SHA256:" + hex.EncodeToString(sum[:]), "pay:\x00", "\xff", "fp:" + hex.EncodeToString(sum[:])} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, id string, hashed bool) {
		if got, want := journal.IsDigest(id), digestRE.MatchString(id); got != want {
			t.Fatalf("journal.IsDigest(%q) = %v, want %v", id, got, want)
		}
		j := &Journal{cfg: config{hashIDs: hashed}}
		stored := j.storedID(id)
		if !hashed {
			if stored != id {
				t.Fatalf("plain storedID(%q) = %q", id, stored)
			}
			if mode := modeOfIDs([]string{stored}); id != "" && !journal.IsDigest(id) && mode != modePlain {
				t.Fatalf("a plain id %q judged %s", id, mode)
			}
			return
		}
		want := id
		if !digestRE.MatchString(id) {
			s := sha256.Sum256([]byte(id))
			want = "sha256:" + hex.EncodeToString(s[:])
		}
		if stored != want {
			t.Fatalf("hashed storedID(%q) = %q, want %q", id, stored, want)
		}
		if again := j.storedID(stored); again != stored {
			t.Fatalf("hashed storedID of the stored form %q = %q: a listed record would not resolve", stored, again)
		}
		if err := checkID(stored); err != nil {
			t.Fatalf("hashed id %q refused: %v", id, err)
		}
		if mode := modeOfIDs([]string{stored, j.storedID(id + "x")}); mode != modeSHA256 {
			t.Fatalf("hashed ids judged %s", mode)
		}
	})
}

// FuzzMark: a table's comment yields a mode only from a mark line with a
// known mode; a mark line this version does not know, or two that
// disagree, refuse the table (journal.ErrIncompatible) instead of guessing;
// a comment without a mark records nothing; and the mark Open writes reads
// back, alone or after someone's comment.
func FuzzMark(f *testing.F) {
	for _, s := range []string{"", markComment(modePlain), markComment(modeSHA256), "keys for payments",
		markPrefix, markPrefix + "sha512", " " + markComment(modeSHA256) + " \r",
		markComment(modePlain) + "\n" + markComment(modeSHA256), "x\n" + markComment(modePlain) + "\ny",
		"# " + markComment(modePlain)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, comment string) {
		mode, found, err := parseMark(comment)
		switch {
		case err != nil:
			if !errors.Is(err, journal.ErrIncompatible) || found || mode != "" {
				t.Fatalf("parseMark(%q) = %q, %v, %v", comment, mode, found, err)
			}
		case found:
			if (mode != modePlain && mode != modeSHA256) || !strings.Contains(comment, markPrefix+mode) {
				t.Fatalf("parseMark(%q) = %q", comment, mode)
			}
		case mode != "":
			t.Fatalf("parseMark(%q) = %q, not found", comment, mode)
		}
		if !strings.Contains(comment, markPrefix) {
			if found || err != nil {
				t.Fatalf("parseMark(%q) without a mark: %q, %v, %v", comment, mode, found, err)
			}
			for _, want := range []string{modePlain, modeSHA256} {
				if m, ok, err := parseMark(comment + "\n" + markComment(want)); m != want || !ok || err != nil {
					t.Fatalf("mark %s after %q read as %q, %v, %v", want, comment, m, ok, err)
				}
			}
		}
		for _, want := range []string{modePlain, modeSHA256} {
			if m, ok, err := parseMark(markComment(want)); m != want || !ok || err != nil {
				t.Fatalf("mark %s read as %q, %v, %v", want, m, ok, err)
			}
		}
	})
}
