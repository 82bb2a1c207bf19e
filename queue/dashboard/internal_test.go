package dashboard

import (
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jobq/jobq/data"
)

func TestSameOrigin(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		header map[string]string
		ok     bool
	}{
		{"no browser headers", nil, true},
		{"same origin", map[string]string{"Origin": "http://jobq.local:8222", "Sec-Fetch-Site": "same-origin"}, true},
		{"same origin, any case", map[string]string{"Origin": "http://JOBQ.local:8222"}, true},
		{"typed by the user", map[string]string{"Sec-Fetch-Site": "none"}, true},
		// nginx passes on proxy_set_header Host $proxy_host by default: the
		// Host is the upstream's address, not the page's.
		{"behind a proxy that sets Host", map[string]string{"Origin": "https://jobq.example.com", "Sec-Fetch-Site": "same-origin", "Referer": "https://jobq.example.com/"}, true},
		{"same referer", map[string]string{"Referer": "http://jobq.local:8222/?id=x"}, true},
		{"cross-site", map[string]string{"Sec-Fetch-Site": "cross-site"}, false},
		{"same-site", map[string]string{"Sec-Fetch-Site": "same-site"}, false},
		{"other origin", map[string]string{"Origin": "http://evil.example"}, false},
		{"other port", map[string]string{"Origin": "http://jobq.local:9999"}, false},
		{"null origin", map[string]string{"Origin": "null"}, false},
		{"other referer", map[string]string{"Referer": "https://evil.example/jobq.local:8222"}, false},
		{"bad referer", map[string]string{"Referer": "::"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest("POST", "http://jobq.local:8222/dlq/retry", nil)
			for k, v := range tt.header {
				r.Header.Set(k, v)
			}
			if err := sameOrigin(r); (err == nil) != tt.ok {
				t.Errorf("got %v, want ok %v", err, tt.ok)
			}
		})
	}
}

func TestRecorder(t *testing.T) {
	t.Parallel()
	r := NewRecorder()
	if got := r.Recent(); len(got) != 0 {
		t.Fatalf("new recorder: got %d recent jobs, want none", len(got))
	}
	states := []data.State{data.StateDone, data.StateRetrying, data.StateFailed}
	for i := range RecentJobs + 10 {
		state := states[i%3]
		var err error
		if state != data.StateDone {
			err = fmt.Errorf("attempt %d failed", i)
		}
		r.JobFinished(&data.Job{ID: fmt.Sprint("job-", i), Subject: "job.x", Attempt: 1}, state, time.Millisecond, err)
	}
	if got, want := r.Counts(), (Counts{Completed: 20, Retried: 20, Failed: 20}); got != want {
		t.Errorf("counts: got %+v, want %+v", got, want)
	}
	recent := r.Recent()
	if len(recent) != RecentJobs || recent[0].ID != "job-59" || recent[RecentJobs-1].ID != "job-10" {
		t.Errorf("recent: got %d from %s to %s, want %d from job-59 to job-10", len(recent), recent[0].ID, recent[len(recent)-1].ID, RecentJobs)
	}
	if recent[1].Error() != "attempt 58 failed" || recent[2].Error() != "" || recent[2].State != data.StateDone {
		t.Errorf("job-58 and job-57: got %q and %s %q, want attempt 58 failed, then done without error", recent[1].Error(), recent[2].State, recent[2].Error())
	}
	now := time.Now()
	points := r.Throughput(now)
	if len(points) != Buckets {
		t.Fatalf("throughput: got %d buckets, want %d", len(points), Buckets)
	}
	// The attempts fall in the last bucket, or the one before if a bucket
	// began while they were recorded.
	prev, last := points[Buckets-2], points[Buckets-1]
	if prev.Completed+last.Completed != 20 || prev.Failed+last.Failed != 40 {
		t.Errorf("throughput: last buckets %+v %+v, want 20 completed and 40 failed", prev, last)
	}
	// Fifteen minutes on, the buckets have rolled over.
	for _, p := range r.Throughput(now.Add(Buckets * BucketWidth)) {
		if p.Completed+p.Failed != 0 {
			t.Errorf("15 minutes later: got %+v, want every bucket empty", p)
		}
	}
}

func TestRecorderAllocatesNothing(t *testing.T) {
	r := NewRecorder()
	job := &data.Job{ID: "job-1", Subject: "job.x", Attempt: 1}
	cause := errors.New("boom")
	if n := testing.AllocsPerRun(1000, func() { r.JobFinished(job, data.StateFailed, time.Millisecond, cause) }); n != 0 {
		t.Errorf("JobFinished: got %v allocations, want 0", n)
	}
}

func TestChart(t *testing.T) {
	t.Parallel()
	points := make([]Point, Buckets)
	points[Buckets-1] = Point{Completed: 8, Failed: 2}
	points[Buckets-3] = Point{Completed: 1}
	c := newChart(points)
	if c.Peak != 10 || c.Completed != 9 || c.Failed != 2 || len(c.Bars) != 2 {
		t.Fatalf("got peak %d, %d completed, %d failed, %d bars; want 10, 9, 2, 2", c.Peak, c.Completed, c.Failed, len(c.Bars))
	}
	b := c.Bars[1]
	if b.OkH != plotHeight*8/10 || b.FailH != plotHeight*2/10 || b.FailY != 0 || b.OkY+b.OkH != plotHeight {
		t.Errorf("tallest bar: got %+v, want it to fill the plot, failed on top", b)
	}
	if small := c.Bars[0]; small.OkH < 1 {
		t.Errorf("bar of 1: got height %d, want at least 1", small.OkH)
	}
}

func TestHumanize(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"}, {850 * time.Microsecond, "850µs"}, {12 * time.Millisecond, "12ms"}, {1500 * time.Millisecond, "1.5s"},
		{125 * time.Second, "2m05s"}, {200 * time.Minute, "3h20m"}, {52 * time.Hour, "2d4h"},
	} {
		if got := humanDuration(tt.d); got != tt.want {
			t.Errorf("humanDuration(%s): got %q, want %q", tt.d, got, tt.want)
		}
	}
	for _, tt := range []struct {
		n    uint64
		want string
	}{{0, "0 B"}, {999, "999 B"}, {2722, "2.7 kB"}, {1_234_567, "1.2 MB"}, {999_999, "1.0 MB"}} {
		if got := HumanSize(tt.n); got != tt.want {
			t.Errorf("HumanSize(%d): got %q, want %q", tt.n, got, tt.want)
		}
	}
	for in, want := range map[string]string{"10m0s": "10m", "1m30s": "1m30s", "1h0m0s": "1h", "168h0m0s": "7d", "x": "x"} {
		if got := HumanSpan(in); got != want {
			t.Errorf("HumanSpan(%q): got %q, want %q", in, got, want)
		}
	}
	if !strings.HasPrefix(contentPolicy, "default-src 'none'; style-src 'sha256-") {
		t.Errorf("content policy: got %q", contentPolicy)
	}
}
