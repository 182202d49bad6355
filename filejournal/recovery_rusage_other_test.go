//go:build !unix

package filejournal

import "time"

// processCPU is not measured here.
func processCPU() time.Duration { return 0 }
