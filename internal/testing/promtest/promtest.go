// Package promtest runs a real Prometheus server for tests: the
// dashboard's and the alerts' tests (test/chart/dashboard) and the e2e's
// scrape through the chart's metrics Service ask it what Grafana and
// Alertmanager would.
package promtest

import (
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/testing/testproc"
)

// Config is what Start's Prometheus scrapes and evaluates. It scrapes
// and evaluates each second.
type Config struct {
	// ScrapeConfigs is the YAML of scrape_configs' items, indented by
	// two spaces.
	ScrapeConfigs string
	// Rules, if any, is a rules file Prometheus evaluates.
	Rules []byte
}

// Server is a Prometheus server a test started.
type Server struct {
	// Base is its HTTP API's base URL.
	Base string
}

// Start runs Prometheus (the binary at bin) with cfg on a fresh storage
// directory and a free port of 127.0.0.1, until the test ends, and
// returns once it is ready.
func Start(t testing.TB, bin string, cfg Config) *Server {
	t.Helper()
	dir := t.TempDir()
	var text strings.Builder
	text.WriteString("global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n")
	if cfg.Rules != nil {
		rules := filepath.Join(dir, "rules.yaml")
		if err := os.WriteFile(rules, cfg.Rules, 0o644); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&text, "rule_files: [%q]\n", rules)
	}
	text.WriteString("scrape_configs:\n" + cfg.ScrapeConfigs)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(text.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := ln.Addr().String()
	if err := ln.Close(); err != nil { // Prometheus listens there next
		t.Fatal(err)
	}
	p, err := testproc.Start(exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+listen, "--log.level=warn"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		exit := p.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("prometheus (exit %v; config:\n%s):\n%s", exit, text.String(), p.Out)
		}
	})
	out := p.Out
	s := &Server{Base: "http://" + listen}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) { // its start tells no one: polled
		if exited, err := p.Exited(); exited {
			t.Fatalf("prometheus exited: %v\n%s", err, out.String())
		}
		resp, err := http.Get(s.Base + "/-/ready")
		if err == nil {
			_ = resp.Body.Close() // only its status matters
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready at %s: %v\n%s", s.Base, err, out.String())
		}
	}
}

// Get asks Prometheus' HTTP API and decodes its data into v.
func (s *Server) Get(t testing.TB, path string, q url.Values, v any) {
	t.Helper()
	resp, err := http.Get(s.Base + path + "?" + q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }() // read whole below; a failed close loses nothing
	var r struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if r.Status != "success" {
		t.Fatalf("%s %s: %s", path, q.Get("query"), r.Error)
	}
	if err := json.Unmarshal(r.Data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// Series is a series of a query's result.
type Series struct {
	Labels map[string]string
	Values []float64
}

// QueryRange runs expr over [from, to] at a step of a second, as a
// panel asks.
func (s *Server) QueryRange(t testing.TB, expr string, from, to time.Time) []Series {
	t.Helper()
	var data struct {
		Result []struct {
			Metric map[string]string `json:"metric"`
			Values [][2]any          `json:"values"`
		} `json:"result"`
	}
	s.Get(t, "/api/v1/query_range", url.Values{"query": {expr}, "start": {unix(from)}, "end": {unix(to)}, "step": {"1"}}, &data)
	var out []Series
	for _, r := range data.Result {
		series := Series{Labels: r.Metric}
		for _, v := range r.Values {
			str, _ := v[1].(string)
			f, err := strconv.ParseFloat(str, 64)
			if err != nil {
				t.Fatalf("%s: value %v: %v", expr, v[1], err)
			}
			series.Values = append(series.Values, f)
		}
		out = append(out, series)
	}
	return out
}

// WaitFor waits until expr, an instant query, returns a series.
// Prometheus scrapes each second and tells no one: polled.
func (s *Server) WaitFor(t testing.TB, expr string) {
	t.Helper()
	s.waitUntil(t, expr, true)
}

// WaitGone waits until expr returns no series.
func (s *Server) WaitGone(t testing.TB, expr string) {
	t.Helper()
	s.waitUntil(t, expr, false)
}

func (s *Server) waitUntil(t testing.TB, expr string, some bool) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var data struct {
			Result []json.RawMessage `json:"result"`
		}
		s.Get(t, "/api/v1/query", url.Values{"query": {expr}}, &data)
		if (len(data.Result) > 0) == some {
			return
		}
		if time.Now().After(deadline) {
			if some {
				t.Fatalf("Prometheus has no series for %s", expr)
			}
			t.Fatalf("Prometheus still has series for %s: %s", expr, data.Result)
		}
	}
}

// Firing is the query of alert's firing instances with labels.
func Firing(alert, labels string) string {
	if labels != "" {
		labels = ", " + labels
	}
	return fmt.Sprintf(`ALERTS{alertname=%q, alertstate="firing"%s}`, alert, labels)
}

// AlertDescription is the description Prometheus rendered for alert's
// firing instance.
func (s *Server) AlertDescription(t testing.TB, alert string) string {
	t.Helper()
	var data struct {
		Alerts []struct {
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
			State       string            `json:"state"`
		} `json:"alerts"`
	}
	s.Get(t, "/api/v1/alerts", url.Values{}, &data)
	for _, a := range data.Alerts {
		if a.Labels["alertname"] == alert && a.State == "firing" {
			return a.Annotations["description"]
		}
	}
	t.Fatalf("alert %s is not firing", alert)
	return ""
}

// Panel is a panel of a Grafana dashboard's JSON, as far as a test
// reads it.
type Panel struct {
	Title   string   `json:"title"`
	Type    string   `json:"type"`
	Targets []Target `json:"targets"`
	Panels  []Panel  `json:"panels"` // a row's, when collapsed
}

// Target is a panel's query.
type Target struct {
	Expr         string `json:"expr"`
	LegendFormat string `json:"legendFormat"`
	RefID        string `json:"refId"`
}

// ReadPanels reads the panels of the dashboard JSON at path, those of
// rows included; a panel without a query is an error.
func ReadPanels(t testing.TB, path string) []Panel {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []Panel `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var out []Panel
	var walk func([]Panel)
	walk = func(ps []Panel) {
		for _, p := range ps {
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			out = append(out, p)
		}
	}
	walk(dash.Panels)
	if len(out) == 0 {
		t.Fatalf("%s has no panels", path)
	}
	return out
}

// Shows runs target's expr (its variables put in by fill) over [from,
// to] and returns a line for each series with a number among its
// values: its legend and a summary of its values, sorted.
func (s *Server) Shows(t testing.TB, target Target, fill *strings.Replacer, from, to time.Time) []string {
	t.Helper()
	var lines []string
	for _, series := range s.QueryRange(t, fill.Replace(target.Expr), from, to) {
		if len(Finite(series.Values)) > 0 {
			lines = append(lines, fmt.Sprintf("%s: %s", Legend(target.LegendFormat, series.Labels), Summary(series.Values)))
		}
	}
	slices.Sort(lines)
	return lines
}

// CheckPanels runs every target of panels over [from, to] (their
// variables put in by fill) and fails t for each that returns no series
// with data, unless its panel is in excused, whose values say why it
// has none there (logged). A title in excused that no panel has fails t:
// the list is stale. What each target returned is logged.
func (s *Server) CheckPanels(t testing.TB, panels []Panel, fill *strings.Replacer, from, to time.Time, excused map[string]string) {
	t.Helper()
	for title := range excused {
		if !slices.ContainsFunc(panels, func(p Panel) bool { return p.Title == title }) {
			t.Errorf("the dashboard has no panel %q (the test's list of panels without data is stale)", title)
		}
	}
	for _, p := range panels {
		for _, tg := range p.Targets {
			lines := s.Shows(t, tg, fill, from, to)
			switch why, ok := excused[p.Title]; {
			case len(lines) == 0 && ok:
				t.Logf("panel %q, target %s: no data (%s)", p.Title, tg.RefID, why)
			case len(lines) == 0:
				t.Errorf("panel %q, target %s: no series with data\n%s", p.Title, tg.RefID, fill.Replace(tg.Expr))
			default:
				t.Logf("panel %q, target %s:\n  %s", p.Title, tg.RefID, strings.Join(lines, "\n  "))
			}
		}
	}
}

// Finite is vals without NaN and infinities.
func Finite(vals []float64) []float64 {
	var out []float64
	for _, v := range vals {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			out = append(out, v)
		}
	}
	return out
}

// Summary tells a series' values in a line: how many, and their range.
func Summary(vals []float64) string {
	f := Finite(vals)
	if len(f) == 0 {
		return fmt.Sprintf("%d samples, none a number", len(vals))
	}
	return fmt.Sprintf("%d samples, %g to %g, last %g", len(vals), slices.Min(f), slices.Max(f), f[len(f)-1])
}

// Legend fills a legend format's {{label}}s.
func Legend(format string, labels map[string]string) string {
	for k, v := range labels {
		format = strings.ReplaceAll(format, "{{"+k+"}}", v)
	}
	return format
}

func unix(t time.Time) string { return strconv.FormatFloat(float64(t.UnixNano())/1e9, 'f', 3, 64) }
