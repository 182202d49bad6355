// Package idemretry makes "send it again" safe for payment-style HTTP
// requests.
//
// A customer taps "Pay" twice; a phone loses signal after the server charged
// the card but before the answer came back; an app is killed mid-request. In
// each case the client must send the request again and the server must
// perform it once. idemretry is the client half of the Idempotency-Key
// protocol, as an http.RoundTripper: every logical action gets one UUIDv4 key,
// written durably to a journal before the first attempt leaves the process,
// and every retry — in another goroutine, or after a restart — carries the
// same key. Retries use full-jitter exponential backoff, honour Retry-After up
// to a cap, never start a wait that would end after the context's deadline,
// and stop before the server forgets the key (the key window).
//
// Use it as an *http.Client:
//
//	client, err := idemretry.NewClient()
//	if err != nil { ... }
//	defer client.Close()
//	ctx = idemretry.WithAction(ctx, "pay:order-A-1001")
//	req, _ := http.NewRequestWithContext(ctx, "POST", url, body)
//	resp, err := client.Do(req)
//
// or as the Transport of a client you already have (NewTransport). At
// start-up, journal.Journal.Unfinished lists the actions to resume or reconcile.
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
