package idemretry

import (
	"context"
	"net/http"

	"github.com/idemretry/idemretry/journal"
)

// Client is an *http.Client whose Transport is an idemretry *Transport. Use
// it as any *http.Client (its Transport field may be wrapped, for tracing
// say; Close still releases the idemretry Transport underneath); Close it
// when done to release its journal.
type Client struct {
	*http.Client
	transport *Transport
}

// NewClient returns a Client that sends through its own clone of
// http.DefaultTransport with the given options. The returned Client is safe
// for concurrent use.
//
// Unless WithJournal gives a journal, it opens the default file journal
// (see NewTransport), which one Client at a time may hold, in this process
// or any other: a second NewClient on the same directory fails with an
// error wrapping filejournal.ErrLocked, and so does a second replica of
// the same program on the same host. Make one Client per process and share
// it between the providers it pays (give each provider's actions ids of
// their own), or give each Client, and each replica, a directory of its own
// with WithJournalDir.
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
// run left unfinished, and hands the outcome-unknown ones to r.Resolve:
// see Transport.Resume. Call it at start-up.
func (c *Client) Resume(ctx context.Context, r Resumer, concurrency int) ([]ResumeResult, error) {
	return c.transport.Resume(ctx, r, concurrency)
}

// Stats returns the counters of the Client's Transport (see
// Transport.Stats).
func (c *Client) Stats() Stats { return c.transport.Stats() }

// Close releases the Client's journal (if it opened it) and idle
// connections. Do not use the Client after Close.
func (c *Client) Close() error { return c.transport.Close() }
