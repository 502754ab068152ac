package ctest_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/xdpq/xdpq/internal/testing/release"
	"github.com/xdpq/xdpq/internal/testing/testnet"
)

// TestRxdropPreviousRelease is the C client's version skew: xdpq-rxdrop
// as the previous release (PREVIOUS_RELEASE) built it, from its own
// sources and Makefile out of the repository's history, leases both
// queues from this tree's broker as an unprivileged pod and receives
// every frame byte for byte. A pod keeps the client it was built with
// across a daemon's upgrade, and a new one may be an older build.
func TestRxdropPreviousRelease(t *testing.T) {
	n, p := startNode(t, nobody, nil, 0)
	root := filepath.Join("..", "..", "..")
	version, commit, err := release.Previous(root)
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	if err := release.Export(context.Background(), root, commit, src, "clients/c"); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	cc := testnet.RequireTool(t, "clang-14", "clang", "clang-14")
	bin := filepath.Join(out, "xdpq-rxdrop")
	if b, err := exec.Command("make", "-s", "-C", filepath.Join(src, "clients/c"), "O="+out, "CC="+cc, bin).CombinedOutput(); err != nil {
		t.Fatalf("make xdpq-rxdrop of release %s: %v\n%s", version, err, b)
	}
	const perQueue = 300
	r := startRxdrop(t, bin, n.Alloc.SocketPath(), "-x", "-r", "512", "-n", strconv.Itoa(2*perQueue), "-d", "60")
	r.waitLine(t, "xdpq-rxdrop: allocation alloc-1 netdev xa queues 0,1: active")
	sent := map[uint32][][]byte{}
	send(t, n, p, 0, perQueue, sent)
	<-r.done
	if r.err != nil {
		t.Fatalf("xdpq-rxdrop of release %s: %v\nstderr:\n%s", version, r.err, strings.Join(r.stderr.snapshot(), "\n"))
	}
	checkFrames(t, r.received(t), sent)
	t.Logf("xdpq-rxdrop of release %s (%s) against this tree's broker: %s", version, commit[:12], strings.Join(r.stderr.snapshot(), "; "))
}
