// Package payments is the simulation's `payments` scenario: a payment server
// with Stripe's idempotency semantics on real HTTP over loopback, four kinds
// of client that differ only in how they handle Idempotency-Keys, and the
// faults and restarts that tell them apart.
//
// Everything runs on a scaled clock (see Clock): the server, the clients and
// the idemretry Transport all read virtual time that runs Scale times faster
// than the wall clock, so the library's real defaults (0.5 s base, 8 s cap,
// 5 retries) play out in a fraction of a second. Every duration this package
// reports is virtual time.
package payments
