package broker_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/client"
	"github.com/xdpq/xdpq/pkg/wire"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// TestLeaseStats: while a lease is active the server reads its sockets'
// kernel counters through duplicates of its own: a pod that stops
// reading shows first as frames dropped on an empty fill ring, then (its
// fill ring stocked again) as a full RX ring. The duplicates live exactly
// as long as the lease: none is left open when it ends (the queues bind
// again at once), when the server closes (the lease stays for the next
// one), or when the allocation is removed; a resumed lease has them
// again, from the sockets the client sent.
func TestLeaseStats(t *testing.T) {
	e := newEnv(t, rootOwned, allowTX)
	pr := e.peer(t)
	onEvent, next := events(t)
	l, err := client.Connect(e.alloc.SocketPath(), client.Options{Name: "stats", Ring: 64, OnEvent: onEvent})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	socks := clientSockets(t, l)
	e.waitActive(t, e.alloc.ID)
	openCopies(t, socks, 2, "the lease active: the client's and the server's")
	if st := e.srv.Stats(); len(st) != 2 || st[0].Queue != 0 || st[1].Queue != 1 || st[0].Netdev != "xa" ||
		st[0].Allocation != e.alloc.ID || st[0].Statistics != (xsk.Statistics{}) {
		t.Fatalf("stats of a fresh lease: %+v", st)
	}

	// 100 frames to queue 0: the first 64 take the fill ring's frames and
	// fill the RX ring; 36 find the fill ring empty and are dropped.
	if err := pr.Send[0].Send(frames(e.p.B, e.p.A, 0, 100), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	waitStats(t, e.srv, 0, "36 frames dropped on an empty fill ring", func(s xsk.Statistics) bool {
		return s.RXDropped == 36 && s.RXFillRingEmptyDescs > 0 && s.RXRingFull == 0
	})
	// The pod gives frames to the fill ring but still reads nothing: the
	// next 50 find the RX ring full.
	if n := l.Sockets[0].Fill(l.SpareFrames(0)); n != 64 {
		t.Fatalf("fill ring took %d spares", n)
	}
	if err := pr.Send[0].Send(frames(e.p.B, e.p.A, 1, 50), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	waitStats(t, e.srv, 0, "50 frames on a full RX ring", func(s xsk.Statistics) bool {
		return s.RXRingFull == 50 && s.RXDropped == 36
	})
	if st := e.srv.Stats(); st[1].Statistics != (xsk.Statistics{}) {
		t.Errorf("queue 1 received nothing, yet: %+v", st[1])
	}

	// The server closes: the lease stays with the client, the duplicates go.
	e.stopDaemon(t, false)
	next(client.EventLost)
	openCopies(t, socks, 1, "the server closed: the client's alone")
	e.startDaemon(t, map[string][]broker.LeaseSocket{e.alloc.ID: socks})
	next(client.EventResumed)
	e.waitActive(t, e.alloc.ID)
	openCopies(t, socks, 2, "the lease resumed")
	if st := e.srv.Stats(); len(st) != 2 || st[0].RXRingFull != 50 {
		t.Errorf("stats of the resumed lease (the same sockets): %+v", st)
	}

	// The lease ends: nothing keeps the queues bound.
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	e.waitEnded(t, e.alloc.ID)
	openCopies(t, socks, 0, "the lease ended")
	if st := e.srv.Stats(); len(st) != 0 {
		t.Errorf("stats after the lease ended: %+v", st)
	}
	bindAgain(t, e, []uint32{0, 1})

	// Removed with a lease active: its duplicates close at once, though
	// the client (which has not noticed yet) still holds its sockets.
	l2, err := client.Connect(e.alloc.SocketPath(), client.Options{Ring: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	socks2 := clientSockets(t, l2)
	e.waitActive(t, e.alloc.ID)
	openCopies(t, socks2, 2, "the second lease active")
	if err := e.srv.Remove(e.alloc.ID); err != nil {
		t.Fatal(err)
	}
	openCopies(t, socks2, 1, "the allocation removed: the client's alone")
	if st := e.srv.Stats(); len(st) != 0 {
		t.Errorf("stats after Remove: %+v", st)
	}
}

// TestRefusalCounts: every refusal is counted by its code: the owner's bad
// request, a foreign peer.
func TestRefusalCounts(t *testing.T) {
	e := newEnvWith(t, envConfig{owner: broker.Owner{UID: uid(4242)}, limits: allowTX})
	// The test runs as root, not uid 4242: refused as forbidden.
	_, err := client.Connect(e.alloc.SocketPath(), client.Options{Ring: 64})
	if !refusedWith(err, wire.CodeForbidden) {
		t.Fatalf("a foreign peer: %v", err)
	}
	if got := e.srv.Refusals(); got[wire.CodeForbidden] != 1 || len(got) != 1 {
		t.Errorf("refusals %v, want forbidden 1", got)
	}
	e2 := newEnv(t, rootOwned, wire.Limits{MaxUMEM: 1 << 20, MaxRing: 64, MaxQueue: 8})
	_, err = client.Connect(e2.alloc.SocketPath(), client.Options{Ring: 128})
	if !refusedWith(err, wire.CodeLimit) {
		t.Fatalf("rings over the limit: %v", err)
	}
	if got := e2.srv.Refusals(); got[wire.CodeLimit] != 1 || len(got) != 1 {
		t.Errorf("refusals %v, want limit 1", got)
	}
}

// waitStats waits until queue q's counters satisfy ok. The kernel counts
// as the receiving side's NAPI runs, and tells no one: poll.
func waitStats(t *testing.T, srv *broker.Server, q uint32, what string, ok func(xsk.Statistics) bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := srv.Stats()
		i := slices.IndexFunc(st, func(s broker.QueueStats) bool { return s.Queue == q })
		if i >= 0 && ok(st[i].Statistics) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: stats %+v", what, st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// openCopies checks how many descriptors of this process (the client's
// and the server's) refer to each socket.
func openCopies(t *testing.T, socks []broker.LeaseSocket, want int, when string) {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, e := range ents {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil {
			count[target]++
		}
	}
	for _, s := range socks {
		if n := count[fmt.Sprintf("socket:[%d]", s.Inode)]; n != want {
			t.Errorf("%s: queue %d's socket is open %d times, want %d", when, s.Queue, n, want)
		}
	}
}

// bindAgain binds new sockets to the queues right after a lease ended:
// with a descriptor of the old sockets left open they stay EBUSY. The
// kernel frees a queue 15-70 ms after its socket's last close, with no
// notification: retried for a second.
func bindAgain(t *testing.T, e *env, queues []uint32) {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for {
		umem, socks, err := xsk.Open(e.alloc.Netdev, queues, 64, xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048},
			Rings: xsk.Rings{Fill: 16, Completion: 16, RX: 16}})
		if err == nil {
			for _, s := range socks {
				s.Close()
			}
			umem.Close()
			return
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			t.Fatalf("bind %v right after the lease: %v", queues, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
