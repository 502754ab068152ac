package xdp_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/xdp"
)

func bpffsDir(t *testing.T) string {
	t.Helper()
	if err := xdp.MountBPFFS(xdp.DefaultBPFFS); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(xdp.DefaultBPFFS, "xdpq-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func progID(t *testing.T, p *ebpf.Program) ebpf.ProgramID {
	t.Helper()
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

func mapID(t *testing.T, m *ebpf.Map) ebpf.MapID {
	t.Helper()
	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

// TestLoadPinnedAcrossKinds: the XSKMAP and the counters a direct program
// pinned are taken by a filter program loaded on the same pins, and back;
// the filter's flow map is pinned while it is the kind, and its pin goes
// with it.
func TestLoadPinnedAcrossKinds(t *testing.T) {
	testnet.RequireRoot(t)
	pins := filepath.Join(bpffsDir(t), "xa")
	opts := xdp.LoadOptions{Queues: 4}
	direct, err := xdp.LoadPinned(xdp.Direct, pins, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	xsks := mapID(t, direct.XSKMap())
	filter, err := xdp.LoadPinned(xdp.Filter, pins, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer filter.Close()
	if got := mapID(t, filter.XSKMap()); got != xsks {
		t.Fatalf("filter on the direct program's pins: xskmap %d, want %d", got, xsks)
	}
	counters := mapID(t, direct.CounterMap())
	if got := mapID(t, filter.CounterMap()); got != counters {
		t.Fatalf("filter on the direct program's pins: counters %d, want %d", got, counters)
	}
	for _, n := range []string{"flows", "counters"} {
		if _, err := os.Stat(filepath.Join(pins, n)); err != nil {
			t.Errorf("filter's %s not pinned: %v", n, err)
		}
	}
	again, err := xdp.LoadPinned(xdp.Direct, pins, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if got := mapID(t, again.XSKMap()); got != xsks {
		t.Fatalf("direct again: xskmap %d, want %d", got, xsks)
	}
	if got := mapID(t, again.CounterMap()); got != counters {
		t.Fatalf("direct again: counters %d, want %d", got, counters)
	}
	if _, err := os.Stat(filepath.Join(pins, "flows")); !os.IsNotExist(err) {
		t.Errorf("the direct program left the flows pin: %v", err)
	}
	if _, err := xdp.LoadPinned(xdp.Direct, pins, xdp.LoadOptions{Queues: 8}); !errors.Is(err, xdp.ErrPinsIncompatible) {
		t.Errorf("pins sized for 4 queues loaded for 8: %v", err)
	}
}

// TestReplaceKeepsSockets: a direct program is replaced by a filter
// program on its XSKMAP in one netlink request; the link notifications
// never show the netdev without a program, and Replace refuses when the
// expected program is not the one attached.
func TestReplaceKeepsSockets(t *testing.T) {
	p := testnet.NewPair(t, queues)
	direct, err := xdp.Load(xdp.Direct, xdp.LoadOptions{Queues: queues})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	filter, err := xdp.LoadWith(xdp.Filter, xdp.LoadOptions{Queues: queues}, map[string]*ebpf.Map{"xsks": direct.XSKMap()})
	if err != nil {
		t.Fatal(err)
	}
	defer filter.Close()
	if a, b := mapID(t, direct.XSKMap()), mapID(t, filter.XSKMap()); a != b {
		t.Fatalf("LoadWith made xskmap %d, want %d", b, a)
	}
	if _, err := xdp.LoadWith(xdp.Direct, xdp.LoadOptions{Queues: queues}, map[string]*ebpf.Map{"flows": filter.XSKMap()}); err == nil {
		t.Error("a flow map for the direct program was accepted")
	}
	if _, err := xdp.Attach(p.NSPath(), p.A.Index, direct.Prog(), xdp.ModeNative); err != nil {
		t.Fatal(err)
	}
	updates := make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	h, err := netlinkNS(p)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{Namespace: &h}); err != nil {
		t.Fatal(err)
	}
	if err := xdp.Replace(p.NSPath(), p.A.Index, xdp.ModeNative, filter.Prog(), direct.Prog()); err != nil {
		t.Fatal(err)
	}
	a, err := xdp.Query(p.NSPath(), p.A.Index)
	if err != nil || a == nil || a.Kind != xdp.Filter || a.ID != progID(t, filter.Prog()) {
		t.Fatalf("after replace: %+v, %v", a, err)
	}
	// The notification of the replacement names the filter program; none
	// before it shows the hook empty.
	timeout := time.After(5 * time.Second)
	for want := uint32(progID(t, filter.Prog())); ; {
		var u netlink.LinkUpdate
		select {
		case u = <-updates:
		case <-timeout:
			t.Fatal("no notification of the replacement")
		}
		if u.Attrs().Index != p.A.Index || u.Attrs().Xdp == nil {
			continue
		}
		if id := u.Attrs().Xdp.ProgId; id == want {
			break
		} else if id == 0 {
			t.Fatal("the netdev was without a program during the replacement")
		}
	}
	if err := xdp.Replace(p.NSPath(), p.A.Index, xdp.ModeNative, direct.Prog(), direct.Prog()); !errors.Is(err, xdp.ErrOccupied) {
		t.Errorf("replace expecting a program that is not attached: %v", err)
	}
	if err := xdp.Detach(p.NSPath(), p.A.Index, xdp.ModeNative, filter.Prog()); err != nil {
		t.Fatal(err)
	}
}

// TestOpen: an attached program whose pins are gone is opened by id with
// its maps and pinned again elsewhere; a foreign program is refused.
func TestOpen(t *testing.T) {
	p := testnet.NewPair(t, queues)
	dir := bpffsDir(t)
	orig, err := xdp.LoadPinned(xdp.Filter, filepath.Join(dir, "old"), xdp.LoadOptions{Queues: queues})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := xdp.Attach(p.NSPath(), p.A.Index, orig.Prog(), xdp.ModeNative); err != nil {
		t.Fatal(err)
	}
	defer xdp.Detach(p.NSPath(), p.A.Index, xdp.ModeNative, nil)
	id, xsks := progID(t, orig.Prog()), mapID(t, orig.XSKMap())
	orig.Unpin()
	orig.Close()

	got, err := xdp.Open(id)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	if got.Kind() != xdp.Filter || progID(t, got.Prog()) != id || mapID(t, got.XSKMap()) != xsks {
		t.Fatalf("opened %v program %d on xskmap %d, want filter %d on %d", got.Kind(), progID(t, got.Prog()), mapID(t, got.XSKMap()), id, xsks)
	}
	if _, err := got.Flows(); err != nil {
		t.Errorf("opened program's flows: %v", err)
	}
	pins := filepath.Join(dir, "new")
	if err := got.Pin(pins); err != nil {
		t.Fatal(err)
	}
	if err := got.Pin(pins); err != nil {
		t.Errorf("pin again in place: %v", err)
	}
	m, err := ebpf.LoadPinnedMap(filepath.Join(pins, "xsks"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if mapID(t, m) != xsks {
		t.Errorf("pinned xskmap %d, want %d", mapID(t, m), xsks)
	}
	other, err := xdp.Load(xdp.Filter, xdp.LoadOptions{Queues: queues})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.Pin(pins); err == nil || !errors.Is(err, os.ErrExist) {
		t.Errorf("pinning other maps over the pins: %v", err)
	}
	op := foreign(t)
	if _, err := xdp.Open(progID(t, op)); err == nil {
		t.Error("a foreign program opened as xdpq's")
	}
}

func netlinkNS(p *testnet.Pair) (netns.NsHandle, error) { return netns.GetFromPath(p.NSPath()) }
