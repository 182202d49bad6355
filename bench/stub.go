package bench

import (
	"io"
	"net/http"
)

// stub is a base RoundTripper that reads the body and answers 201, or, when
// flaky, 503 and 201 in turn. It is for one goroutine at a time.
type stub struct {
	flaky, failed bool
	// copyBody: read the body into a buffer, as a connection's write would
	// copy it, rather than hand it to io.Discard (which a bytes.Reader
	// skips without touching a byte).
	copyBody bool
	buf      []byte
}

func (s *stub) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		if s.copyBody {
			if s.buf == nil {
				s.buf = make([]byte, 32<<10)
			}
			for {
				if _, err := r.Body.Read(s.buf); err != nil {
					break
				}
			}
		} else {
			io.Copy(io.Discard, r.Body)
		}
		r.Body.Close()
	}
	status := http.StatusCreated
	if s.flaky {
		if s.failed = !s.failed; s.failed {
			status = http.StatusServiceUnavailable
		}
	}
	return &http.Response{StatusCode: status, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{}, Body: http.NoBody, ContentLength: 0, Request: r}, nil
}
