//go:build !race

package filejournal

const hw4Race = false
