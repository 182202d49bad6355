module github.com/idemretry/idemretry

go 1.24

require (
	github.com/cenkalti/backoff/v4 v4.3.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/stretchr/testify v1.11.1 // indirect
)
