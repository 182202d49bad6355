package idemretry

import (
	"context"
	"net/http"

	"github.com/idemretry/idemretry/journal"
)

// Client is an [*http.Client] whose Transport is an idemretry [*Transport].
// Use it as any *http.Client. Its Transport field may be wrapped (for
// tracing, say): [Client.Close] still releases the idemretry Transport
// underneath. Close the Client when done to release its journal.
type Client struct {
	*http.Client
	transport *Transport
}

// NewClient returns a Client that sends through its own clone of
// [http.DefaultTransport] with the given options. The returned Client is
// safe for concurrent use.
//
// Unless [WithJournal] gives a journal, NewClient opens the default file
// journal (see [NewTransport]). One Client at a time may hold it, in this
// process or any other. A second NewClient on the same directory fails with
// an error wrapping [filejournal.ErrLocked], and so does a second replica
// of the same program on the same host. Make one Client per process and
// share it between the providers it pays, with action ids of each
// provider's own. Or give each Client, and each replica, a directory of its
// own with [WithJournalDir].
func NewClient(opts ...Option) (*Client, error) {
	t, err := NewTransport(nil, opts...)
	if err != nil {
		return nil, err
	}
	return &Client{Client: &http.Client{Transport: t}, transport: t}, nil
}

// Journal returns the journal that holds the Client's keys.
func (c *Client) Journal() journal.Journal { return c.transport.Journal() }

// Resume resends, through the Client's Transport, the actions a previous
// run left unfinished. It hands the outcome-unknown ones to r.Resolve. See
// [Transport.Resume]. Call it at start-up.
func (c *Client) Resume(ctx context.Context, r Resumer, concurrency int) ([]ResumeResult, error) {
	return c.transport.Resume(ctx, r, concurrency)
}

// Stats returns the counters of the Client's Transport (see
// [Transport.Stats]).
func (c *Client) Stats() Stats { return c.transport.Stats() }

// Close releases the Client's journal (if it opened it) and idle
// connections. Do not use the Client after Close.
func (c *Client) Close() error { return c.transport.Close() }
