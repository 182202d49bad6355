package filejournal_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/filejournal"
)

// A file journal opened by the application, shared with a Transport, and
// asked at start-up for the actions to resume or reconcile.
func ExampleOpen() {
	dir, err := os.MkdirTemp("", "journal")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	j, err := filejournal.Open(dir, filejournal.WithHashedIDs(), filejournal.WithKeyWindow(idemretry.DefaultKeyWindow))
	if err != nil {
		log.Fatal(err) // filejournal.ErrLocked: another process holds dir
	}
	defer j.Close()
	t, err := idemretry.NewTransport(nil, idemretry.WithJournal(j))
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()

	unfinished, err := j.Unfinished(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(unfinished), "actions to reconcile; recovered", j.Recovery().Records, "records")
	// Output: 0 actions to reconcile; recovered 0 records
}
