package main

import "io"

// common holds what every scenario of the simulation shares.
type common struct {
	Seed     int64     // same seed, same numbers
	OutDir   string    // where CSV and plot files go
	CSV      bool      // also write the tables as CSV files (-csv)
	Progress bool      // draw progress bars (stderr is a terminal)
	Stdout   io.Writer // tables
	Stderr   io.Writer // progress and notes
}
