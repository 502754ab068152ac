package dra

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/xdpq/xdpq/internal/testing/coretest"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/config"
	"github.com/xdpq/xdpq/pkg/ledger"
)

// TestPCIeRootsReadOnce: a device's PCIe root is read from sysfs once,
// whatever the number of publishes; each device's is its own.
func TestPCIeRootsReadOnce(t *testing.T) {
	reads := map[string]int{}
	r := pcieRoots{read: func(pci string) string { reads[pci]++; return "pci0000:" + pci[:2] }}
	for range 3 {
		for _, pci := range []string{"0000:3b:00.0", "0000:5e:00.1"} {
			if got := r.get(pci); got != "pci0000:"+pci[:2] {
				t.Errorf("%s: %q", pci, got)
			}
		}
	}
	if reads["0000:3b:00.0"] != 1 || reads["0000:5e:00.1"] != 1 {
		t.Errorf("sysfs read %v, want once each", reads)
	}
}

// fakeCore is the allocation core as the face sees it: the shared fake
// of its records and verbs, the pools DRA serves, and whether it is
// closed.
type fakeCore struct {
	*coretest.Records
	closed error
	dra    map[string]bool // pools DRA serves
}

func (f *fakeCore) Closed() error                            { return f.closed }
func (f *fakeCore) ServedByDRA(p ledger.Pool) (bool, string) { return f.dra[p.Name], "" }
func (f *fakeCore) Netdevs() map[string]NetdevState          { return nil }
func (f *fakeCore) Network(ledger.Allocation) *Network       { return nil }
func (f *fakeCore) Edits(a ledger.Allocation) Edits {
	return Edits{Env: map[string]string{"XDPQ_ALLOCATION": a.ID}}
}

func newFakeCore(t *testing.T) *fakeCore {
	t.Helper()
	r := coretest.New(t,
		ledger.Pool{Name: "dns", Resource: "xdpq.io/dns", Config: config.Pool{Name: "dns"},
			Devices: append(coretest.Queues("eth1", 2), coretest.Queues("eth2", 2)...)},
		ledger.Pool{Name: "dp", Resource: "xdpq.io/dp", Config: config.Pool{Name: "dp"}, Devices: coretest.Queues("eth3", 2)})
	r.NodeAddrs = []netip.Addr{netip.MustParseAddr("192.0.2.7")}
	return &fakeCore{Records: r, dra: map[string]bool{"dns": true}}
}

// TestFacePrepare: kubelet's Prepare and Unprepare as the face decides
// them over a fake core: the claim's allocation made once (the same
// edits when kubelet asks again), owned by its pod, freed by Unprepare;
// claims it must not serve refused as what they are, nothing held.
func TestFacePrepare(t *testing.T) {
	core := newFakeCore(t)
	f := NewFace(FaceConfig{NodeName: "node-1"}, core)
	ctx := context.Background()
	claim := Claim{UID: "u1", Namespace: "default", Name: "c1", Pool: "dns", Devices: []string{"eth1-q0", "eth1-q1"}, Pods: []string{"pod-1"}}
	e, err := f.PrepareClaim(ctx, claim)
	if err != nil {
		t.Fatal(err)
	}
	a, ok := core.L.ByClaim("u1")
	if !ok || e.Env["XDPQ_ALLOCATION"] != a.ID || a.Owner.PodUID != "pod-1" || !slices.Equal(a.Devices, []string{"eth1-q0", "eth1-q1"}) {
		t.Fatalf("prepared %+v, allocation %+v (%v); want the claim's devices, owned by its pod, in its edits", e, a, ok)
	}
	if again, err := f.PrepareClaim(ctx, claim); err != nil || again.Env["XDPQ_ALLOCATION"] != a.ID || len(core.L.Allocations()) != 1 {
		t.Errorf("prepared again: %+v, %v; want the same allocation alone", again, err)
	}
	for _, c := range []struct {
		name  string
		claim Claim
		kind  error
		says  string
	}{
		{"another way's pool", Claim{UID: "u2", Pool: "dp", Devices: []string{"eth3-q0"}, Pods: []string{"p"}}, api.ErrConflict, "served by the device plugin"},
		{"two netdevs", Claim{UID: "u2", Namespace: "default", Name: "c2", Pool: "dns", Devices: []string{"eth1-q0", "eth2-q0"}, Pods: []string{"p"}},
			api.ErrInvalid, "queues of netdevs eth1 and eth2"},
		{"a device held", Claim{UID: "u2", Pool: "dns", Devices: []string{"eth1-q1"}, Pods: []string{"p"}}, api.ErrConflict, ""},
		{"the node's address", Claim{UID: "u2", Pool: "dns", Devices: []string{"eth2-q0"}, Pods: []string{"p"},
			Flows: []byte(`[{"protocol": "udp", "destination": "192.0.2.7", "destinationPort": "53"}]`)}, api.ErrInvalid, "an address of the node"},
	} {
		before := len(core.L.Allocations())
		_, err := f.PrepareClaim(ctx, c.claim)
		if !errors.Is(err, c.kind) || !strings.Contains(fmt.Sprint(err), c.says) {
			t.Errorf("%s: %v; want %v saying %q", c.name, err, c.kind, c.says)
		}
		if n := len(core.L.Allocations()); n != before {
			t.Errorf("%s: %d allocations after the refusal, %d before", c.name, n, before)
		}
	}
	core.closed = api.Errorf(api.ErrUnavailable, "uninstalling")
	if _, err := f.PrepareClaim(ctx, Claim{UID: "u3", Pool: "dns", Devices: []string{"eth2-q1"}, Pods: []string{"p"}}); !errors.Is(err, api.ErrUnavailable) {
		t.Errorf("prepare while the core is closed: %v", err)
	}
	core.closed = nil
	if err := f.UnprepareClaim(ctx, "u1"); err != nil {
		t.Fatal(err)
	}
	if len(core.L.Allocations()) != 0 || len(core.Served()) != 0 {
		t.Errorf("unprepared, and %v remain (served %v)", core.L.Allocations(), core.Served())
	}
	select {
	case <-f.Unprepared():
	default:
		t.Error("an Unprepare that freed an allocation did not wake an uninstall waiting for it")
	}
}
