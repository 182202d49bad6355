// Package pngfile writes the simulations' plots to disk.
package pngfile

import (
	"os"

	"gonum.org/v1/plot/vg/vgimg"
)

// Write encodes img as a PNG file at path, replacing any file there.
func Write(path string, img *vgimg.Canvas) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
