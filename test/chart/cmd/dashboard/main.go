// Command dashboard writes xdpq's Grafana dashboard (package dashboard)
// to the chart's files, which its ConfigMap serves to Grafana's
// dashboard sidecar, and to docs/. `make generate` runs it.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/xdpq/xdpq/internal/atomicfile"
	"github.com/xdpq/xdpq/test/chart/dashboard"
)

func main() {
	chartFile := flag.String("chart-file", "../../charts/xdpq/files/xdpq-dashboard.json", "the chart's copy")
	docsFile := flag.String("docs-file", "../../docs/dashboard/xdpq-dashboard.json", "the docs' copy")
	flag.Parse()
	b, err := dashboard.Build()
	for _, f := range []string{*chartFile, *docsFile} {
		if err == nil {
			err = atomicfile.WriteFile(f, b, 0o644)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashboard:", err)
		os.Exit(1)
	}
}
