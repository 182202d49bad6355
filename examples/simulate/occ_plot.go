package main

import (
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/idemretry/idemretry/examples/internal/occ"
	"github.com/idemretry/idemretry/examples/internal/pngfile"
)

// occColors gives each strategy one colour in every occ plot. The
// un-jittered ones are warm, the jittered ones cool.
var occColors = map[string]color.Color{
	"None":        color.RGBA{R: 214, G: 39, B: 40, A: 255},
	"Exponential": color.RGBA{R: 255, G: 127, B: 14, A: 255},
	"EqualJitter": color.RGBA{R: 148, G: 103, B: 189, A: 255},
	"FullJitter":  color.RGBA{R: 31, G: 119, B: 180, A: 255},
	"Decorr":      color.RGBA{R: 44, G: 160, B: 44, A: 255},
}

// plotOccCurves draws calls and completion time against clients, a line
// per strategy from this sweep and a hollow circle per reference cell, so
// that the reproduction can be judged at a glance. Time is on a log scale:
// plain exponential is ten times slower than the rest.
func plotOccCurves(path string, cells, ref []occ.Cell) error {
	calls := occCurvePanel("Work: calls per run", "writes that reached the server",
		cells, ref, func(c occ.Cell) float64 { return c.Calls })
	times := occCurvePanel("Completion time", "ms until the last client is done (log scale)",
		cells, ref, func(c occ.Cell) float64 { return c.Time })
	times.Y.Scale = plot.LogScale{}
	times.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	times.Legend.Top = false // the lines fill the top left
	times.Legend.Left = false
	return savePanels(path, 12*vg.Inch, 5*vg.Inch, calls, times)
}

func occCurvePanel(title, ylabel string, cells, ref []occ.Cell, metric func(occ.Cell) float64) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "clients racing for the row (N)"
	p.Y.Label.Text = ylabel
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.Legend.Left = true
	p.X.Tick.Marker = plot.ConstantTicks(ticks(10, 50, 100, 150, 190)) // the reference counts
	for _, s := range occOrder {
		var line, dots plotter.XYs
		for _, c := range cells {
			if c.Strategy == s {
				line = append(line, plotter.XY{X: float64(c.Clients), Y: metric(c)})
			}
		}
		for _, c := range ref {
			if c.Strategy == s {
				dots = append(dots, plotter.XY{X: float64(c.Clients), Y: metric(c)})
			}
		}
		l, err := plotter.NewLine(line)
		if err != nil {
			continue // nothing of this strategy in the sweep
		}
		l.Color = occColors[s]
		l.Width = vg.Points(2)
		if s == "EqualJitter" {
			// Its calls lie on FullJitter's; dashes let both show.
			l.Dashes = []vg.Length{vg.Points(6), vg.Points(4)}
		}
		p.Add(l)
		p.Legend.Add(s, l)
		if len(dots) > 0 {
			sc, _ := plotter.NewScatter(dots)
			sc.Shape = draw.RingGlyph{} // hollow: the line shows through
			sc.Radius = vg.Points(5)
			sc.Color = occColors[s]
			p.Add(sc)
		}
	}
	// One legend entry explains every circle.
	key, _ := plotter.NewScatter(plotter.XYs{{}})
	key.Shape, key.Radius, key.Color = draw.RingGlyph{}, vg.Points(5), color.Black
	p.Legend.Add("reference (blog's simulator)", key)
	return p
}

// plotOccHerd draws where the writes land in time at N = 190 under plain
// exponential backoff and under jitter: per 10 ms bin, the mean number of
// writes per run. Exponential's waves leave gaps where the server sits
// idle; full jitter keeps a steady trickle.
func plotOccHerd(path string, herd occ.Herd) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Where the herd goes: writes arriving per 10 ms, N=%d, mean of %d runs",
		occ.HerdClients, occ.HerdRuns)
	p.X.Label.Text = "ms since all clients started"
	p.Y.Label.Text = fmt.Sprintf("writes per 10 ms (cut at %.0f)", herdClip)
	p.Add(plotter.NewGrid())
	p.X.Tick.Marker = plot.ConstantTicks(ticks(0, 200, 400, 600, 800, 1000, 1200, 1400, 1600, 1800, 2000))
	for _, s := range []string{"Exponential", "EqualJitter", "FullJitter"} {
		counts, ok := herd.Counts[s]
		if !ok {
			continue
		}
		xys := make(plotter.XYs, len(counts))
		for i, c := range counts {
			xys[i] = plotter.XY{X: float64(i+1) * occ.HerdBin, Y: float64(c) / occ.HerdRuns}
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return err
		}
		l.StepStyle = plotter.PreStep
		l.Color = occColors[s]
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(s, l)
	}
	p.Legend.Top = true
	// The first waves reach 100 writes per bin; cut them so that the
	// story, gaps against a steady trickle, is visible. Set after Add,
	// which widens the axes to the data.
	p.Y.Min, p.Y.Max = 0, herdClip
	p.X.Min, p.X.Max = 0, occ.HerdTo
	// Mark where the empty-bin check starts counting.
	edge, _ := plotter.NewLine(plotter.XYs{{X: occ.HerdFrom, Y: 0}, {X: occ.HerdFrom, Y: herdClip}})
	edge.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
	edge.Color = color.Gray{Y: 100}
	p.Add(edge)
	return savePanels(path, 12*vg.Inch, 4.5*vg.Inch, p)
}

// herdClip is where the herd plot cuts its y axis.
const herdClip = 30.0

// ticks labels the given values on an axis.
func ticks(values ...float64) []plot.Tick {
	var ts []plot.Tick
	for _, v := range values {
		ts = append(ts, plot.Tick{Value: v, Label: fmt.Sprint(v)})
	}
	return ts
}

// savePanels lays plots out side by side in one PNG.
func savePanels(path string, w, h vg.Length, panels ...*plot.Plot) error {
	img := vgimg.New(w, h)
	dc := draw.New(img)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	tiles := draw.Tiles{Rows: 1, Cols: len(panels), PadX: vg.Inch / 2,
		PadTop: vg.Inch / 8, PadBottom: vg.Inch / 8, PadLeft: vg.Inch / 8, PadRight: vg.Inch / 4}
	for i, p := range panels {
		p.Draw(tiles.At(dc, i, 0))
	}
	return pngfile.Write(path, img)
}
