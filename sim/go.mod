module github.com/idemretry/idemretry/sim

go 1.24.0

require (
	github.com/cenkalti/backoff/v4 v4.3.0
	github.com/idemretry/idemretry v0.0.0
	github.com/idemretry/idemretry/sqljournal v0.0.0
	github.com/jackc/pgx/v5 v5.8.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.2 // indirect
	golang.org/x/sync v0.17.0 // indirect
	golang.org/x/sys v0.36.0 // indirect
	golang.org/x/text v0.29.0 // indirect
)

replace (
	github.com/idemretry/idemretry => ../
	github.com/idemretry/idemretry/sqljournal => ../sqljournal
)
