// Package bench compares idemretry with plain net/http and two peers,
// hashicorp/go-retryablehttp and failsafe-go's failsafehttp, over real
// loopback HTTP.
//
// Every client is used the same way, as the Transport of an *http.Client
// that the caller drives with http.NewRequestWithContext and Client.Do, so
// the numbers are what swapping one RoundTripper for another costs. All of
// them send through their own clone of http.DefaultTransport and retry with
// zero backoff, so the comparison is of the machinery, not of the waits.
//
// Beside the client comparison, it measures what the performance goals (README.md) are
// judged by: end-to-end actions per second at 1, 16 and 64 goroutines with
// the memory and file journals (e2e.go), the raw write+fdatasync under
// them (probe.go), idemretry's CPU per MiB of a large body without the
// network (bodycost.go), and filejournal.Open of a million records
// (recovery.go). cmd/compare runs all of it and prints the goals.
//
// The machine these run on is shared and noisy: read results as ratios
// against the nethttp case measured in the same run (cmd/compare prints
// them), never as absolute numbers, and never in timed unit tests.
package bench
