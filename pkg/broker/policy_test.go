package broker_test

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/pkg/client"
	"github.com/xdpq/xdpq/pkg/wire"
)

// TestBusyPoll: the sockets a client receives are set up for the pool's
// busy polling (read back with getsockopt; the budget cannot be read back
// on this kernel), the welcome tells the client; without the setting they
// are left as the kernel makes them.
func TestBusyPoll(t *testing.T) {
	bp := &wire.BusyPoll{TimeoutMicros: 50, Budget: 16}
	e := newEnvWith(t, envConfig{owner: rootOwned, busyPoll: bp})
	check := func(l *client.Lease, timeout, prefer int) {
		t.Helper()
		for i, s := range l.Sockets {
			v, err := unix.GetsockoptInt(s.FD(), unix.SOL_SOCKET, unix.SO_BUSY_POLL)
			if err != nil || v != timeout {
				t.Errorf("queue %d: SO_BUSY_POLL %d (%v), want %d", l.Queues[i], v, err, timeout)
			}
			v, err = unix.GetsockoptInt(s.FD(), unix.SOL_SOCKET, unix.SO_PREFER_BUSY_POLL)
			if err != nil || v != prefer {
				t.Errorf("queue %d: SO_PREFER_BUSY_POLL %d (%v), want %d", l.Queues[i], v, err, prefer)
			}
		}
	}
	l, err := client.Connect(e.alloc.SocketPath(), client.Options{Ring: 64})
	if err != nil {
		t.Fatal(err)
	}
	if l.BusyPoll == nil || *l.BusyPoll != *bp {
		t.Errorf("the lease says busy polling %+v, want %+v", l.BusyPoll, bp)
	}
	check(l, 50, 1)
	l.Close()
	e.waitEnded(t, e.alloc.ID)

	// The pool's busy polling is turned off: the next lease has none.
	if err := e.srv.SetLimits(e.alloc.ID, wire.Limits{}, nil); err != nil {
		t.Fatal(err)
	}
	l, err = client.Connect(e.alloc.SocketPath(), client.Options{Ring: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.BusyPoll != nil {
		t.Errorf("the lease says busy polling %+v, want none", l.BusyPoll)
	}
	check(l, 0, 0)
}

// TestSetLimits: a change of the pool's limits holds for the next lease.
func TestSetLimits(t *testing.T) {
	e := newEnv(t, rootOwned, wire.Limits{})
	connect := func(o client.Options) error {
		o.Ring = max(o.Ring, 64)
		l, err := client.Connect(e.alloc.SocketPath(), o)
		if err != nil {
			return err
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		e.waitEnded(t, e.alloc.ID)
		return nil
	}
	if err := connect(client.Options{TX: true}); !refusedWith(err, wire.CodeLimit) {
		t.Fatalf("a TX ring under the default limits: %v", err)
	}
	if err := e.srv.SetLimits(e.alloc.ID, allowTX, nil); err != nil {
		t.Fatal(err)
	}
	if err := connect(client.Options{TX: true, Ring: 1024}); err != nil {
		t.Fatalf("a TX ring once the pool allows it: %v", err)
	}
	small := allowTX
	small.MaxRing, small.AllowTX = 512, false
	if err := e.srv.SetLimits(e.alloc.ID, small, nil); err != nil {
		t.Fatal(err)
	}
	if err := connect(client.Options{Ring: 1024}); !refusedWith(err, wire.CodeLimit) || !strings.Contains(err.Error(), "at most 512") {
		t.Errorf("a ring beyond the new limit: %v", err)
	}
	if err := connect(client.Options{TX: true, Ring: 512}); !refusedWith(err, wire.CodeLimit) {
		t.Errorf("a TX ring once the pool forbids it again: %v", err)
	}
	if err := connect(client.Options{Ring: 512}); err != nil {
		t.Errorf("within the new limits: %v", err)
	}
	for _, bad := range []*wire.BusyPoll{{TimeoutMicros: 0, Budget: 8}, {TimeoutMicros: 50, Budget: 70000}, {TimeoutMicros: 2_000_000, Budget: 8}} {
		if err := e.srv.SetLimits(e.alloc.ID, allowTX, bad); err == nil {
			t.Errorf("busy polling %+v accepted", *bad)
		}
	}
	if err := e.srv.SetLimits("alloc-9", allowTX, nil); err == nil {
		t.Error("limits of an unknown allocation set")
	}
}
