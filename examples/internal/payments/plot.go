package payments

import (
	"fmt"
	"image/color"
	"math"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/idemretry/idemretry/examples/internal/pngfile"
)

// Colours of the outage shading and of each strategy's line.
var (
	downShade = color.NRGBA{R: 220, G: 60, B: 60, A: 60}
	warmShade = color.NRGBA{R: 240, G: 160, B: 40, A: 50}
	palette   = []color.Color{
		color.NRGBA{R: 31, G: 119, B: 180, A: 255},
		color.NRGBA{R: 44, G: 160, B: 44, A: 255},
		color.NRGBA{R: 148, G: 103, B: 189, A: 255},
		color.NRGBA{R: 214, G: 39, B: 40, A: 255},
		color.NRGBA{R: 90, G: 90, B: 90, A: 255},
	}
)

// WritePlot draws requests per 10 ms over time as a PNG, one panel per run
// (one line per strategy), stacked on a shared time axis with the outage
// shaded red and its warm-up orange. Panels share one y scale, so heights
// compare; a run whose peak is far above the others (retrying at once) is
// clipped and says so in its title.
func WritePlot(path, title string, results []*Result) error {
	if len(results) == 0 {
		return nil
	}
	ymax, xmax := clipLevel(results), 0.0
	for _, r := range results {
		xmax = max(xmax, float64(len(r.Buckets))*Bucket.Seconds())
	}
	var rows [][]*plot.Plot
	for i, r := range results {
		p := plot.New()
		peak := 0
		for _, n := range r.Buckets {
			peak = max(peak, n)
		}
		p.Title.Text = fmt.Sprintf("%s: %d requests, peak %d per 10 ms, %d after the outage", r.Strategy, r.Requests, peak, r.PeakAfterOutage)
		if float64(peak) > ymax {
			p.Title.Text += " (clipped)"
		}
		if i == 0 {
			p.Title.Text = title + "\n" + p.Title.Text
		}
		p.Title.TextStyle.Font.Size = vg.Points(11)
		p.Y.Label.Text = "req / 10 ms"
		p.Y.Tick.Marker = wholeTicks{}
		if i == len(results)-1 {
			p.X.Label.Text = "virtual time (s)"
		}
		p.X.Tick.Marker = secondTicks{}
		p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = 0, xmax, 0, ymax
		p.Add(plotter.NewGrid())
		shade(p, r.Outage.Start.Seconds(), r.Outage.End.Seconds(), ymax, downShade)
		shade(p, r.Outage.End.Seconds(), (r.Outage.End + r.Outage.WarmUp).Seconds(), ymax, warmShade)
		pts := make(plotter.XYs, len(r.Buckets))
		for b, n := range r.Buckets {
			pts[b] = plotter.XY{X: (float64(b) + 0.5) * Bucket.Seconds(), Y: min(float64(n), ymax)}
		}
		line, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		line.Color, line.Width = palette[i%len(palette)], vg.Points(1)
		p.Add(line)
		rows = append(rows, []*plot.Plot{p})
	}

	const width, panel = 12 * vg.Inch, 2.2 * vg.Inch
	img := vgimg.New(width, panel*vg.Length(len(rows))+0.4*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(rows), Cols: 1, PadTop: vg.Points(6), PadBottom: vg.Points(6),
		PadLeft: vg.Points(6), PadRight: vg.Points(12), PadY: vg.Points(10)}
	canvases := plot.Align(rows, tiles, dc)
	for i := range rows {
		rows[i][0].Draw(canvases[i][0])
	}
	return pngfile.Write(path, img)
}

// wholeTicks labels the default ticks as whole numbers: requests are
// counted, not measured.
type wholeTicks struct{}

func (wholeTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = strconv.FormatFloat(math.Round(ticks[i].Value), 'f', 0, 64)
		}
	}
	return ticks
}

// secondTicks marks every second and labels every other one, so the
// outage's edges and the waves of un-jittered retries can be read off.
type secondTicks struct{}

func (secondTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for s := math.Ceil(lo); s <= hi; s++ {
		t := plot.Tick{Value: s}
		if int(s)%2 == 0 {
			t.Label = strconv.Itoa(int(s))
		}
		ticks = append(ticks, t)
	}
	return ticks
}

// clipLevel is the shared y maximum: the highest peak among runs whose
// peak is within 4 times the lowest one, so one runaway run does not
// flatten every other panel.
func clipLevel(results []*Result) float64 {
	var peaks []int
	lowest := -1
	for _, r := range results {
		peak := 1
		for _, n := range r.Buckets {
			peak = max(peak, n)
		}
		peaks = append(peaks, peak)
		if lowest < 0 || peak < lowest {
			lowest = peak
		}
	}
	top := 1
	for _, p := range peaks {
		if p <= 4*lowest {
			top = max(top, p)
		}
	}
	return float64(top) * 1.1
}

// shade fills [x0, x1] over the panel's height.
func shade(p *plot.Plot, x0, x1, ymax float64, c color.Color) {
	if x1 <= x0 {
		return
	}
	poly, err := plotter.NewPolygon(plotter.XYs{{X: x0, Y: 0}, {X: x1, Y: 0}, {X: x1, Y: ymax}, {X: x0, Y: ymax}})
	if err != nil {
		return
	}
	poly.Color, poly.LineStyle.Width = c, 0
	p.Add(poly)
}

// Colours of the overload plots: budget off, budget on, and the load
// expected without a budget.
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
	return pngfile.Write(path, img)
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
	return pngfile.Write(path, img)
}
