package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/idemretry/idemretry/internal/datasync"
)

// ProbeBytes is what one probe write appends: about one file-journal frame
// holding one new record.
const ProbeBytes = 100

// Probe measures the floor under every durable journal write: append
// ProbeBytes to a file and fdatasync it (File.Sync where there is no
// fdatasync; see datasync). It is what the file journal cannot beat for one
// new action on one goroutine, so goal 2 (README.md) bounds the file journal's
// time per action by one probe, plus net/http's request, plus 30 µs. Run it
// in the directory (the file system) the journal uses, interleaved with the
// journal's own measurement, so that both see the same disk.
type Probe struct {
	mu  sync.Mutex // one write+sync at a time: the probe is of one writer
	f   *os.File
	buf []byte
}

// NewProbe creates the probe's file in dir.
func NewProbe(dir string) (*Probe, error) {
	f, err := os.OpenFile(filepath.Join(dir, "probe"), os.O_WRONLY|os.O_CREATE|os.O_APPEND|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("probe: %w", err)
	}
	buf := make([]byte, ProbeBytes)
	for i := range buf {
		buf[i] = byte('a' + i%26)
	}
	return &Probe{f: f, buf: buf}, nil
}

// Sync appends ProbeBytes and waits until they are on disk.
func (p *Probe) Sync() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := p.f.Write(p.buf); err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	if err := datasync.File(p.f); err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	return nil
}

// Close closes the probe's file (it stays in its directory).
func (p *Probe) Close() error { return p.f.Close() }
