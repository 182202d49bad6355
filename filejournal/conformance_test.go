package filejournal

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry/journal/journaltest"
)

func TestJournalConformanceFile(t *testing.T) {
	t.Parallel()
	journaltest.Run(t, func(t *testing.T) journal.Journal {
		j, err := Open(t.TempDir())
		require.NoError(t, err)
		return j
	}, journaltest.Corrupt(appendRecord))
}

func TestJournalConformanceFileHashed(t *testing.T) {
	t.Parallel()
	journaltest.Run(t, func(t *testing.T) journal.Journal {
		j, err := Open(t.TempDir(), WithHashedIDs())
		require.NoError(t, err)
		return j
	}, journaltest.ReportedIDs(func(id string) string {
		sum := sha256.Sum256([]byte(id))
		return "sha256:" + hex.EncodeToString(sum[:])
	}), journaltest.Corrupt(appendRecord))
}

// appendRecord is journaltest's Corrupt for the file journal: it closes j,
// writes want as it is into j's file as the frame after the last, through
// the format's own encoder (what a writer that skipped journal.CheckRecord
// would leave: its CRC holds), and opens the journal again. A field the
// format cannot hold (attempts or status past its width, a key over 255
// bytes) skips the case.
func appendRecord(t *testing.T, jr journal.Journal, want journal.Record) (journal.Journal, error) {
	t.Helper()
	j := jr.(*Journal)
	if want.Attempts < 0 || int64(want.Attempts) > math.MaxUint32 || want.Status < 0 || want.Status > math.MaxUint16 || len(want.Key) > 255 {
		t.Skipf("the format cannot hold %+v", want)
	}
	r := rec{id: j.storedID(want.ActionID), fp: want.Fingerprint, created: want.CreatedAt.UnixMilli(), attempts: uint32(want.Attempts),
		status: uint16(want.Status), state: want.State, form: want.KeyForm, seen: time.Now().UnixMilli()}
	if !parseUUID(want.Key, &r.key) {
		r.custom = want.Key
	}
	if want.Key == "" {
		r.custom = "!" // the encoder writes no empty key: it is cut out of the payload below
	}
	dir, opts := j.Dir(), j.opts
	require.NoError(t, j.Close())
	path := filepath.Join(dir, journalName)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	h, err := parseHeader(data)
	require.NoError(t, err)
	offs := frameOffsets(t, data)
	require.NotEmpty(t, offs)
	last, _, _, ok := frameAt(data, offs[len(offs)-1], h.gen)
	require.True(t, ok)
	payload := appendPayload(nil, []op{{kind: opUpsert, r: r}})
	if want.Key == "" {
		at := 3 + uvarintLen(uint64(len(r.id))) + len(r.id) // count, kind, flags, the id: then the key's length and bytes
		require.Equal(t, []byte{1, '!'}, payload[at:at+2])
		payload = append(append(payload[:at:at], 0), payload[at+2:]...)
	}
	data = appendFrame(data, h.gen, last+1, payload)
	require.NoError(t, os.WriteFile(path, data, 0o600))
	j2, err := open(dir, opts)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { j2.Close() })
	return j2, nil
}
