package filejournal

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// T7/T9, for compaction: at each step, build the directory images a power
// loss could leave (unsynced file data dropped or torn; a rename not yet
// made durable by the directory sync showing the old name or the new one)
// and check that every image recovers every acknowledged record.
func TestCompactionPowerLossImages(t *testing.T) {
	dir := t.TempDir()
	type image map[string][]byte // file name -> content; absent: no file
	var images []struct {
		name string
		img  image
	}
	add := func(name string, img image) {
		images = append(images, struct {
			name string
			img  image
		}{name, img})
	}
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		return b
	}
	var oldJournal []byte
	armed := false // not for the creation of the journal in Open
	o := testOpts()
	o.hooks = &hooks{failpoint: func(fp string) {
		if !armed {
			return
		}
		switch fp {
		case fpTmpWritten: // tmp not synced: any prefix of it may be there
			oldJournal = read(journalName)
			tmp := read(tmpName)
			for _, n := range []int{0, headerSize - 1, headerSize + 7, len(tmp) / 2, len(tmp) - 1} {
				add(fmt.Sprintf("tmp torn at %d", n), image{journalName: oldJournal, tmpName: tmp[:n]})
			}
			add("tmp lost", image{journalName: oldJournal})
		case fpTmpSynced:
			add("tmp synced", image{journalName: oldJournal, tmpName: read(tmpName)})
		case fpRenamed: // the rename may not be durable yet
			nj := read(journalName)
			add("renamed, old entry", image{journalName: oldJournal, tmpName: nj})
			add("renamed, new entry", image{journalName: nj})
		case fpDirSynced:
			add("dir synced", image{journalName: read(journalName)})
		}
	}}
	s, _ := mustOpen(t, dir, o)
	var acked []journal.Record
	for i := range 30 {
		acked = append(acked, reserve(t, s, entry(fmt.Sprintf("a%02d", i))))
	}
	for i := range 10 {
		require.NoError(t, s.Forget(context.Background(), acked[i].ActionID))
	}
	acked = acked[10:]
	armed = true
	require.NoError(t, s.Compact(context.Background()))
	require.NoError(t, s.Close())
	require.Len(t, images, 10)

	for _, im := range images {
		t.Run(im.name, func(t *testing.T) {
			d := t.TempDir()
			for name, data := range im.img {
				require.NoError(t, os.WriteFile(filepath.Join(d, name), data, 0o600))
			}
			s, rep, err := openWith(d, testOpts())
			require.NoError(t, err)
			defer s.Close()
			assert.Equal(t, len(acked), rep.Records)
			for _, e := range acked {
				got, ok, _ := s.get(e.ActionID)
				if assert.True(t, ok, e.ActionID) {
					assert.Equal(t, e.Key, got.Key)
				}
			}
			_, err = os.Stat(filepath.Join(d, tmpName))
			assert.ErrorIs(t, err, os.ErrNotExist)
		})
	}
}

// T7, for appends: a power loss while a batch is written but not synced
// may leave any prefix of it, or its pages with holes of zeros; recovery
// must keep every acknowledged record and reject nothing.
func TestAppendPowerLossImages(t *testing.T) {
	dir := t.TempDir()
	var synced []byte // the file as of the last sync
	var images [][]byte
	armed := false
	o := testOpts()
	o.hooks = &hooks{failpoint: func(fp string) {
		data, err := os.ReadFile(filepath.Join(dir, journalName))
		if err != nil {
			return
		}
		switch fp {
		case fpAfterSync:
			synced = data
		case fpAfterWrite:
			if !armed || synced == nil {
				return
			}
			un := data[len(synced):]
			for _, n := range []int{1, 15, 16, len(un) / 2, len(un) - 1} {
				images = append(images, append(append([]byte(nil), synced...), un[:n]...))
			}
			holed := append([]byte(nil), data...)
			for i := len(synced) + 4; i < len(synced)+12 && i < len(holed); i++ {
				holed[i] = 0
			}
			images = append(images, holed)
		}
	}}
	s, _ := mustOpen(t, dir, o)
	var acked []journal.Record
	for i := range 5 {
		acked = append(acked, reserve(t, s, entry(fmt.Sprintf("a%d", i))))
	}
	armed = true
	_ = reserve(t, s, entry("in-flight")) // its write is what the images tear
	require.NoError(t, s.Close())
	require.NotEmpty(t, images)
	for i, img := range images {
		d := writeJournal(t, img)
		s, rep, err := openWith(d, testOpts())
		require.NoError(t, err, "image %d", i)
		assert.True(t, rep.TornTail, "image %d", i)
		for _, e := range acked {
			got, ok, _ := s.get(e.ActionID)
			if assert.True(t, ok, "image %d: %s", i, e.ActionID) {
				assert.Equal(t, e.Key, got.Key)
			}
		}
		require.NoError(t, s.Close())
	}
}
