package crd

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/xdpq/xdpq/pkg/apis/xdpq/v1alpha1"
)

// phase is how long each phase of BenchmarkXdpqNodeWrites lasts;
// XDPQ_E2E_PHASE (a Go duration) changes it.
func phase(b *testing.B) time.Duration {
	if s := os.Getenv("XDPQ_E2E_PHASE"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			b.Fatalf("XDPQ_E2E_PHASE: %v", err)
		}
		return d
	}
	return 2 * time.Minute
}

// BenchmarkXdpqNodeWrites counts the XdpqNode status writes of one
// node's daemon at the API server (its apiserver_request_total of
// APPLY on xdpqnodes/status: every write, those that change nothing
// included) while the node is idle, and under allocation churn of one
// allocation or free a second through the daemon's local API. Goals:
// 0 writes idle, at most 0.1 a second under churn. Run it once:
//
//	go test -run '^$' -bench XdpqNodeWrites -benchtime 1x ./crd
func BenchmarkXdpqNodeWrites(b *testing.B) {
	e := setup(b, "pools: [{name: rx, devices: {netdevs: ['xa#0-3']}}]\n")
	d := phase(b)
	ctx, cancel := context.WithTimeout(context.Background(), 3*d+5*time.Minute)
	defer cancel()
	until(b, e.watchNode(ctx), time.Minute, "Ready", func(o *v1alpha1.XdpqNode) bool {
		return meta.IsStatusConditionTrue(o.Status.Conditions, v1alpha1.ConditionReady)
	})
	type row struct {
		phase  string
		dur    time.Duration
		writes float64
		goal   string
	}
	var rows []row
	for b.Loop() {
		rows = rows[:0]
		before := e.applies(ctx)
		t0 := time.Now()
		idle := time.NewTimer(d)
		select {
		case <-idle.C:
		case <-ctx.Done():
			b.Fatal(ctx.Err())
		}
		rows = append(rows, row{"idle", time.Since(t0), e.applies(ctx) - before, "0"})

		before, t0 = e.applies(ctx), time.Now()
		tick := time.NewTicker(time.Second)
		var held string
		changes := 0
		for time.Since(t0) < d {
			<-tick.C
			if held == "" {
				a, err := e.api.Alloc("rx", 1, 65534)
				if err != nil {
					b.Fatal(err)
				}
				held = a.ID
			} else {
				if err := e.api.Free(held); err != nil {
					b.Fatal(err)
				}
				held = ""
			}
			changes++
		}
		tick.Stop()
		rows = append(rows, row{fmt.Sprintf("churn, %d allocs and frees at 1/s", changes), time.Since(t0), e.applies(ctx) - before, "≤ 0.1/s"})
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "phase\tduration\tstatus writes\twrites/s\tgoal")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%v\t%.0f\t%.3f\t%s\n", r.phase, r.dur.Round(time.Second), r.writes, r.writes/r.dur.Seconds(), r.goal)
	}
	tw.Flush()
	b.ReportMetric(rows[0].writes/rows[0].dur.Seconds(), "idle-writes/s")
	b.ReportMetric(rows[1].writes/rows[1].dur.Seconds(), "churn-writes/s")
}

// applies is the API server's count of server-side applies to
// xdpqnodes/status, every response code.
func (e *env) applies(ctx context.Context) float64 {
	e.t.Helper()
	raw, err := e.cp.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		e.t.Fatalf("apiserver metrics: %v", err)
	}
	var n float64
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") || !strings.Contains(line, `resource="xdpqnodes"`) ||
			!strings.Contains(line, `subresource="status"`) || !strings.Contains(line, `verb="APPLY"`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			e.t.Fatalf("apiserver metrics: %q: %v", line, err)
		}
		n += v
	}
	return n
}
