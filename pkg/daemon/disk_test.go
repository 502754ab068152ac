package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/api"
)

// TestAllocNotRecordedLeavesNothing: with the state directory full or
// read-only, alloc is refused, and the refused allocation leaves nothing:
// not listed, its queues free (in memory at once), no broker socket to
// lease from; once the disk can be written again, the same queues are
// allocated. (Before, the allocation stayed listed and served, its
// queues held until a restart: the rollback wrote to the disk that had
// just failed.)
func TestAllocNotRecordedLeavesNothing(t *testing.T) {
	pair := testnet.NewPair(t, 4)
	dir := t.TempDir()
	o := standaloneOpts(t, pair, dir, testPins(t), "pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-1']}}]\n")
	// The state directory on a small file system of its own.
	if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", o.StateDir, "tmpfs", 0, "size=64k,mode=0700"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(o.StateDir, unix.MNT_DETACH) })
	d, _ := runDaemon(t, o)
	ctx := context.Background()

	fill := filepath.Join(o.StateDir, "fill")
	records := filepath.Join(o.StateDir, "allocations")
	for _, c := range []struct {
		name         string
		break_, mend func() error
	}{
		{"full", func() error {
			f, err := os.Create(fill)
			if err != nil {
				return err
			}
			defer f.Close()
			for {
				if _, err := f.Write(make([]byte, 4096)); err != nil {
					if errors.Is(err, syscall.ENOSPC) {
						return nil
					}
					return err
				}
			}
		}, func() error { return os.Remove(fill) }},
		// The records' directory read-only, by a read-only bind mount of
		// its own (the daemon's lock file is open for writing beside it).
		{"read-only", func() error {
			if err := unix.Mount(records, records, "", unix.MS_BIND, ""); err != nil {
				return err
			}
			return unix.Mount("", records, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, "")
		}, func() error { return unix.Unmount(records, 0) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := c.break_(); err != nil {
				t.Fatal(err)
			}
			for range 3 { // more than the pool holds
				if a, err := d.local.Alloc(ctx, api.AllocRequest{Pool: "upf", Count: 2}); err == nil {
					t.Fatalf("alloc on a %s disk answered %+v", c.name, a)
				}
			}
			if l, _ := d.core.Allocations(ctx, ""); len(l.Allocations) != 0 {
				t.Errorf("allocations listed after refusals: %+v", l.Allocations)
			}
			if s, _ := d.core.Status(ctx); len(s.Pools) != 1 || s.Pools[0].Free != 2 || s.Pools[0].Allocations != 0 {
				t.Errorf("pools after refusals: %+v; want both queues free", s.Pools)
			}
			if left, _ := filepath.Glob(filepath.Join(o.AllocDir, "upf-*")); len(left) != 0 {
				t.Errorf("allocation directories left: %v", left)
			}
			if err := c.mend(); err != nil {
				t.Fatal(err)
			}
			a, err := d.local.Alloc(ctx, api.AllocRequest{Pool: "upf", Count: 2})
			if err != nil {
				t.Fatalf("alloc once the disk is writable: %v", err)
			}
			if err := d.local.Free(ctx, a.ID); err != nil {
				t.Fatal(err)
			}
		})
	}
}
