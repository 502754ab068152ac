package cluster

import (
	"sync"
	"syscall"
	"testing"

	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/xdpq/xdpq/internal/testing/testnet"
)

// TestProcessOutlivesNetnsThreads: a cluster process survives goroutines
// that enter new network namespaces and end their threads (what
// testutils.NewNS does, as AddNIC and testnet.NewPair call it), from
// every goroutine that might share a thread with the one that started
// it. Forked from an arbitrary thread, Pdeathsig killed it as soon as
// one of those threads was the forking one.
func TestProcessOutlivesNetnsThreads(t *testing.T) {
	testnet.RequireRoot(t)
	var procs []*process
	for i := range 8 {
		p, err := start("sleep", t.TempDir(), "sleep", []string{"600"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, p)
		t.Cleanup(func() { p.stop() })
		// Namespaces made right after the start, from as many goroutines as
		// there are threads, so the forking thread is likely among them.
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				n, err := testutils.NewNS()
				if err != nil {
					t.Errorf("new netns %d: %v", i, err)
					return
				}
				n.Close()
				testutils.UnmountNS(n)
			})
		}
		wg.Wait()
	}
	for i, p := range procs {
		select {
		case <-p.done:
			t.Errorf("process %d (pid %d) died: %v", i, p.cmd.Process.Pid, p.err)
		default:
			if err := syscall.Kill(p.cmd.Process.Pid, 0); err != nil {
				t.Errorf("process %d (pid %d): %v", i, p.cmd.Process.Pid, err)
			}
		}
	}
}
