package main

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// series is one line of a sweep plot: a warm-median metric of one method.
type series struct {
	label, method, metric string
	dashed                bool
}

var (
	pauseSeries = []series{
		{"tclone copy: pause (runtime)", MethodTclone, "pause_ms", false},
		{"tclone copy: observer gap", MethodTclone, "observer_gap_ms", true},
		{"tclone lazy: pause (runtime)", MethodTcloneLazy, "pause_ms", false},
		{"tclone lazy: observer gap", MethodTcloneLazy, "observer_gap_ms", true},
		{"tclone twin: pause (runtime)", MethodTcloneTwin, "pause_ms", false},
		{"tclone twin: observer gap", MethodTcloneTwin, "observer_gap_ms", true},
		{"stock Podman: pause (CRIU)", MethodPodman, "pause_ms", false},
		{"stock Podman: observer gap", MethodPodman, "observer_gap_ms", true},
		{"raw CRIU: pause", MethodCriu, "pause_ms", false},
		{"fork() floor", MethodFork, "floor_ms", false},
	}
	latencySeries = []series{
		{"tclone copy: to running", MethodTclone, "to_running_ms", false},
		{"tclone copy: first command", MethodTclone, "first_command_ms", true},
		{"tclone lazy: to running", MethodTcloneLazy, "to_running_ms", false},
		{"tclone lazy: first command", MethodTcloneLazy, "first_command_ms", true},
		{"tclone lazy: memory complete", MethodTcloneLazy, "memory_complete_ms", true},
		{"tclone twin: to running", MethodTcloneTwin, "to_running_ms", false},
		{"tclone twin: first command", MethodTcloneTwin, "first_command_ms", true},
		{"tclone twin: memory complete", MethodTcloneTwin, "memory_complete_ms", true},
		{"stock Podman: to running", MethodPodman, "to_running_ms", false},
		{"stock Podman: first command", MethodPodman, "first_command_ms", true},
		{"raw CRIU: dump + restore", MethodCriu, "to_running_ms", false},
		{"fork() floor", MethodFork, "floor_ms", false},
	}
)

var methodColors = map[string]color.Color{
	MethodTclone:     color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	MethodTcloneLazy: color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	MethodTcloneTwin: color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	MethodPodman:     color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	MethodCriu:       color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	MethodFork:       color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff},
}

func writePlots(r *Results, dir string) error {
	steps := []struct {
		file string
		draw func() (*plot.Plot, error)
	}{
		{"procs-pause.png", func() (*plot.Plot, error) {
			return sweepPlot(r, "procs", "Source pause vs process count", "processes in the container", pauseSeries)
		}},
		{"procs-latency.png", func() (*plot.Plot, error) {
			return sweepPlot(r, "procs", "Time to sibling vs process count", "processes in the container", latencySeries)
		}},
		{"mem-pause.png", func() (*plot.Plot, error) {
			return sweepPlot(r, "mem", "Source pause vs touched memory", "touched anonymous memory (MiB)", pauseSeries)
		}},
		{"mem-latency.png", func() (*plot.Plot, error) {
			return sweepPlot(r, "mem", "Time to sibling vs touched memory", "touched anonymous memory (MiB)", latencySeries)
		}},
		{"mem-pss.png", func() (*plot.Plot, error) { return pssPlot(r) }},
		{"tclone-phases.png", func() (*plot.Plot, error) { return phasesPlot(r) }},
		{"fanout.png", func() (*plot.Plot, error) { return fanOutPlot(r) }},
	}
	for _, s := range steps {
		p, err := s.draw()
		if err != nil {
			return fmt.Errorf("%s: %w", s.file, err)
		}
		if err := p.Save(9*vg.Inch, 5.5*vg.Inch, filepath.Join(dir, s.file)); err != nil {
			return fmt.Errorf("%s: %w", s.file, err)
		}
	}
	return nil
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.Add(plotter.NewGrid())
	return p
}

// headroom extends the y axis above the data so that the legend, in the
// top left corner, covers none of it: the data keeps the lower 1-frac of
// the height.
func headroom(p *plot.Plot, ymin, ymax float64, logScale bool, frac float64) {
	if !(ymax > ymin) {
		return
	}
	if logScale {
		lo, hi := math.Log(ymin/1.3), math.Log(ymax)
		p.Y.Min, p.Y.Max = math.Exp(lo), math.Exp(hi+(hi-lo)*frac/(1-frac))
		return
	}
	p.Y.Min, p.Y.Max = 0, ymax+ymax*frac/(1-frac)
}

// emptyNote marks a plot that has nothing to show (a quick run, or a
// failure), so that it still renders.
func emptyNote(p *plot.Plot, why string) {
	p.Title.Text += " (" + why + ")"
	p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = 0, 1, 0, 1
}

// sweepPlot draws warm medians against the sweep variable, on a log scale
// in y since the methods differ by orders of magnitude.
func sweepPlot(r *Results, kind, title, xlabel string, ss []series) (*plot.Plot, error) {
	p := newPlot(title, xlabel, "ms, warm median (log scale)")
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	drawn := 0
	ymin, ymax := math.Inf(1), math.Inf(-1)
	for _, s := range ss {
		var pts plotter.XYs
		for _, w := range r.Workloads {
			if w.Kind != kind {
				continue
			}
			v := w.Methods[s.method].warmMedian(s.metric)
			if math.IsNaN(v) || v <= 0 {
				continue
			}
			x := float64(w.Procs)
			if kind == "mem" {
				x = float64(w.MemMiB)
			}
			pts = append(pts, plotter.XY{X: x, Y: v})
			ymin, ymax = math.Min(ymin, v), math.Max(ymax, v)
		}
		if len(pts) == 0 {
			continue
		}
		l, sc, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, err
		}
		l.Color, sc.Color = methodColors[s.method], methodColors[s.method]
		l.Width = vg.Points(1.5)
		if s.dashed {
			l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
			sc.Shape = draw.RingGlyph{}
		} else {
			sc.Shape = draw.CircleGlyph{}
		}
		p.Add(l, sc)
		p.Legend.Add(s.label, l, sc)
		drawn++
	}
	if drawn == 0 {
		p.Y.Scale = plot.LinearScale{}
		p.Y.Tick.Marker = plot.DefaultTicks{}
		emptyNote(p, "no data")
		return p, nil
	}
	headroom(p, ymin, ymax, true, 0.22)
	return p, nil
}

// pssPlot draws the sibling's PSS right after the fork and later, per
// method, against the memory sweep.
func pssPlot(r *Results) (*plot.Plot, error) {
	p := newPlot("Sibling PSS vs touched memory", "touched anonymous memory of the source (MiB)", "sibling PSS (MiB)")
	drawn := 0
	ymax := 0.0
	// Reference: the source's own PSS. A sibling that shared its pages
	// with the source would lie well below it.
	var ref plotter.XYs
	for _, w := range r.Workloads {
		if v := w.Methods[MethodTclone].warmMedian("source_pss_kib"); w.Kind == "mem" && !math.IsNaN(v) {
			ref = append(ref, plotter.XY{X: float64(w.MemMiB), Y: v / 1024})
			ymax = math.Max(ymax, v/1024)
		}
	}
	if len(ref) > 0 {
		l, err := plotter.NewLine(ref)
		if err != nil {
			return nil, err
		}
		l.Width = vg.Points(6)
		l.Color = color.NRGBA{R: 0x60, G: 0x60, B: 0x60, A: 0x40}
		p.Add(l)
		p.Legend.Add("source PSS (tclone's source), for reference", l)
	}
	for _, meth := range []string{MethodTclone, MethodTcloneLazy, MethodTcloneTwin, MethodPodman, MethodCriu} {
		var after, later plotter.XYs
		for _, w := range r.Workloads {
			if w.Kind != "mem" {
				continue
			}
			if v := w.Methods[meth].warmMedian("sibling_pss_kib"); !math.IsNaN(v) {
				after = append(after, plotter.XY{X: float64(w.MemMiB), Y: v / 1024})
			}
			if m := w.Methods[meth]; m != nil && m.Later != nil {
				later = append(later, plotter.XY{X: float64(w.MemMiB), Y: float64(m.Later.Sibling.PssKiB) / 1024})
			}
		}
		for i, pts := range []plotter.XYs{after, later} {
			if len(pts) == 0 {
				continue
			}
			for _, pt := range pts {
				ymax = math.Max(ymax, pt.Y)
			}
			l, sc, err := plotter.NewLinePoints(pts)
			if err != nil {
				return nil, err
			}
			l.Color, sc.Color = methodColors[meth], methodColors[meth]
			label := methodTitles[meth] + ": right after"
			if i == 1 {
				l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
				sc.Shape = draw.RingGlyph{}
				label = fmt.Sprintf("%s: %.0f s later", methodTitles[meth], r.Config.LaterDelayS)
			}
			p.Add(l, sc)
			p.Legend.Add(label, l, sc)
			drawn++
		}
	}
	if drawn == 0 {
		emptyNote(p, "no data")
		return p, nil
	}
	headroom(p, 0, ymax, false, 0.4)
	return p, nil
}

// phasesPlot stacks tclone's phases per workload.
func phasesPlot(r *Results) (*plot.Plot, error) {
	p := newPlot("tclone fork --memory copy: where the time goes (warm medians)", "", "ms")
	var names []string
	var ws []*WorkloadResult
	for _, w := range r.Workloads {
		if m := w.Methods[MethodTclone]; m != nil && len(m.Warm) > 0 {
			ws = append(ws, w)
			names = append(names, w.Name)
		}
	}
	if len(ws) == 0 {
		emptyNote(p, "no data")
		return p, nil
	}
	phases := []struct{ metric, label string }{
		{"pause_ms", "source paused (freeze, dump, fs snapshot, thaw)"},
		{"checkpoint_rest_ms", "rest of Podman's checkpoint call"},
		{"restore_ms", "Podman's restore call"},
		{"other_ms", "podman-fork (archive, ready check, client)"},
		{"exec_ms", "podman exec true"},
	}
	values := func(metric string) plotter.Values {
		v := make(plotter.Values, len(ws))
		for i, w := range ws {
			m := w.Methods[MethodTclone]
			switch metric {
			case "checkpoint_rest_ms":
				v[i] = m.warmMedian("checkpoint_ms") - m.warmMedian("pause_ms")
			case "other_ms":
				v[i] = m.warmMedian("to_running_ms") - m.warmMedian("checkpoint_ms") - m.warmMedian("restore_ms")
			default:
				v[i] = m.warmMedian(metric)
			}
			if math.IsNaN(v[i]) || v[i] < 0 {
				v[i] = 0
			}
		}
		return v
	}
	var prev *plotter.BarChart
	total := make([]float64, len(ws))
	for i, ph := range phases {
		for j, v := range values(ph.metric) {
			total[j] += v
		}
		bc, err := plotter.NewBarChart(values(ph.metric), vg.Points(28))
		if err != nil {
			return nil, err
		}
		bc.Color = plotutil.Color(i)
		bc.LineStyle.Width = 0
		if prev != nil {
			bc.StackOn(prev)
		}
		p.Add(bc)
		p.Legend.Add(ph.label, bc)
		prev = bc
	}
	p.NominalX(names...)
	p.X.Tick.Label.Rotation = math.Pi / 6
	p.X.Tick.Label.XAlign = draw.XRight
	p.X.Min, p.X.Max = -0.6, float64(len(ws))-0.4
	p.Legend.Left = true
	ymax := 0.0
	for _, t := range total {
		ymax = math.Max(ymax, t)
	}
	headroom(p, 0, ymax, false, 0.35)
	return p, nil
}

func fanOutPlot(r *Results) (*plot.Plot, error) {
	p := newPlot("Fan-out: N siblings from one capture", "siblings", "ms (median)")
	fo := r.FanOut
	if fo == nil || len(fo.Variants) == 0 {
		emptyNote(p, "not run")
		return p, nil
	}
	lines := []struct {
		metric, label string
		dashes        []vg.Length
	}{
		{"to_running_ms", "all siblings running", nil},
		{"last_first_command_ms", "first command in the last sibling", []vg.Length{vg.Points(5), vg.Points(3)}},
		{"memory_complete_ms", "all memory complete", []vg.Length{vg.Points(1), vg.Points(3)}},
	}
	drawn := 0
	ymax := 0.0
	for vi, v := range fo.Variants {
		for _, ln := range lines {
			if ln.metric == "memory_complete_ms" && v.Memory != "lazy" {
				continue
			}
			var pts plotter.XYs
			for _, fc := range v.Counts {
				if st, ok := fc.Summary[ln.metric]; ok && st.N > 0 {
					pts = append(pts, plotter.XY{X: float64(fc.Count), Y: st.Median})
					ymax = math.Max(ymax, st.Median)
				}
			}
			if len(pts) == 0 {
				continue
			}
			l, sc, err := plotter.NewLinePoints(pts)
			if err != nil {
				return nil, err
			}
			l.Color, sc.Color = plotutil.Color(vi), plotutil.Color(vi)
			l.Dashes = ln.dashes
			l.Width = vg.Points(1.5)
			p.Add(l, sc)
			p.Legend.Add(fmt.Sprintf("--memory %s --parallel %d: %s", v.Memory, v.ParallelUsed, ln.label), l, sc)
			drawn++
		}
	}
	if drawn == 0 {
		emptyNote(p, "no data")
		return p, nil
	}
	headroom(p, 0, ymax, false, 0.4)
	return p, nil
}
