package sim

import (
	"io"
	"sync/atomic"
)

// trackedBody is a request body that counts its Close: a RoundTripper
// closes the request body, also when it sends nothing.
type trackedBody struct {
	data   []byte
	off    int
	closed atomic.Bool
}

func (b *trackedBody) Read(p []byte) (int, error) {
	if b.off >= len(b.data) {
		return 0, io.EOF
	}
	n := copy(p, b.data[b.off:])
	b.off += n
	return n, nil
}

func (b *trackedBody) Close() error {
	b.closed.Store(true)
	return nil
}
