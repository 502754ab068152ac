// Command manifests writes manifests/xdpq.yaml: the Helm chart
// charts/xdpq rendered with its default values, as `helm template`
// renders it. `make manifests` runs it.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/xdpq/xdpq/internal/atomicfile"
	"github.com/xdpq/xdpq/test/chart"
)

func main() {
	out := flag.String("o", "../../manifests/xdpq.yaml", "the file to write")
	dir := flag.String("chart", chart.Dir(), "the chart's directory")
	flag.Parse()
	b, err := chart.Manifests(*dir)
	if err == nil {
		err = atomicfile.WriteFile(*out, b, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "manifests:", err)
		os.Exit(1)
	}
}
