package occ

import "testing"

func TestHerdEmptyCountsTheWindowOnly(t *testing.T) {
	counts := make([]int, int(HerdTo/HerdBin))
	counts[0] = 5                     // before the window: ignored
	counts[int(HerdFrom/HerdBin)] = 1 // first bin of the window
	counts[int(HerdTo/HerdBin)-1] = 3 // last bin of the window
	h := Herd{Counts: map[string][]int{"X": counts}}
	empty, bins := h.Empty("X")
	if bins != 180 || empty != 178 {
		t.Fatalf("empty %d of %d bins, want 178 of 180", empty, bins)
	}
}
