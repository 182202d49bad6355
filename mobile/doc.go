// Package idemretry (import path github.com/idemretry/idemretry/mobile) is
// idemretry for Android and iOS apps, through gomobile bind.
//
// Its API uses only what gobind can carry between Go and Kotlin/Java or
// Swift/Objective-C: strings, byte arrays, numbers, booleans, errors,
// classes with fields and methods of those, and one interface the app
// implements (Rebuilder). Bound with
//
//	gomobile bind -target=android -javapkg=com.example github.com/idemretry/idemretry/mobile
//	gomobile bind -target=ios github.com/idemretry/idemretry/mobile
//
// the package is the Java class idemretry.Idemretry (com.example.idemretry
// with -javapkg) with the classes Client, Request, Response, Headers,
// Failure, Action, ActionList, Outcome and OutcomeList; in Swift and
// Objective-C every name takes the prefix Idemretry (IdemretryClient,
// IdemretryNewClient, IdemretryKindMaybeProcessed...).
//
// A Client keeps each action's Idempotency-Key in a journal in a directory
// the app owns (its files directory on Android, Application Support on iOS):
// every send of an action, after a retry, a crash or a restart of the app,
// carries the same key, so the server performs it once. What the app does:
//
//   - on start: NewClient on the journal directory, then Resume, which
//     resends every action a previous run left unfinished (with its old
//     key) through the app's Rebuilder;
//   - per payment: Send a Request with an ActionID made once per thing the
//     user means to do once (when the checkout screen opens, say);
//   - on going to the background: Sync, so that every recorded answer is on
//     disk before the system may kill the app;
//   - on exit: Close.
//
// Every error a Client returns carries a kind (ErrorKind, or FailureOf for
// all its details) that the app branches on without reading messages:
// KindMaybeProcessed above all, which says that the server may have
// performed the action and that it must be resent with the same ActionID,
// never as a new action. Each kind is one of four outcomes (ErrorOutcome,
// Failure.Outcome), the Go package's: OutcomeDone, OutcomeNotSent,
// OutcomePending (resend with the same ActionID) and OutcomeRefused.
package idemretry
