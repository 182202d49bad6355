// Package occ is the discrete-event model of the AWS Architecture Blog's
// "Exponential Backoff And Jitter" (Marc Brooker, 2015): N clients race to
// update one optimistically locked row, and each failed write backs off
// with one of idemretry's own backoff types before a fresh
// read-modify-write. The model follows the blog's companion simulator
// (aws-samples/aws-arch-backoff-simulator) so that its means can be checked
// against that simulator's numbers cell by cell.
//
// Times are float64 milliseconds on a virtual clock: nothing sleeps.
package occ
