package broker_test

import (
	"encoding/json"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/client"
	"github.com/xdpq/xdpq/pkg/wire"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// events collects a lease's events for a test to wait on.
func events(t *testing.T) (func(client.Event), func(want client.EventKind) client.Event) {
	ch := make(chan client.Event, 16)
	next := func(want client.EventKind) client.Event {
		t.Helper()
		select {
		case ev := <-ch:
			if ev.Kind != want {
				t.Fatalf("lease event %v (%v), want %v", ev.Kind, ev.Err, want)
			}
			return ev
		case <-time.After(10 * time.Second):
			t.Fatalf("no %v event within 10s", want)
		}
		return client.Event{}
	}
	return func(ev client.Event) { ch <- ev }, next
}

// TestResume: the daemon (broker and agent) restarts while a client holds
// a lease of two queues. Traffic arrives byte for byte before, while no
// daemon runs (the program and the XSKMAP stay in the kernel) and after;
// the client notices, resumes by itself with the sockets it holds (no new
// bind), and the new daemon tracks the lease again: closing it frees the
// queues for a fresh lease.
func TestResume(t *testing.T) {
	e := newEnv(t, rootOwned, allowTX)
	pr := e.peer(t)
	onEvent, next := events(t)
	l, err := client.Connect(e.alloc.SocketPath(), client.Options{Name: "resume", TX: true, Ring: 1024, OnEvent: onEvent})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	recorded := e.waitActive(t, e.alloc.ID)
	held := clientSockets(t, l)
	if !slices.Equal(recorded, held) {
		t.Fatalf("recorded %+v, the client holds %+v", recorded, held)
	}
	var rcv []*traffic.Receiver
	for i := range l.Sockets {
		r, err := traffic.NewReceiver(l.Sockets[i], nil)
		if err != nil {
			t.Fatal(err)
		}
		rcv = append(rcv, r)
	}
	flow := func(phase string, stream uint32) {
		t.Helper()
		for i, q := range l.Queues {
			want := frames(e.p.B, e.p.A, stream+q, 300)
			if err := pr.Send[i].Send(want, time.Now().Add(5*time.Second)); err != nil {
				t.Fatal(err)
			}
			if err := rcv[i].Expect(want, time.Now().Add(5*time.Second)); err != nil {
				t.Fatalf("%s, queue %d: %v", phase, q, err)
			}
		}
	}
	flow("before the restart", 0)

	e.stopDaemon(t, false)
	if ev := next(client.EventLost); ev.Err == nil {
		t.Error("the lost event says nothing")
	}
	flow("while no daemon runs", 10)

	e.startDaemon(t, map[string][]broker.LeaseSocket{e.alloc.ID: recorded})
	next(client.EventResumed)
	if got := e.waitActive(t, e.alloc.ID); !slices.Equal(got, recorded) {
		t.Errorf("the new daemon reported %+v, want the recorded %+v", got, recorded)
	}
	if now := clientSockets(t, l); !slices.Equal(now, held) {
		t.Errorf("the client's sockets changed: %+v, were %+v", now, held)
	}
	if s := e.sockets(); !slices.Equal(s, []uint32{0, 1}) {
		t.Errorf("the new agent has sockets on %v, want [0 1]", s)
	}
	flow("after the resume", 20)
	for i, q := range l.Queues {
		back := frames(e.p.A, e.p.B, 100+q, 300)
		if err := traffic.NewSender(l.Sockets[i], l.TXFrames(i), 0).Send(back, time.Now().Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
		if err := pr.Recv[i].Expect(back, time.Now().Add(5*time.Second)); err != nil {
			t.Fatalf("transmitted after the resume, queue %d: %v", q, err)
		}
	}

	// The resumed lease is a lease: closing it frees the queues.
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	e.waitEnded(t, e.alloc.ID)
	if s := e.sockets(); len(s) != 0 {
		t.Errorf("sockets in the XSKMAP after the resumed lease: %v", s)
	}
	l2, err := client.Connect(e.alloc.SocketPath(), client.Options{Ring: 64})
	if err != nil {
		t.Fatalf("a fresh lease after the resumed one: %v", err)
	}
	l2.Close()
}

// TestResumeUnknown: a daemon that has no record of the lease refuses the
// resume; the client reports it failed and stops trying, and once it lets
// the sockets go a fresh lease binds the queues.
func TestResumeUnknown(t *testing.T) {
	e := newEnv(t, rootOwned, wire.Limits{})
	onEvent, next := events(t)
	l, err := client.Connect(e.alloc.SocketPath(), client.Options{Ring: 64, OnEvent: onEvent})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	e.stopDaemon(t, false)
	next(client.EventLost)
	e.startDaemon(t, nil)
	ev := next(client.EventFailed)
	if !refusedWith(ev.Err, wire.CodeForbidden) || !strings.Contains(ev.Err.Error(), "no lease to resume") {
		t.Errorf("failed with %v", ev.Err)
	}
	// Its sockets still hold the queues.
	if _, err := client.Connect(e.alloc.SocketPath(), client.Options{Ring: 64, Timeout: time.Second}); err == nil {
		t.Fatal("a fresh lease bound queues the old lease's sockets hold")
	}
	l.Close()
	l2, err := client.Connect(e.alloc.SocketPath(), client.Options{Ring: 64})
	if err != nil {
		t.Fatalf("a fresh lease once the failed one is closed: %v", err)
	}
	l2.Close()
}

// TestLeaseCloseWhileRedialing: Close stops a lease that is redialing a
// daemon that is not there, and Close from the event callback works.
func TestLeaseCloseWhileRedialing(t *testing.T) {
	e := newEnv(t, rootOwned, wire.Limits{})
	onEvent, next := events(t)
	l, err := client.Connect(e.alloc.SocketPath(), client.Options{Ring: 64, OnEvent: onEvent})
	if err != nil {
		t.Fatal(err)
	}
	e.stopDaemon(t, false)
	next(client.EventLost)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	e.startDaemon(t, nil)

	closed := make(chan error, 1)
	var l2 atomic.Pointer[client.Lease]
	l, err = client.Connect(e.alloc.SocketPath(), client.Options{Ring: 64, OnEvent: func(ev client.Event) {
		if ev.Kind == client.EventLost {
			closed <- l2.Load().Close()
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	l2.Store(l)
	e.stopDaemon(t, false)
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close from the event callback did not return")
	}
	e.startDaemon(t, nil)
}

// rawLease takes a lease of every queue of alloc as a raw client and
// returns its connection and sockets.
func rawLease(t *testing.T, alloc broker.Allocation) (conn *net.UnixConn, socks []int) {
	t.Helper()
	c := dialPath(t, alloc.SocketPath())
	buf := make([]byte, wire.MaxMessage)
	recv := func(maxFDs int, want string) []int {
		t.Helper()
		n, fds, err := xsk.RecvFDs(c, buf, maxFDs)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := wire.ParseMessage(buf[:n], want); err != nil {
			t.Fatalf("%s: %v: %s", want, err, buf[:n])
		}
		return fds
	}
	if err := xsk.SendFDs(c, []byte(`{"type":"hello","version":1}`), nil); err != nil {
		t.Fatal(err)
	}
	recv(0, wire.TypeWelcome)
	mf, err := xsk.NewMemfd("t", 1<<20, false)
	if err != nil {
		t.Fatal(err)
	}
	q, _ := json.Marshal(alloc.Queues)
	err = xsk.SendFDs(c, []byte(`{"type":"request","frame_size":2048,"rings":{"fill":64,"completion":64,"rx":64,"tx":0},"queues":`+string(q)+`}`),
		[]int{int(mf.Fd())})
	mf.Close()
	if err != nil {
		t.Fatal(err)
	}
	socks = recv(len(alloc.Queues), wire.TypeSockets)
	if err := xsk.SendFDs(c, []byte(`{"type":"ready"}`), nil); err != nil {
		t.Fatal(err)
	}
	recv(0, wire.TypeActive)
	return c, socks
}

// TestResumeForged: a resume is refused unless it brings exactly the
// sockets the allocation's lease recorded, each for its queue: not
// another allocation's, not swapped, not a socket of another kind, not a
// fresh AF_XDP socket, not some of them. The genuine one is taken back
// and, closed, frees the queues.
func TestResumeForged(t *testing.T) {
	e := newEnvWith(t, envConfig{owner: rootOwned, twoAllocs: true})
	a1, a2 := e.allocs[0], e.allocs[1]
	c1, s1 := rawLease(t, a1)
	c2, s2 := rawLease(t, a2)
	defer closeAll(s2)
	rec := map[string][]broker.LeaseSocket{a1.ID: e.waitActive(t, a1.ID), a2.ID: e.waitActive(t, a2.ID)}
	e.stopDaemon(t, false)
	c1.Close()
	c2.Close()
	e.startDaemon(t, rec)

	udp, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(udp)
	memfd, err := xsk.NewMemfd("t", 4096, false)
	if err != nil {
		t.Fatal(err)
	}
	defer memfd.Close()
	fresh, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fresh)

	resume := func(alloc broker.Allocation, msg string, fds []int) *wire.Message {
		t.Helper()
		c := dialPath(t, alloc.SocketPath())
		defer c.Close()
		buf := make([]byte, wire.MaxMessage)
		if err := xsk.SendFDs(c, []byte(`{"type":"hello","version":1}`), nil); err != nil {
			t.Fatal(err)
		}
		if n, _, err := xsk.RecvFDs(c, buf, 0); err != nil || !strings.Contains(string(buf[:n]), `"welcome"`) {
			t.Fatalf("welcome: %q %v", buf[:n], err)
		}
		if err := xsk.SendFDs(c, []byte(msg), fds); err != nil {
			t.Fatal(err)
		}
		n, _, err := xsk.RecvFDs(c, buf, 0)
		if err != nil {
			t.Fatal(err)
		}
		var m wire.Message
		if err := json.Unmarshal(buf[:n], &m); err != nil {
			t.Fatal(err)
		}
		return &m
	}
	q01 := `{"type":"resume","queues":[0,1]}`
	for _, c := range []struct {
		name   string
		msg    string
		fds    []int
		code   string
		reason string
	}{
		{"another allocation's sockets", q01, s2, wire.CodeForbidden, "is not one of this allocation's lease"},
		{"another allocation's queues", `{"type":"resume","queues":[2,3]}`, s2, wire.CodeForbidden, "is not one of this allocation's lease"},
		{"swapped", `{"type":"resume","queues":[1,0]}`, s1, wire.CodeForbidden, "is bound to queue 0, not 1"},
		{"not a socket", q01, []int{s1[0], int(memfd.Fd())}, wire.CodeBadRequest, "not a socket"},
		{"not an AF_XDP socket", q01, []int{udp, s1[1]}, wire.CodeBadRequest, "not an AF_XDP socket"},
		{"a fresh AF_XDP socket", q01, []int{s1[0], fresh}, wire.CodeForbidden, "is not one of this allocation's lease"},
		{"some of them", `{"type":"resume","queues":[0]}`, s1[:1], wire.CodeBadRequest, "has 2 sockets"},
		{"fewer sockets than queues", q01, s1[:1], wire.CodeBadRequest, "one socket per queue"},
		{"a queue twice", `{"type":"resume","queues":[0,0]}`, s1, wire.CodeBadRequest, "queue 0 named twice"},
		{"a memfd too", `{"type":"resume","queues":[0,1],"frame_size":2048}`, s1, wire.CodeBadRequest, "only queues"},
	} {
		m := resume(a1, c.msg, c.fds)
		if m.Type != wire.TypeError || m.Code != c.code || !strings.Contains(m.Reason, c.reason) {
			t.Errorf("%s: got %+v, want %s %q", c.name, m, c.code, c.reason)
		}
	}
	if e.srv.Leased(a1.ID) {
		t.Fatal("a forged resume left the allocation leased")
	}
	if evs := e.leases.snapshot(); len(evs) != 2 {
		t.Errorf("forged resumes were reported: %+v", evs[2:])
	}

	// Moving an allocation to another netdev forgets its recorded lease
	// (its sockets are bound where the netdev no longer is); staying where
	// it is does not.
	if err := e.srv.Retarget(a1.ID, a1.Netdev, nil); err != nil {
		t.Fatal(err)
	}
	moved := a2.Netdev
	moved.NetNS = "/proc/self/ns/net"
	if err := e.srv.Retarget(a2.ID, moved, nil); err != nil {
		t.Fatal(err)
	}
	e.waitEnded(t, a2.ID)
	if m := resume(a2, `{"type":"resume","queues":[2,3]}`, s2); m.Code != wire.CodeForbidden || !strings.Contains(m.Reason, "no lease to resume") {
		t.Errorf("resume of a lease forgotten by Retarget: %+v", m)
	}

	// The genuine resume, as a raw client: it is the lease again.
	c := dialPath(t, a1.SocketPath())
	buf := make([]byte, wire.MaxMessage)
	xsk.SendFDs(c, []byte(`{"type":"hello","version":1}`), nil)
	xsk.RecvFDs(c, buf, 0)
	if err := xsk.SendFDs(c, []byte(q01), s1); err != nil {
		t.Fatal(err)
	}
	if n, _, err := xsk.RecvFDs(c, buf, 0); err != nil || string(buf[:n]) != `{"type":"active"}` {
		t.Fatalf("genuine resume: %q %v", buf[:n], err)
	}
	if got := e.waitActive(t, a1.ID); !slices.Equal(got, rec[a1.ID]) {
		t.Errorf("resumed lease reported as %+v, want %+v", got, rec[a1.ID])
	}
	c.Close()
	closeAll(s1)
	e.waitEnded(t, a1.ID)
	l, err := client.Connect(a1.SocketPath(), client.Options{Ring: 64})
	if err != nil {
		t.Fatalf("a fresh lease after the resumed one: %v", err)
	}
	l.Close()
	e.waitEnded(t, a1.ID)
	// The lease is gone: nothing is left to resume.
	if m := resume(a1, q01, s2); m.Code != wire.CodeForbidden || !strings.Contains(m.Reason, "no lease to resume") {
		t.Errorf("resume of an ended lease: %+v", m)
	}
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
