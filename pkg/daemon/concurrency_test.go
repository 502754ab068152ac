package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/api"
)

// TestConcurrentAPI: many clients call status, alloc, free and the CNI
// verbs at once while the config file is rewritten (grown and shrunk) and
// reloaded, as an operator and a busy node would. Every call must answer,
// with success or a refusal that says why; a call that does not answer
// within the deadline fails the test with every goroutine's stack. (The
// daemon before the redesign hung here for good: its config watcher held
// its lock while applying, and status held the daemon's while asking the
// watcher.)
func TestConcurrentAPI(t *testing.T) {
	p := testnet.NewPair(t, 4)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	configs := []string{
		"pools: [{name: demo, steering: software, devices: {netdevs: ['xa#0-3']}}]\n",
		"pools: [{name: demo, steering: software, devices: {netdevs: ['xa#0-1']}}]\n",
	}
	os.WriteFile(cfg, []byte(configs[0]), 0o644)
	sock := filepath.Join(dir, "api.sock")
	d, _ := runDaemon(t, Options{ConfigPath: cfg, NetNS: p.NSPath(), PinDir: filepath.Join(testPins(t), "xdpq"),
		StateDir: filepath.Join(dir, "state"), AllocDir: filepath.Join(dir, "alloc"), Standalone: true, APISocket: sock,
		CollectPeriod: 50 * time.Millisecond, Resync: 50 * time.Millisecond})

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	fail := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	// refused is a refusal a concurrent caller may get: the pool is
	// exhausted or shrunk, the allocation went with a shrink's free.
	refused := func(err error) bool {
		return errors.Is(err, api.ErrConflict) || errors.Is(err, api.ErrNotFound)
	}
	c := api.NewClient(sock)
	for range 4 { // status pollers
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if _, err := c.Status(); err != nil {
					fail(fmt.Errorf("status: %w", err))
				}
			}
		}()
	}
	for w := range 3 { // pods coming and going
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				a, err := c.Alloc("demo", 1, 1000)
				if refused(err) {
					continue
				}
				if err != nil {
					fail(fmt.Errorf("alloc: %w", err))
					continue
				}
				cid := fmt.Sprintf("c%d-%d", w, i)
				flow := api.CNIFlow{Protocol: "udp", Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 9, byte(w), byte(i)}), 32), DstPort: 53}
				if _, err := c.CNIAdd(api.CNIAddRequest{ContainerID: cid, IfName: "net1", Allocation: a.ID, Flows: []api.CNIFlow{flow}, Addresses: []netip.Addr{flow.Dst.Addr()}}); err != nil && !refused(err) {
					fail(fmt.Errorf("cni add: %w", err))
				}
				if _, err := c.CNICheck(cid, "net1"); err != nil && !refused(err) {
					fail(fmt.Errorf("cni check: %w", err))
				}
				if err := c.CNIDel(cid, "net1"); err != nil {
					fail(fmt.Errorf("cni del: %w", err))
				}
				if err := c.Free(a.ID); err != nil && !refused(err) {
					fail(fmt.Errorf("free: %w", err))
				}
			}
		}()
	}
	wg.Add(1)
	go func() { // the operator
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			tmp := cfg + ".tmp"
			os.WriteFile(tmp, []byte(configs[i%2]), 0o644)
			os.Rename(tmp, cfg)
			if i%3 == 0 {
				if err := d.Reload(ctx); err != nil && ctx.Err() == nil {
					fail(fmt.Errorf("reload: %w", err))
				}
			}
			time.Sleep(time.Duration(20+i%7*30) * time.Millisecond) // the operator's pace, not synchronisation
		}
	}()

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		buf := make([]byte, 1<<22)
		t.Fatalf("calls still hang 56 s after the load stopped:\n%s", buf[:runtime.Stack(buf, true)])
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Afterwards the daemon still answers, and holds nothing.
	s, err := c.Status()
	if err != nil {
		t.Fatal(err)
	}
	if s.Allocations != 0 || s.Attachments != 0 || s.Netdevs[0].Flows != 0 {
		t.Errorf("left behind: %d allocations, %d attachments, %d flows", s.Allocations, s.Attachments, s.Netdevs[0].Flows)
	}
	if l, err := c.Allocations(""); err != nil || len(l.Allocations) != 0 || len(l.Attachments) != 0 {
		t.Errorf("left behind: %+v %v", l, err)
	}
}
