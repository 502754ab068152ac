package daemon

import (
	"testing"

	"github.com/xdpq/xdpq/pkg/config"
	"github.com/xdpq/xdpq/pkg/ledger"
)

// TestServedBy: a pool is served as its config says, else as the
// daemon's default, and only by the device plugin without the DRA
// driver; a pool whose config changes way keeps the old one while
// allocations of the old way hold its devices, saying why, and takes the
// new one once they are gone.
func TestServedBy(t *testing.T) {
	l, err := ledger.Open(ledger.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	pool := func(servedBy string) ledger.Pool {
		return ledger.Pool{Name: "upf", Resource: "xdpq.io/upf", Config: config.Pool{Name: "upf", ServedBy: servedBy},
			Devices: []ledger.Device{{ID: "eth1-q0", Netdev: "eth1", Queues: []uint32{0}, NUMA: -1}, {ID: "eth1-q1", Netdev: "eth1", Queues: []uint32{1}, NUMA: -1}}}
	}
	for _, c := range []struct {
		config, daemon string
		dra            bool
		want           string
	}{
		{"", "", true, ServedByDevicePlugin},
		{"", ServedByDRA, true, ServedByDRA},
		{"", ServedByDRA, false, ServedByDevicePlugin},
		{ServedByDRA, ServedByDevicePlugin, true, ServedByDRA},
		{ServedByDevicePlugin, ServedByDRA, true, ServedByDevicePlugin},
		{ServedByDRA, "", false, ServedByDevicePlugin},
	} {
		d := &Daemon{core: &core{ledger: l, opts: &Options{ServedBy: c.daemon}}}
		if c.dra {
			d.core.opts.DRA = &DRA{}
		}
		p := pool(c.config)
		l.SetPools([]ledger.Pool{p})
		if got, why := d.core.servedBy(p); got != c.want || why != "" {
			t.Errorf("config %q, daemon %q, DRA %v: served by %s (%q), want %s", c.config, c.daemon, c.dra, got, why, c.want)
		}
	}

	// A device plugin allocation holds a device: a pool turned to DRA
	// stays the device plugin's until it ends, and the other way round.
	d := &Daemon{core: &core{ledger: l, opts: &Options{DRA: &DRA{}}}}
	l.SetPools([]ledger.Pool{pool(ServedByDevicePlugin)})
	hold := func(claim *ledger.Claim) string {
		a, err := l.Reserve(ledger.Reservation{Pool: "upf", Devices: []string{"eth1-q0"}, Owner: ledger.Owner{AnyPod: true}, Claim: claim})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Commit(a.ID, nil); err != nil {
			t.Fatal(err)
		}
		return a.ID
	}
	release := func(id string) {
		if _, err := l.BeginFree(id); err != nil {
			t.Fatal(err)
		}
		if err := l.EndFree(id); err != nil {
			t.Fatal(err)
		}
	}
	for _, step := range []struct {
		from, to string
		claim    *ledger.Claim
	}{
		{ServedByDevicePlugin, ServedByDRA, nil},
		{ServedByDRA, ServedByDevicePlugin, &ledger.Claim{UID: "c1", Namespace: "ns", Name: "q"}},
	} {
		l.SetPools([]ledger.Pool{pool(step.from)})
		id := hold(step.claim)
		p := pool(step.to)
		l.SetPools([]ledger.Pool{p})
		if got, why := d.core.servedBy(p); got != step.from || why == "" {
			t.Errorf("%s to %s with an allocation of %s: served by %s (%q), want %s and why", step.from, step.to, step.from, got, why, step.from)
		}
		release(id)
		if got, why := d.core.servedBy(p); got != step.to || why != "" {
			t.Errorf("%s to %s once its allocation is gone: served by %s (%q)", step.from, step.to, got, why)
		}
	}
}
