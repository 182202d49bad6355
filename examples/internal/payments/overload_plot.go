package payments

import (
	"fmt"
	"image/color"
	"os"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

var (
	offColour      = color.NRGBA{R: 214, G: 39, B: 40, A: 255}
	onColour       = color.NRGBA{R: 31, G: 119, B: 180, A: 255}
	expectedColour = color.NRGBA{R: 90, G: 90, B: 90, A: 255}
)

// WriteOutagePlot draws requests per LoadBucket reaching the server over
// time, budget off and on, with the outage shaded red.
func WriteOutagePlot(path, title string, runs []*LoadResult) error {
	if len(runs) == 0 {
		return nil
	}
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(11)
	p.X.Label.Text = "virtual time (s)"
	p.Y.Label.Text = fmt.Sprintf("requests / %v", LoadBucket)
	p.Y.Tick.Marker = wholeTicks{}
	p.X.Tick.Marker = secondTicks{}
	ymax, xmax, outage := 1.0, 0.0, 0.0
	for _, r := range runs {
		for _, n := range r.Buckets {
			ymax = max(ymax, float64(n))
		}
		xmax = max(xmax, float64(len(r.Buckets))*LoadBucket.Seconds())
		outage = max(outage, r.FailEnd.Seconds())
	}
	ymax *= 1.4 // room for the legend
	p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = 0, xmax, 0, ymax
	p.Add(plotter.NewGrid())
	shade(p, 0, outage, ymax, downShade)
	for _, r := range runs {
		pts := make(plotter.XYs, len(r.Buckets))
		for b, n := range r.Buckets {
			pts[b] = plotter.XY{X: (float64(b) + 0.5) * LoadBucket.Seconds(), Y: float64(n)}
		}
		line, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		line.Color, line.Width = budgetColour(r), vg.Points(1.2)
		p.Add(line)
		p.Legend.Add(fmt.Sprintf("budget %s: %d requests in the outage, %.2f per payment", r.BudgetLabel, r.Requests, r.PerIntent()), line)
	}
	p.Legend.Top = true
	return savePNG(path, p, 12*vg.Inch, 4*vg.Inch)
}

// WriteLoadPlot draws, against the share of attempts failing, the server's
// load (requests per payment) and the payments the first call confirmed,
// budget off and on, with the load expected without a budget.
func WriteLoadPlot(path, title string, runs []*LoadResult) error {
	if len(runs) == 0 {
		return nil
	}
	off, on := byRate(runs)
	ps := rates(runs)
	slices.Sort(ps)

	load := plot.New()
	load.Title.Text = "server load: requests per payment"
	load.X.Label.Text = "attempts failing (%)"
	load.Y.Label.Text = "requests per payment"
	load.Y.Min, load.Y.Max, load.X.Min, load.X.Max = 0, ExpectedLoad(1)+0.7, 0, 100
	load.Add(plotter.NewGrid())
	var expected plotter.XYs
	for i := 0; i <= 100; i++ {
		expected = append(expected, plotter.XY{X: float64(i), Y: ExpectedLoad(float64(i) / 100)})
	}
	line, err := plotter.NewLine(expected)
	if err != nil {
		return err
	}
	line.Color, line.Dashes = expectedColour, []vg.Length{vg.Points(4), vg.Points(3)}
	load.Add(line)
	load.Legend.Add("(1-p^6)/(1-p): 5 retries, no budget", line)

	paid := plot.New()
	paid.Title.Text = "payments confirmed by their first call (%)"
	paid.X.Label.Text = "attempts failing (%)"
	paid.Y.Label.Text = "% paid without a resend"
	paid.Y.Min, paid.Y.Max, paid.X.Min, paid.X.Max = 0, 105, 0, 100
	paid.Add(plotter.NewGrid())

	for _, set := range []map[float64]*LoadResult{off, on} {
		var lp, pp plotter.XYs
		var label string
		var colour color.Color
		for _, rate := range ps {
			if r := set[rate]; r != nil {
				lp = append(lp, plotter.XY{X: 100 * rate, Y: r.PerIntent()})
				pp = append(pp, plotter.XY{X: 100 * rate, Y: 100 * float64(r.PaidAtOnce) / float64(max(r.Intents, 1))})
				label, colour = "budget "+r.BudgetLabel, budgetColour(r)
			}
		}
		if len(lp) == 0 {
			continue
		}
		for _, target := range []struct {
			p   *plot.Plot
			pts plotter.XYs
		}{{load, lp}, {paid, pp}} {
			l, s, err := plotter.NewLinePoints(target.pts)
			if err != nil {
				return err
			}
			l.Color, s.Color, s.Shape = colour, colour, draw.CircleGlyph{}
			target.p.Add(l, s)
			target.p.Legend.Add(label, l, s)
		}
	}
	load.Legend.Top, load.Legend.Left = true, true
	paid.Legend.Top = true

	const width, height = 12 * vg.Inch, 4.4 * vg.Inch
	img := vgimg.New(width, height)
	dc := draw.New(img)
	top := draw.Crop(dc, 0, 0, 0, -vg.Points(22))
	sty := load.Title.TextStyle
	sty.XAlign, sty.YAlign = draw.XCenter, draw.YTop
	dc.FillText(sty, vg.Point{X: width / 2, Y: height - vg.Points(4)}, title)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadTop: vg.Points(6), PadBottom: vg.Points(6),
		PadLeft: vg.Points(6), PadRight: vg.Points(12), PadX: vg.Points(24)}
	rows := [][]*plot.Plot{{load, paid}}
	canvases := plot.Align(rows, tiles, top)
	load.Draw(canvases[0][0])
	paid.Draw(canvases[0][1])
	return writePNG(path, img)
}

func budgetColour(r *LoadResult) color.Color {
	if r.Budget {
		return onColour
	}
	return offColour
}

// savePNG draws p on a w x h PNG, with a margin so that the title is not
// cut at the top edge.
func savePNG(path string, p *plot.Plot, w, h vg.Length) error {
	img := vgimg.New(w, h)
	m := vg.Points(6)
	p.Draw(draw.Crop(draw.New(img), m, -m, m, -m))
	return writePNG(path, img)
}

func writePNG(path string, img *vgimg.Canvas) error {
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
