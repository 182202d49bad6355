package sqljournal_test

import (
	"context"
	"database/sql"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/sqljournal"
	_ "github.com/jackc/pgx/v5/stdlib" // the application picks the driver
)

// Every backend of a fleet opens the same table; a payment action then has
// one Idempotency-Key whichever machine sends it, and however often.
func ExampleOpen() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close() // the application owns db, not the Journal
	db.SetMaxOpenConns(20)
	db.SetMaxIdleConns(20)

	j, err := sqljournal.Open(ctx, db, sqljournal.WithTable("payments.idempotency_keys"))
	if err != nil {
		log.Fatal(err)
	}
	defer j.Close()

	// Done records expire; pending and unknown ones wait for reconciliation.
	go func() {
		for range time.Tick(time.Hour) {
			if _, err := j.Expire(ctx); err != nil {
				log.Print(err)
			}
		}
	}()

	t, err := idemretry.NewTransport(http.DefaultTransport, idemretry.WithJournal(j))
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: t}
	_ = client // POST payments with idemretry.WithAction(ctx, "pay:order-1001")
}

// A server that keeps keys for a week: the Transport and the journal are
// told the same key window, and the journal keeps done records for the
// window plus its grace (a day by default), so that a done payment sent
// again within the week reuses its key and gets the server's stored answer.
func ExampleWithKeyWindow() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	const window = 7 * 24 * time.Hour
	j, err := sqljournal.Open(ctx, db, sqljournal.WithKeyWindow(window))
	if err != nil {
		log.Fatal(err)
	}
	defer j.Close()
	t, err := idemretry.NewTransport(http.DefaultTransport, idemretry.WithJournal(j), idemretry.WithKeyWindow(window))
	if err != nil {
		log.Fatal(err)
	}
	_ = &http.Client{Transport: t}
}
