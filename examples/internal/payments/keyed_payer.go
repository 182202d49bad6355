package payments

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/idemretry/idemretry/journal"

	"github.com/cenkalti/backoff/v4"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/filejournal"
)

// keyedPayer is flavours 3 and 4: the idemretry Transport, one action per
// intent. They differ only in the journal: memory (3) or file (4).
type keyedPayer struct {
	base      *http.Transport
	transport *idemretry.Transport
	client    *http.Client
	memory    *journal.Memory      // flavour 3 only
	file      *filejournal.Journal // flavour 4 with a wrapped journal only
	url, name string
}

// newKeyedPayer starts one client process. For FileJournal, dir is the
// process's journal directory, the same across its restarts. wrap, if not
// nil, stands between the Transport and its journal (see Config.WrapJournal).
// A nil s.New keeps the Transport's default backoff; extra options come
// after the payer's own.
func newKeyedPayer(f Flavour, url, name, dir string, s Strategy, r idemretry.Random, clk *Clock, attemptTimeout time.Duration, wrap func(journal.Journal) journal.Journal, extra ...idemretry.Option) (*keyedPayer, error) {
	return newKeyedPayerOn(newBase(clk, attemptTimeout), f, url, name, dir, s, r, clk, wrap, extra...)
}

// newKeyedPayerOn is newKeyedPayer over a given base transport.
func newKeyedPayerOn(base *http.Transport, f Flavour, url, name, dir string, s Strategy, r idemretry.Random, clk *Clock, wrap func(journal.Journal) journal.Journal, extra ...idemretry.Option) (*keyedPayer, error) {
	p := &keyedPayer{base: base, url: url + ChargesPath, name: name}
	opts := []idemretry.Option{idemretry.WithClock(clk)}
	if s.New != nil {
		opts = append(opts, idemretry.WithBackOff(func() backoff.BackOff { return s.New(r) }))
	}
	switch {
	case f == MemoryKey:
		p.memory = journal.NewMemory()
		var j journal.Journal = p.memory
		if wrap != nil {
			j = wrap(j)
		}
		opts = append(opts, idemretry.WithJournal(j))
	case wrap == nil:
		// The Transport opens and owns the file journal; its expiry runs on
		// the same virtual clock as the keys' creation times.
		opts = append(opts, idemretry.WithJournalDir(dir, filejournal.WithClock(clk.Now)))
	default:
		// The same journal, opened here so that it can be wrapped; the
		// payer then owns it.
		fj, err := filejournal.Open(dir, filejournal.WithClock(clk.Now))
		if err != nil {
			return nil, err
		}
		p.file = fj
		opts = append(opts, idemretry.WithJournal(wrap(fj)))
	}
	t, err := idemretry.NewTransport(p.base, append(opts, extra...)...)
	if err != nil {
		if p.file != nil {
			p.file.Close()
		}
		return nil, err
	}
	p.transport, p.client = t, &http.Client{Transport: t}
	return p, nil
}

func (p *keyedPayer) pay(ctx context.Context, in *Intent) bool {
	ok, _ := p.payErr(ctx, in)
	return ok
}

// payErr is pay, with the error RoundTrip returned (an *idemretry.ActionError
// when the retries stopped without an answer: parked, say).
func (p *keyedPayer) payErr(ctx context.Context, in *Intent) (bool, error) {
	ctx = idemretry.WithAction(ctx, in.actionID())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url, bytes.NewReader(in.body))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(ClientHeader, p.name)
	resp, err := p.client.Do(req)
	ok := success(resp, err)
	drain(resp)
	return ok, err
}

// unfinished lists the actions the journal still holds as pending: after a
// restart, what the process must resume.
func (p *keyedPayer) unfinished(ctx context.Context) ([]journal.Record, error) {
	return p.transport.Journal().Unfinished(ctx)
}

// crash lets go of everything without marking any action done. The file
// journal is closed because a dying process releases its lock; the memory
// journal simply vanishes with the process.
func (p *keyedPayer) crash() {
	p.transport.Close()
	if p.file != nil {
		p.file.Close()
	}
	p.base.CloseIdleConnections()
}

func (p *keyedPayer) close() error {
	err := p.transport.Close()
	if p.memory != nil {
		p.memory.Close()
	}
	if p.file != nil {
		err = errors.Join(err, p.file.Close())
	}
	p.base.CloseIdleConnections()
	return err
}
