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
// The machine these run on is shared and noisy: read results as ratios
// against the nethttp case measured in the same run (cmd/compare prints
// them), never as absolute numbers, and never in timed unit tests.
package bench
