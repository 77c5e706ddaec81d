package main

import (
	"errors"
	"fmt"
	"image/color"
	"os"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// chart is a horizontal bar chart the comparisons fill in and the report
// renders as a PNG: one row per system, labelled on the left (the names are
// long), and in each row one bar per series (a load), the median of its
// samples with their min–max as a whisker and the median written at its end.
type chart struct {
	name   string // the PNG is <report name>-<name>.png
	title  string
	axis   string // what the values are, with their unit
	rows   []string
	series []chartSeries
}

type chartSeries struct {
	name    string
	samples map[string][]float64 // by row
}

// add adds series name: samples[i] are the samples of rows[i], in rows the
// chart may already have. A negative sample (a figure a tool does not
// report) is left out.
func (c *chart) add(name string, rows []string, samples [][]float64) {
	s := chartSeries{name: name, samples: map[string][]float64{}}
	for i, row := range rows {
		if !slices.Contains(c.rows, row) {
			c.rows = append(c.rows, row)
		}
		for _, x := range samples[i] {
			if x >= 0 {
				s.samples[row] = append(s.samples[row], x)
			}
		}
	}
	c.series = append(c.series, s)
}

// column is one figure of every system's samples, for chart.add.
func column(results [][]sample, f func(sample) float64) [][]float64 {
	xs := make([][]float64, len(results))
	for i, r := range results {
		for _, x := range r {
			xs[i] = append(xs[i], f(x))
		}
	}
	return xs
}

// Okabe and Ito's palette, told apart by colour-blind readers too.
var chartColors = []color.Color{
	color.RGBA{0x00, 0x72, 0xb2, 0xff}, color.RGBA{0xe6, 0x9f, 0x00, 0xff}, color.RGBA{0x00, 0x9e, 0x73, 0xff},
	color.RGBA{0xd5, 0x5e, 0x00, 0xff}, color.RGBA{0x56, 0xb4, 0xe9, 0xff}, color.RGBA{0xcc, 0x79, 0xa7, 0xff},
}

// The chart's size: its height grows with its bars.
const (
	chartWidth   = 9 * vg.Inch
	chartDPI     = 150 // pixels per inch of the PNG
	chartBar     = 15  // vertical room of one bar, in points (1/72 inch)
	chartRowGap  = 0.8 // between rows, in bars
	chartOverall = 80  // points for the title, the value axis and its label
)

// save renders the chart as a PNG into path.
func (c *chart) save(path string) error {
	if len(c.rows) == 0 || len(c.series) == 0 {
		return errors.New("no data")
	}
	sans := font.Font{Typeface: "Liberation", Variant: "Sans"}
	p := plot.New()
	p.Title.Text = c.title
	p.Title.TextStyle.Font = font.From(sans, 14)
	p.Title.Padding = 8
	rounds := 0
	for _, s := range c.series {
		for _, xs := range s.samples {
			rounds = max(rounds, len(xs))
		}
	}
	p.X.Label.Text = fmt.Sprintf("%s: bars are medians, whiskers min–max, of %d rounds", c.axis, rounds)
	if rounds == 1 {
		p.X.Label.Text = fmt.Sprintf("%s, of 1 round", c.axis)
	}
	p.X.Label.TextStyle.Font = font.From(sans, 11)
	p.X.Tick.Label.Font = font.From(sans, 10)
	p.X.Tick.Marker = shortTicks{}
	p.X.Min = 0
	p.Y.Tick.Label.Font = font.From(sans, 11)
	p.Y.Tick.Length, p.Y.Tick.Width, p.Y.Width = 0, 0, 0
	grid := plotter.NewGrid()
	grid.Horizontal.Color = nil
	p.Add(grid)

	// Each bar has a slot of height 1, the first row at the top.
	n := len(c.series)
	at := func(row, series int) float64 { return -(float64(row)*(float64(n)+chartRowGap) + float64(series)) }
	var ticks []plot.Tick
	for r, row := range c.rows {
		ticks = append(ticks, plot.Tick{Value: (at(r, 0) + at(r, n-1)) / 2, Label: row})
	}
	p.Y.Tick.Marker = plot.ConstantTicks(ticks)
	p.Y.Min, p.Y.Max = at(len(c.rows)-1, n-1)-0.6, 0.6

	var bars []*plotter.BarChart
	var whiskers struct {
		plotter.XYs // the medians
		plotter.XErrors
	}
	var medians plotter.XYLabels // at the whiskers' ends
	legend := plot.NewLegend()
	for si, s := range c.series {
		first := len(bars)
		for r, row := range c.rows {
			xs := s.samples[row]
			if len(xs) == 0 {
				continue
			}
			m, lo, hi := median(xs), slices.Min(xs), slices.Max(xs)
			b, err := plotter.NewBarChart(plotter.Values{m}, 1)
			if err != nil {
				return err
			}
			b.Horizontal, b.XMin = true, at(r, si)
			b.Color = chartColors[si%len(chartColors)]
			b.LineStyle.Color = b.Color
			bars = append(bars, b)
			p.Add(b)
			whiskers.XYs = append(whiskers.XYs, plotter.XY{X: m, Y: at(r, si)})
			whiskers.XErrors = append(whiskers.XErrors, struct{ Low, High float64 }{m - lo, hi - m})
			medians.XYs = append(medians.XYs, plotter.XY{X: hi, Y: at(r, si)})
			medians.Labels = append(medians.Labels, short(m))
		}
		if len(bars) > first && n > 1 {
			legend.Add(s.name, bars[len(bars)-1])
		}
	}
	if len(bars) == 0 {
		return errors.New("no samples")
	}
	e, err := plotter.NewXErrorBars(whiskers)
	if err != nil {
		return err
	}
	labels, err := plotter.NewLabels(medians)
	if err != nil {
		return err
	}
	for i := range labels.TextStyle {
		labels.TextStyle[i].Font = font.From(sans, 10)
		labels.TextStyle[i].YAlign = draw.YCenter
	}
	labels.Offset.X = 4
	p.Add(e, labels)

	// The legend goes under the plot, where it hides no bar.
	legend.TextStyle.Font = font.From(sans, 11)
	legend.Left, legend.Padding = true, 4
	var legendHeight vg.Length
	if n > 1 {
		legendHeight = legend.Rectangle(draw.Canvas{}).Size().Y + 12
	}
	slots := float64(len(c.rows)*n) + float64(len(c.rows)-1)*chartRowGap + 1.2
	img := vgimg.NewWith(vgimg.UseWH(chartWidth, vg.Length(slots)*chartBar+chartOverall+legendHeight), vgimg.UseDPI(chartDPI))
	dc := draw.New(img)
	dc = draw.Crop(dc, 6, -12, 6, -6) // margins
	area := draw.Crop(dc, 0, 0, legendHeight, 0)
	// The bars fill most of their slot, whatever room the axes took.
	data := p.DataCanvas(area)
	width := 0.72 * data.Size().Y / vg.Length(p.Y.Max-p.Y.Min)
	for _, b := range bars {
		b.Width = width
	}
	e.CapWidth = width / 2
	p.Draw(area)
	if n > 1 {
		legend.XOffs = data.Min.X - dc.Min.X
		legend.Draw(draw.Crop(dc, 0, 0, 0, -(dc.Size().Y - legendHeight + 12)))
	}

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

// shortTicks are gonum's default ticks, thousands labelled like the bars
// (150k, 1.2M).
type shortTicks struct{}

func (shortTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i, t := range ticks {
		if t.Label != "" && (t.Value >= 1e3 || t.Value == 0) {
			ticks[i].Label = short(t.Value)
		}
	}
	return ticks
}

// short writes v in three or four figures.
func short(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.3gM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.0fk", v/1e3)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	case v >= 100 || v == 0:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}
