module github.com/idemretry/idemretry/bench

go 1.24.0

replace github.com/idemretry/idemretry => ../

require (
	github.com/cenkalti/backoff/v4 v4.3.0
	github.com/failsafe-go/failsafe-go v0.9.8
	github.com/google/uuid v1.6.0
	github.com/hashicorp/go-retryablehttp v0.7.8
	github.com/idemretry/idemretry v0.0.0-00010101000000-000000000000
	golang.org/x/sys v0.36.0
)

require (
	github.com/bits-and-blooms/bitset v1.24.4 // indirect
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	github.com/influxdata/tdigest v0.0.1 // indirect
)
