package daemon

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/xdpq/xdpq/pkg/xdp"
)

// testPins returns a fresh directory on bpffs for the test's pins,
// removed when the test ends.
func testPins(t testing.TB) string {
	t.Helper()
	if err := xdp.MountBPFFS(xdp.DefaultBPFFS); err != nil {
		t.Fatal(err)
	}
	pins, err := os.MkdirTemp(xdp.DefaultBPFFS, "xdpq-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pins) })
	return pins
}

// runDaemon starts a daemon with opts (logging to the test's output
// unless opts has a logger) and returns it with a stop function that
// reports Run's error; stop runs at the test's end too, once. Each of
// prep is called with the daemon before it runs (to put a fake in place
// of what the machine cannot make fail).
func runDaemon(t testing.TB, opts Options, prep ...func(*Daemon)) (*Daemon, func()) {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range prep {
		p(d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(stop)
	select {
	case <-d.Ready():
	case err := <-done:
		t.Fatalf("the daemon stopped: %v", err)
	}
	return d, stop
}

// newPodNS makes a pod's network namespace, gone when the test ends.
func newPodNS(t testing.TB) ns.NetNS {
	t.Helper()
	pod, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pod.Close(); err != nil {
			t.Error(err)
		}
		if err := testutils.UnmountNS(pod); err != nil {
			t.Error(err)
		}
	})
	return pod
}
