package daemon

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/client"
)

// pod is a lease held by the test as a pod would, with a receiver per
// queue and its client's events.
type pod struct {
	lease  *client.Lease
	recv   []*traffic.Receiver
	events chan client.Event
}

func connectPod(t *testing.T, socket string) *pod {
	t.Helper()
	p := &pod{events: make(chan client.Event, 16)}
	var err error
	p.lease, err = client.Connect(socket, client.Options{Ring: 256, Timeout: 5 * time.Second,
		OnEvent: func(e client.Event) { p.events <- e }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.lease.Close() })
	for i, s := range p.lease.Sockets {
		r, err := traffic.NewReceiver(s, p.lease.RXFrames(i))
		if err != nil {
			t.Fatal(err)
		}
		p.recv = append(p.recv, r)
	}
	return p
}

// expect sends frames on xb's queues 0 and 1 and checks that the pod
// receives them byte for byte.
func (p *pod) expect(t *testing.T, pair *testnet.Pair, when string) {
	t.Helper()
	sent := sendFrames(t, pair, 20)
	for i, q := range p.lease.Queues {
		if err := p.recv[i].Expect(sent[q], time.Now().Add(5*time.Second)); err != nil {
			t.Fatalf("%s: queue %d: %v", when, q, err)
		}
	}
}

// waitEvent waits for the pod's client to report an event of kind.
func (p *pod) waitEvent(t *testing.T, kind client.EventKind) {
	t.Helper()
	for {
		select {
		case e := <-p.events:
			if e.Kind == kind {
				return
			}
			if e.Kind == client.EventFailed {
				t.Fatalf("the lease failed: %v", e.Err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no lease event %v", kind)
		}
	}
}

// allocWithFlow allocates both queues of pool for uid 0 and attaches
// container c1 with the flow sendFrames sends (udp to xa, port 5000).
func allocWithFlow(t *testing.T, d *Daemon, pair *testnet.Pair, pool string) *api.Allocation {
	t.Helper()
	ctx := context.Background()
	a, err := d.local.Alloc(ctx, api.AllocRequest{Pool: pool, Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	flow := api.CNIFlow{Protocol: "udp", Dst: netip.PrefixFrom(pair.PodAddr, 32), DstPort: 5000}
	if _, err := d.local.CNIAdd(ctx, api.CNIAddRequest{ContainerID: "c1", IfName: "net1", Allocation: a.ID, Flows: []api.CNIFlow{flow}, Addresses: []netip.Addr{flow.Dst.Addr()}}); err != nil {
		t.Fatal(err)
	}
	return a
}

func netdevOf(t *testing.T, d *Daemon, name string) api.NetdevStatus {
	t.Helper()
	s, _ := d.core.Status(context.Background())
	for _, n := range s.Netdevs {
		if n.Netdev == name {
			return n
		}
	}
	t.Fatalf("no netdev %s in %+v", name, s.Netdevs)
	return api.NetdevStatus{}
}

// TestRestartWithPod: a pod holds its lease while the daemon restarts.
// Its traffic keeps arriving while no daemon runs; its client notices the
// daemon went and resumes the lease on the new one with the same sockets
// (no re-bind: the queues stay its own); closing the lease then frees the
// queues. A pod that died while the daemon was away leaves nothing: its
// queues are free for the next lease. (Before, the old daemon's Close
// took the sockets out of the XSKMAP, and a restarted one refused the
// pod's reconnect with "queue still in use".)
func TestRestartWithPod(t *testing.T) {
	pair := testnet.NewPair(t, 4)
	dir := t.TempDir()
	o := standaloneOpts(t, pair, dir, testPins(t), "pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-1']}},"+
		" {name: dns, steering: software, devices: {netdevs: ['xa#2-3']}}]\n")
	d, stop := runDaemon(t, o)
	ctx := context.Background()
	a := allocWithFlow(t, d, pair, "upf")
	live := connectPod(t, a.Socket)
	b, err := d.local.Alloc(ctx, api.AllocRequest{Pool: "dns", Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	dying := connectPod(t, b.Socket)
	live.expect(t, pair, "before the restart")

	stop()
	live.waitEvent(t, client.EventLost)
	live.expect(t, pair, "while no daemon runs")
	dying.lease.Close() // the pod dies while the daemon is away

	d, _ = runDaemon(t, o)
	live.waitEvent(t, client.EventResumed)
	live.expect(t, pair, "after the resume")
	if got := netdevOf(t, d, "xa").Sockets; !slices.Equal(got, []uint32{0, 1}) {
		t.Errorf("sockets on xa after the resume %v, want the live pod's [0 1]", got)
	}
	// The dead pod's queues are free: a new lease binds them.
	again := connectPod(t, b.Socket)
	if !slices.Equal(again.lease.Queues, []uint32{2, 3}) {
		t.Errorf("new lease on %v", again.lease.Queues)
	}
	// Closing the resumed lease ends it: a new one binds the same queues.
	live.lease.Close()
	connectPod(t, a.Socket).expect(t, pair, "a fresh lease after the resumed one")
}

// TestLostPins: the daemon stops and its pins go (bpffs not persisted, or
// --pin-dir changed) while its program stays attached and a pod holds
// sockets. The restarted daemon recognises its own program by what it is,
// pins its maps again and reports the netdev as its own, not Overridden;
// the pod's traffic keeps arriving.
func TestLostPins(t *testing.T) {
	pair := testnet.NewPair(t, 4)
	dir := t.TempDir()
	pins := testPins(t)
	o := standaloneOpts(t, pair, dir, pins, "pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-1']}}]\n")
	d, stop := runDaemon(t, o)
	a := allocWithFlow(t, d, pair, "upf")
	p := connectPod(t, a.Socket)
	before := netdevOf(t, d, "xa")
	stop()
	p.waitEvent(t, client.EventLost)
	if err := os.RemoveAll(o.PinDir); err != nil {
		t.Fatal(err)
	}
	o.PinDir = filepath.Join(pins, "elsewhere")
	d, _ = runDaemon(t, o)
	p.waitEvent(t, client.EventResumed)
	after := netdevOf(t, d, "xa")
	if after.State != before.State || after.State == "Overridden" || after.Flows != 1 {
		t.Errorf("xa after its pins went: %+v; before: %+v", after, before)
	}
	if _, err := os.Stat(filepath.Join(o.PinDir, "xa", "xsks")); err != nil {
		t.Errorf("the XSKMAP is not pinned again: %v", err)
	}
	p.expect(t, pair, "after the pins went")
}
