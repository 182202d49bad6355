//go:build !(linux || darwin)

package main

import (
	"errors"
	"os"
)

// canKill: the example kills its app with SIGKILL, which it runs on Linux
// and macOS only.
const canKill = false

func kill(*os.Process) error { return errors.New("SIGKILL needs Linux or macOS") }

func killed(*os.ProcessState) bool { return false }
