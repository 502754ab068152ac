package localapi

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/xdpq/xdpq/internal/testing/coretest"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/config"
	"github.com/xdpq/xdpq/pkg/deviceplugin"
	"github.com/xdpq/xdpq/pkg/kubepods"
	"github.com/xdpq/xdpq/pkg/ledger"
	"github.com/xdpq/xdpq/pkg/podflows"
)

// fakeCore is the allocation core as the local API sees it: the shared
// fake of its records and verbs, attachments made with no kernel work,
// kubelet's and the pods' answers, and what it was asked.
type fakeCore struct {
	*coretest.Records
	closed     error
	standalone bool
	podDevs    map[string][]string // what kubelet says pod default/web-0 holds
	pods       *fakePods

	mu       sync.Mutex
	attached []api.CNIAddRequest
	detached []string
}

type fakePods struct {
	byIP    map[netip.Addr]kubepods.Pod
	touched []string
}

func (p *fakePods) ByIP(a netip.Addr) []kubepods.Pod {
	if pod, ok := p.byIP[a]; ok {
		return []kubepods.Pod{pod}
	}
	return nil
}
func (p *fakePods) Touch(uid string) { p.touched = append(p.touched, uid) }

func (f *fakeCore) Closed() error    { return f.closed }
func (f *fakeCore) Standalone() bool { return f.standalone }
func (f *fakeCore) APIAllocation(a ledger.Allocation) *api.Allocation {
	return &api.Allocation{ID: a.ID, Pool: a.Pool, Netdev: a.Netdev, Queues: a.Queues}
}
func (f *fakeCore) Status(context.Context) (*api.Status, error) { return &api.Status{}, nil }
func (f *fakeCore) Allocations(context.Context, string) (*api.AllocationList, error) {
	return &api.AllocationList{}, nil
}
func (f *fakeCore) Verify(_ context.Context, ref api.AttachmentRef) (*api.Attachment, error) {
	att, ok := f.L.Attachment(ledger.Key(ref.ContainerID, ref.IfName))
	if !ok {
		return nil, api.Errorf(api.ErrNotFound, "no attachment")
	}
	return &att.Attachment, nil
}
func (f *fakeCore) PodDevices(context.Context, string, string) (map[string][]string, error) {
	return f.podDevs, nil
}
func (f *fakeCore) Pods() Pods {
	if f.pods == nil {
		return nil
	}
	return f.pods
}

func (f *fakeCore) FreeDevices(pool string) ([]deviceplugin.Device, error) {
	free, err := f.L.FreeDevices(pool)
	var out []deviceplugin.Device
	for _, d := range free {
		out = append(out, deviceplugin.Device{ID: d.ID, Netdev: d.Netdev, Queue: d.Queues[0], NUMA: -1, Healthy: true})
	}
	return out, err
}

func (f *fakeCore) Attach(_ context.Context, a ledger.Allocation, att ledger.Attachment, _ ledger.Pool) (ledger.Attachment, bool, error) {
	got, again, err := f.L.BeginAttach(a.ID, att)
	if err != nil || again {
		return got, again, err
	}
	f.mu.Lock()
	f.attached = append(f.attached, att.CNIAddRequest)
	f.mu.Unlock()
	return got, false, f.L.EndAttach(got, true)
}

func (f *fakeCore) Detach(_ context.Context, ref api.AttachmentRef) error {
	key := ledger.Key(ref.ContainerID, ref.IfName)
	if _, found, err := f.L.BeginDetach(key); !found || err != nil {
		return err
	}
	f.mu.Lock()
	f.detached = append(f.detached, key)
	f.mu.Unlock()
	return f.L.EndDetach(key)
}

// newFakeCore has pools upf (eth1's queues 0-3, granted 10.9.0.0/24)
// and vip (eth2's, granted 10.50.0.0/24), and vf, a netdev pool of eth3.
func newFakeCore(t *testing.T) *fakeCore {
	t.Helper()
	r := coretest.New(t,
		ledger.Pool{Name: "upf", Resource: "xdpq.io/upf", Devices: coretest.Queues("eth1", 4),
			Config: config.Pool{Name: "upf", SharedDestinations: []string{"10.9.0.0/24"}}},
		ledger.Pool{Name: "vip", Resource: "xdpq.io/vip", Devices: coretest.Queues("eth2", 2),
			Config: config.Pool{Name: "vip", SharedDestinations: []string{"10.50.0.0/24"}}},
		ledger.Pool{Name: "vf", Resource: "xdpq.io/vf", Devices: []ledger.Device{{ID: "eth3", Netdev: "eth3", Queues: []uint32{0}, NUMA: -1}},
			Config: config.Pool{Name: "vf", Mode: api.ModeNetdev}})
	r.NodeAddrs = []netip.Addr{netip.MustParseAddr("192.0.2.7")}
	return &fakeCore{Records: r,
		pods: &fakePods{byIP: map[netip.Addr]kubepods.Pod{netip.MustParseAddr("10.244.0.9"): {UID: "uid-other", Namespace: "shop", Name: "cart-0"}}}}
}

func allocate(t *testing.T, f *fakeCore, pool string, devs ...string) ledger.Allocation {
	t.Helper()
	a, err := f.Allocate(context.Background(), ledger.Reservation{Pool: pool, Devices: devs, Owner: ledger.Owner{AnyPod: true}})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func udpTo(addr string, port uint16) []api.CNIFlow {
	a := netip.MustParseAddr(addr)
	return []api.CNIFlow{{Protocol: "udp", Dst: netip.PrefixFrom(a, a.BitLen()), DstPort: port}}
}

// TestCNIAddDecisions: what the local API decides of a CNI ADD before
// the core makes the attachment: the allocation it is for (by id, by
// device, or by what kubelet says the pod holds), the request's own
// faults, flows that would take the node's, another pod's or another
// pool's address, a netdev pool's chained or netns-less ADD, and ids
// that name the daemon's own attachments. Each refusal is what it is and
// reaches no core verb; an ADD that passes is the core's to make, its
// v4-mapped addresses written as v4 ones, and its pod told.
func TestCNIAddDecisions(t *testing.T) {
	pod := netip.MustParseAddr("10.244.0.5")
	base := api.CNIAddRequest{ContainerID: "c1", IfName: "net1", PodUID: "uid-web", PodNamespace: "default", PodName: "web-0",
		Addresses: []netip.Addr{pod}, Flows: udpTo(pod.String(), 2152)}
	for _, c := range []struct {
		name    string
		mod     func(*api.CNIAddRequest, ledger.Allocation)
		podDevs map[string][]string
		closed  bool
		kind    error
		says    string // "" attached
	}{
		{name: "by allocation id", mod: func(r *api.CNIAddRequest, a ledger.Allocation) { r.Allocation = a.ID }},
		{name: "by device id", mod: func(r *api.CNIAddRequest, a ledger.Allocation) { r.DeviceID, r.Resource = "eth1-q1", "xdpq.io/upf" }},
		{name: "by kubelet's devices", podDevs: map[string][]string{"xdpq.io/upf": {"eth1-q0"}}},
		{name: "a v4-mapped address", mod: func(r *api.CNIAddRequest, a ledger.Allocation) {
			r.Allocation = a.ID
			r.Addresses = []netip.Addr{netip.AddrFrom16(pod.As16())}
			r.Flows = udpTo(netip.AddrFrom16(pod.As16()).String(), 2152)
		}},
		{name: "no container id", mod: func(r *api.CNIAddRequest, a ledger.Allocation) { r.ContainerID = "" }, kind: api.ErrInvalid,
			says: "container id and interface name are required"},
		{name: "an annotated flows' id", mod: func(r *api.CNIAddRequest, a ledger.Allocation) {
			r.Allocation, r.ContainerID = a.ID, podflows.Ref("uid-web", "upf").ContainerID
		}, kind: api.ErrInvalid, says: "name the attachments of pods' annotated flows"},
		{name: "an allocation not there", mod: func(r *api.CNIAddRequest, a ledger.Allocation) { r.Allocation = "upf-gone" },
			kind: api.ErrNotFound, says: `no allocation "upf-gone"`},
		{name: "a device no allocation holds", mod: func(r *api.CNIAddRequest, a ledger.Allocation) { r.DeviceID = "eth1-q3" },
			kind: api.ErrNotFound, says: `no allocation holds device "eth1-q3"`},
		{name: "a pod kubelet gives no device", podDevs: map[string][]string{}, kind: api.ErrNoDevices, says: "kubelet assigns pod default/web-0 no xdpq device"},
		{name: "while closed", mod: func(r *api.CNIAddRequest, a ledger.Allocation) { r.Allocation = a.ID }, closed: true,
			kind: api.ErrUnavailable, says: "being uninstalled"},
		{name: "mtu on a queue pool", mod: func(r *api.CNIAddRequest, a ledger.Allocation) { r.Allocation, r.MTU = a.ID, 1400 },
			kind: api.ErrInvalid, says: "mtu applies to netdev-mode pools"},
		{name: "a flow to an address not the pod's", mod: func(r *api.CNIAddRequest, a ledger.Allocation) {
			r.Allocation, r.Flows = a.ID, udpTo("10.244.0.77", 53)
		}, kind: api.ErrInvalid, says: "pool upf:"},
		{name: "the node's address", mod: func(r *api.CNIAddRequest, a ledger.Allocation) {
			r.Allocation, r.Addresses, r.Flows = a.ID, []netip.Addr{netip.MustParseAddr("192.0.2.7")}, udpTo("192.0.2.7", 22)
		}, kind: api.ErrInvalid, says: "an address of the node"},
		{name: "another pod's address", mod: func(r *api.CNIAddRequest, a ledger.Allocation) {
			r.Allocation, r.Addresses, r.Flows = a.ID, []netip.Addr{netip.MustParseAddr("10.244.0.9")}, udpTo("10.244.0.9", 80)
		}, kind: api.ErrConflict, says: "address 10.244.0.9 is pod shop/cart-0's"},
		{name: "an address granted to another pool", mod: func(r *api.CNIAddRequest, a ledger.Allocation) {
			r.Allocation, r.Addresses, r.Flows = a.ID, []netip.Addr{netip.MustParseAddr("10.50.0.4")}, udpTo("10.50.0.4", 80)
		}, kind: api.ErrConflict, says: "address 10.50.0.4 is granted to pool vip"},
		{name: "an address granted to its own pool", mod: func(r *api.CNIAddRequest, a ledger.Allocation) {
			r.Allocation, r.Flows = a.ID, udpTo("10.9.0.4", 80)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFakeCore(t)
			f.podDevs = c.podDevs
			a := allocate(t, f, "upf", "eth1-q0", "eth1-q1")
			if c.closed {
				f.closed = api.Errorf(api.ErrUnavailable, "xdpq is being uninstalled")
			}
			b := New(f, nil)
			req := base
			if c.mod != nil {
				c.mod(&req, a)
			}
			got, err := b.CNIAdd(context.Background(), req)
			if c.says != "" {
				if !errors.Is(err, c.kind) || !strings.Contains(fmt.Sprint(err), c.says) {
					t.Fatalf("ADD: %v (code %s); want %v saying %q", err, api.CodeOf(err), c.kind, c.says)
				}
				if len(f.attached) > 0 || len(f.L.Attachments()) > 0 {
					t.Errorf("the refused ADD reached the core: %v", f.attached)
				}
				return
			}
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if got.AllocationID != a.ID || len(f.attached) != 1 {
				t.Fatalf("attached %+v to %s (core asked %d times); want allocation %s", got, got.AllocationID, len(f.attached), a.ID)
			}
			for _, addr := range f.attached[0].Addresses {
				if addr.Is4In6() {
					t.Errorf("the core got v4-mapped address %s", addr)
				}
			}
			if !slices.Equal(f.pods.touched, []string{"uid-web"}) {
				t.Errorf("pods touched %v; want the attached pod's", f.pods.touched)
			}
		})
	}
}

// TestCNIAddNetdevPool: a netdev pool's ADD must come with the pod's
// netns and may not be chained (the netdev moves in under the CNI
// interface name).
func TestCNIAddNetdevPool(t *testing.T) {
	f := newFakeCore(t)
	a := allocate(t, f, "vf", "eth3")
	b := New(f, nil)
	req := api.CNIAddRequest{ContainerID: "c1", IfName: "net1", Allocation: a.ID}
	if _, err := b.CNIAdd(context.Background(), req); !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), "needs the pod's netns") {
		t.Errorf("ADD without a netns: %v", err)
	}
	req.Netns, req.Chained = "/proc/self/ns/net", true
	if _, err := b.CNIAdd(context.Background(), req); !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), "not a place in a chain") {
		t.Errorf("a chained ADD: %v", err)
	}
	req.Netns = "/proc/self/ns/mnt"
	req.Chained = false
	if _, err := b.CNIAdd(context.Background(), req); !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), "not a network namespace") {
		t.Errorf("a mount namespace as netns: %v", err)
	}
	if len(f.attached) > 0 {
		t.Errorf("refused ADDs reached the core: %v", f.attached)
	}
}

// TestCNIGCAndCheck: GC ends the runtime's attachments it does not list
// and never a pod's annotated flows; CHECK says when a pool no longer
// grants an attachment's flows.
func TestCNIGCAndCheck(t *testing.T) {
	f := newFakeCore(t)
	a := allocate(t, f, "upf", "eth1-q0")
	b := New(f, nil)
	ctx := context.Background()
	for _, req := range []api.CNIAddRequest{
		{ContainerID: "keep", IfName: "net1", Allocation: a.ID},
		{ContainerID: "gone", IfName: "net1", Allocation: a.ID},
		{ContainerID: "shared", IfName: "net1", Allocation: a.ID, Flows: udpTo("10.9.0.4", 80)},
	} {
		if _, err := b.CNIAdd(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	own := podflows.Ref("uid-web", "upf")
	if _, err := b.AddOwn(ctx, api.CNIAddRequest{ContainerID: own.ContainerID, IfName: own.IfName, Allocation: a.ID}); err != nil {
		t.Fatal(err)
	}
	removed, err := b.CNIGC(ctx, api.GCRequest{Valid: []string{"keep/net1", "shared/net1"}})
	if err != nil || !slices.Equal(removed, []string{"gone/net1"}) || !slices.Equal(f.detached, []string{"gone/net1"}) {
		t.Errorf("GC removed %v (%v), the core detached %v; want gone/net1 alone", removed, err, f.detached)
	}
	if _, err := b.CNICheck(ctx, api.AttachmentRef{ContainerID: "shared", IfName: "net1"}); err != nil {
		t.Errorf("CHECK of a granted flow: %v", err)
	}
	// The operator revokes the grant.
	f.L.SetPools([]ledger.Pool{{Name: "upf", Resource: "xdpq.io/upf", Config: config.Pool{Name: "upf"},
		Devices: []ledger.Device{{ID: "eth1-q0", Netdev: "eth1", Queues: []uint32{0}, NUMA: -1}}}})
	if _, err := b.CNICheck(ctx, api.AttachmentRef{ContainerID: "shared", IfName: "net1"}); !errors.Is(err, api.ErrConflict) ||
		!strings.Contains(err.Error(), "no longer allows the attachment's flows") {
		t.Errorf("CHECK of a flow no longer granted: %v", err)
	}
}

// TestAlloc: xdpqctl alloc is a standalone daemon's: elsewhere it is
// refused as not supported; it asks at least one queue, and gets the
// free ones the device plugin's preference picks, owned by its uid.
func TestAlloc(t *testing.T) {
	f := newFakeCore(t)
	b := New(f, nil)
	ctx := context.Background()
	if _, err := b.Alloc(ctx, api.AllocRequest{Pool: "upf", Count: 1}); !errors.Is(err, api.ErrNotSupported) {
		t.Errorf("alloc on a daemon of kubelet: %v", err)
	}
	f.standalone = true
	if _, err := b.Alloc(ctx, api.AllocRequest{Pool: "upf", Count: 0}); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("alloc of no queue: %v", err)
	}
	got, err := b.Alloc(ctx, api.AllocRequest{Pool: "upf", Count: 3, UID: 1000})
	if err != nil || !slices.Equal(got.Queues, []uint32{0, 1, 2}) {
		t.Fatalf("alloc of 3: %+v, %v; want eth1's queues 0-2", got, err)
	}
	a, _ := f.L.Get(got.ID)
	if a.Owner.UID == nil || *a.Owner.UID != 1000 {
		t.Errorf("owner %+v; want uid 1000", a.Owner)
	}
	if _, err := b.Alloc(ctx, api.AllocRequest{Pool: "upf", Count: 2}); !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "2 queues asked, 1 free") {
		t.Errorf("alloc of more than is free: %v", err)
	}
	if err := b.Free(ctx, got.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.L.Get(got.ID); ok {
		t.Error("freed, and still recorded")
	}
}
