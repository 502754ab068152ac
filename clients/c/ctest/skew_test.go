package ctest_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/testing/node"
	"github.com/xdpq/xdpq/internal/testing/release"
	"github.com/xdpq/xdpq/internal/testing/testbin"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/internal/testing/testproc"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/xdp"
)

// TestRxdropPreviousRelease is the C client's version skew: xdpq-rxdrop
// as the previous release (PREVIOUS_RELEASE) built it, from its own
// sources and Makefile out of the repository's history, leases both
// queues from this tree's broker as an unprivileged pod and receives
// every frame byte for byte. A pod keeps the client it was built with
// across a daemon's upgrade, and a new one may be an older build.
func TestRxdropPreviousRelease(t *testing.T) {
	n, p := startNode(t, nobody, nil, 0)
	version, commit, src := release.ExportPrevious(t, filepath.Join("..", "..", ".."), "clients/c")
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

// TestRxdropOnPreviousDaemon is the skew the other way: this tree's
// xdpq-rxdrop against the previous release's daemon (PREVIOUS_RELEASE,
// built from its own sources out of the repository's history), run
// standalone as its binary on a veth NIC. A pod built after an upgrade
// meets the old daemon when the DaemonSet is rolled back, and on nodes a
// rolling upgrade has not reached yet. It leases both queues of an
// allocation the old daemon made, as an unprivileged pod, and receives
// every frame byte for byte; the old daemon then frees the allocation
// and stops cleanly.
func TestRxdropOnPreviousDaemon(t *testing.T) {
	testnet.RequireRoot(t)
	version, commit, src := release.ExportPrevious(t, filepath.Join("..", "..", ".."))
	daemonBin := filepath.Join(t.TempDir(), "deviceplugin")
	testbin.BuildIn(t, src, daemonBin, "./cmd/deviceplugin")
	bin := filepath.Join(build(t, "xdpq-rxdrop"), "xdpq-rxdrop")

	pair := testnet.NewPair(t, 4)
	if err := xdp.MountBPFFS(xdp.DefaultBPFFS); err != nil {
		t.Fatal(err)
	}
	pins, err := os.MkdirTemp(xdp.DefaultBPFFS, "xdpq-skew-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pins) })
	// The pod runs as another user: its socket's directory must be open
	// to it, which t.TempDir's is not.
	work, err := os.MkdirTemp("", "xdpq-skew-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	if err := os.Chmod(work, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(work, "config.yaml")
	if err := os.WriteFile(cfg, []byte("pools: [{name: skew, steering: hardware, devices: {netdevs: ['xa#0-1']}}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(work, "api.sock")
	d, err := testproc.Start(exec.Command(daemonBin, "--standalone", "--config", cfg, "--netns", pair.NSPath(),
		"--pin-dir", filepath.Join(pins, "xdpq"), "--state-dir", filepath.Join(work, "state"),
		"--alloc-dir", filepath.Join(work, "alloc"), "--api-socket", sock, "--metrics-addr", ""))
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			d.Stop(20 * time.Second)
		}
	})
	if err := testproc.WaitAPI(d, sock, 20*time.Second); err != nil {
		t.Fatalf("the daemon of release %s: %v", version, err)
	}
	c := api.NewClient(sock)
	info, err := c.VersionInfo()
	if err != nil || info.Release != version {
		t.Fatalf("the daemon says release %q (%v), want the previous release's %s", info.Release, err, version)
	}

	a, err := c.Alloc("skew", 2, nobody)
	if err != nil {
		t.Fatalf("alloc from the daemon of release %s: %v\n%s", version, err, d.Out)
	}
	if !slices.Equal(a.Queues, []uint32{0, 1}) {
		t.Fatalf("allocation %s has queues %v, want [0 1]", a.ID, a.Queues)
	}
	peer, closePeer, err := node.OpenPeer(pair, []uint32{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := closePeer(); err != nil {
			t.Error(err)
		}
	})
	const perQueue = 300
	r := startRxdrop(t, bin, a.Socket, "-x", "-r", "512", "-n", strconv.Itoa(2*perQueue), "-d", "60")
	r.waitLine(t, fmt.Sprintf("xdpq-rxdrop: allocation %s netdev xa queues 0,1: active", a.ID))
	sent := map[uint32][][]byte{}
	for q := range uint32(2) {
		f := frames(pair, q, 0, perQueue)
		if err := peer.Send[q].Send(f, time.Now().Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
		sent[q] = f
	}
	<-r.done
	if r.err != nil {
		t.Fatalf("xdpq-rxdrop against the daemon of release %s: %v\nstderr:\n%s\ndaemon:\n%s", version, r.err,
			strings.Join(r.stderr.snapshot(), "\n"), d.Out)
	}
	checkFrames(t, r.received(t), sent)
	if err := c.Free(a.ID); err != nil {
		t.Errorf("free %s: %v", a.ID, err)
	}
	stopped = true
	if err := d.Stop(20 * time.Second); err != nil {
		t.Errorf("the daemon of release %s stopped with %v\n%s", version, err, d.Out)
	}
	t.Logf("this tree's xdpq-rxdrop against the daemon of release %s (%s): %s", version, commit[:12],
		strings.Join(r.stderr.snapshot(), "; "))
}
