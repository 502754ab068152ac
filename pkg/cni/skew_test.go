package cni

import (
	"path/filepath"
	"testing"

	"github.com/xdpq/xdpq/internal/testing/release"
	"github.com/xdpq/xdpq/internal/testing/testbin"
	"github.com/xdpq/xdpq/internal/testing/testnet"
)

// TestCNIPreviousRelease is the CNI plugin's version skew: during a
// rolling upgrade the plugin on the host and the daemon are of two
// releases. The previous release's plugin (PREVIOUS_RELEASE), built from
// its own sources out of the repository's history, is run by cnitool
// against this tree's daemon: ADD, CHECK, a pod receiving exactly its
// flow, GC and DEL, as TestCNIToolEndToEnd's queue pool.
func TestCNIPreviousRelease(t *testing.T) {
	testnet.RequireRoot(t)
	n := startNodeFor(t, 65534)
	version, commit, src := release.ExportPrevious(t, filepath.Join("..", ".."))
	testbin.BuildIn(t, src, filepath.Join(n.bin, "xdpq"), "./cmd/cni")
	perf := t.TempDir()
	build(t, perf, map[string]string{"xdpqperf": "github.com/xdpq/xdpq/cmd/xdpqperf"})
	t.Logf("the CNI plugin of release %s (%s) against this tree's daemon", version, commit[:12])
	cnitoolEndToEndOf(t, newCNIToolOf(t, n), perf, 2)
}
