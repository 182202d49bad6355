// Package sim is idemretry's lifecycle simulator: it generates histories of
// what apps, servers, disks, clocks and networks do, runs each against the
// real Transport and journals, and checks it against a model of what the
// user meant. Its anchors are FoundationDB's simulation testing, TigerBeetle's
// VOPR and Jepsen's checkers. TestLifecycle runs it; docs/simulation.md says
// how to read, replay and extend it.
//
// # What a history is
//
// A history is a seed, a configuration drawn from it (the journal: memory,
// the file journal on a temporary directory, or PostgreSQL when
// IDEMRETRY_PG_DSN is set, with one or two machines on one table; the
// network: in memory, or real sockets over loopback; the Transport's first
// options; the weights of each fault) and a list of operations drawn from
// it: pay (named with WithAction, keyed with the app's own Idempotency-Key,
// or unnamed), with one caller or several at once (a double tap); send an
// unfinished intent again; repeat a finished payment deliberately; Resume,
// its Rebuilds perhaps paused; crash (the Transport dropped without Close,
// the journal reopened from what the process left on disk); restart with
// changed options; let time pass; set the wall clock; fail, slow or damage
// journal calls. Each operation draws its own cancellation: a deadline, a
// cancel, Request.Cancel, a deadline 292 years ahead. Each request of a
// call draws a fault from the seed, the call's number and the attempt's:
// refused, answer lost after the charge, body cut or stalled, a slow
// answer, 503/429 with and without Retry-After, retry hints, a held charge
// (409 meanwhile), the caller's cancel as it leaves or as its answer comes,
// a 101 Switching Protocols, a Retry-After of 292 years.
//
// # What is virtual and what is real
//
// Retry waits, Retry-After waits and the passing of time (key windows, the
// duplicate window, settle times, the server's key retention) run on a
// virtual clock (vclock): no real time passes. Context deadlines, cancels,
// stalls and slow answers, DefaultMaxDrainTime, DefaultMaxShareTime,
// OutcomeGrace, the journal timeout, lease polls and the file journal's
// syncs are real time, as they are for the Transport.
//
// # What is checked
//
// The checks map lists them, each with the guarantee it comes from. The
// model holds intents: which calls are one thing the user meant to do once.
// A call made while its intent is unfinished (no final answer learnt) is the
// same intent; a deliberate repeat of a finished unnamed payment is a new
// one. The checks then read the payment server's ledger, the network's log
// of every request, the Transport's events and the journal's calls.
package sim
