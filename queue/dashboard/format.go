package dashboard

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// chart is the throughput history drawn as an inline SVG bar chart: one
// bar per bucket, completed jobs below and failed attempts stacked on top.
type chart struct {
	Width, Height     int // of the viewBox
	Bars              []chartBar
	Peak              int // the tallest bar's count
	Completed, Failed int // over the whole history
	From, To          time.Time
}

type chartBar struct {
	X, W         int
	OkY, OkH     int
	FailY, FailH int
	Title        string
}

const (
	barStep    = 10
	barWidth   = 8
	plotHeight = 120
)

func newChart(points []Point) chart {
	c := chart{Width: len(points) * barStep, Height: plotHeight}
	if len(points) == 0 {
		return c
	}
	c.From, c.To = points[0].Start, points[len(points)-1].Start.Add(BucketWidth)
	for _, p := range points {
		c.Peak = max(c.Peak, p.Completed+p.Failed)
		c.Completed += p.Completed
		c.Failed += p.Failed
	}
	// A count above zero gets at least one unit of height, so it shows.
	height := func(n int) int {
		if n == 0 || c.Peak == 0 {
			return 0
		}
		return max(n*plotHeight/c.Peak, 1)
	}
	for i, p := range points {
		if p.Completed+p.Failed == 0 {
			continue
		}
		b := chartBar{X: i*barStep + (barStep-barWidth)/2, W: barWidth, OkH: height(p.Completed), FailH: height(p.Failed)}
		b.OkY = plotHeight - b.OkH
		b.FailY = b.OkY - b.FailH
		b.Title = fmt.Sprintf("%s: %d completed, %d failed", p.Start.Local().Format(time.TimeOnly), p.Completed, p.Failed)
		c.Bars = append(c.Bars, b)
	}
	return c
}

// humanDuration formats d for a person: "850µs", "12ms", "1.5s", "2m05s",
// "3h20m", "2d4h".
func humanDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Millisecond:
		return strconv.FormatInt(d.Microseconds(), 10) + "µs"
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	}
	return fmt.Sprintf("%dd%dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
}

// HumanSpan shortens a duration as time.Duration prints it: "10m0s" is
// "10m", "168h0m0s" is "7d", "36h0m0s" is "1d12h". Anything else stays.
func HumanSpan(s string) string {
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return s
	}
	const day = 24 * time.Hour
	if d >= day && d%time.Hour == 0 {
		if h := d % day; h != 0 {
			return fmt.Sprintf("%dd%dh", d/day, h/time.Hour)
		}
		return fmt.Sprintf("%dd", d/day)
	}
	s = d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// HumanSize formats a byte count with decimal units: "512 B", "2.7 kB",
// "1.2 MB".
func HumanSize(n uint64) string {
	if n < 1000 {
		return strconv.FormatUint(n, 10) + " B"
	}
	f, unit := float64(n), 0
	for f >= 999.95 && unit < 5 {
		f /= 1000
		unit++
	}
	return strconv.FormatFloat(f, 'f', 1, 64) + " " + [...]string{"B", "kB", "MB", "GB", "TB", "PB"}[unit]
}

// clock formats t as the local time of day, for today's events.
func clock(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.Local().Format(time.TimeOnly)
}

// datetime formats t as a local date and time, "" for the zero time.
func datetime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.Local().Format(time.DateTime)
}
