package client_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/testing/node"
	"github.com/xdpq/xdpq/pkg/client"
	"github.com/xdpq/xdpq/pkg/wire"
)

// TestPoller: one loop over a lease's two sockets hands over every frame
// of bursts on both queues, byte for byte, in order per queue and with
// its socket's index; a loop waiting with nothing anywhere (asleep, or
// spinning on a busy-polling pool) wakes for a frame on either queue;
// and one waiting when the lease closes returns ErrLeaseClosed.
func TestPoller(t *testing.T) {
	for _, tc := range []struct {
		name string
		busy *wire.BusyPoll
	}{{name: "defaults"}, {name: "busy poll", busy: &wire.BusyPoll{TimeoutMicros: 20, Budget: 64}}} {
		t.Run(tc.name, func(t *testing.T) { testPoller(t, tc.busy) })
	}
}

func testPoller(t *testing.T, busy *wire.BusyPoll) {
	n, p := node.StartTB(t, node.Config{Queues: 2, Alloc: []uint32{0, 1}, PeerQueues: []uint32{0, 1}, BusyPoll: busy})
	l, err := client.Connect(n.Alloc.SocketPath(), client.Options{Name: "poller"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if err := n.WaitSockets(2, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	pl := l.Poller()
	if got, err := pl.Receive(20*time.Millisecond, func(int, []byte) { t.Error("a frame on idle queues") }); got != 0 || err != nil {
		t.Fatalf("idle Receive: %d, %v", got, err)
	}

	want := [][][]byte{burst(n, 0)[:512], burst(n, 1)[:512]}
	for q := range want {
		if err := p.Send[q].Send(want[q], time.Now().Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	got := make([][][]byte, 2)
	for len(got[0])+len(got[1]) < len(want[0])+len(want[1]) {
		k, err := pl.Receive(time.Second, func(socket int, b []byte) { got[socket] = append(got[socket], bytes.Clone(b)) })
		if err != nil || k == 0 {
			t.Fatalf("received %d and %d frames of 512 each (%v)", len(got[0]), len(got[1]), err)
		}
	}
	for q := range want {
		for i := range want[q] {
			if i >= len(got[q]) || !bytes.Equal(got[q][i], want[q][i]) {
				t.Fatalf("socket %d: frame %d differs or is missing (%d frames)", q, i, len(got[q]))
			}
		}
	}

	// Asleep with nothing anywhere: a frame on the second queue wakes it.
	// A new Poller has seen no frame, so it sleeps in poll(2) at once
	// rather than napping.
	pl = l.Poller()
	type result struct {
		socket, n int
		err       error
	}
	done := make(chan result, 1)
	go func() {
		r := result{socket: -1}
		r.n, r.err = pl.Receive(-1, func(socket int, _ []byte) { r.socket = socket })
		done <- r
	}()
	if err := p.Send[1].Send(burst(n, 2)[:1], time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || r.n != 1 || r.socket != 1 {
			t.Fatalf("a waiting Receive: %d frames, socket %d, %v; want 1 on socket 1", r.n, r.socket, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a frame on the second queue did not wake the Poller")
	}
	for q := range 2 {
		if st, _ := l.Sockets[q].Statistics(); st.RXRingFull+st.RXFillRingEmptyDescs+st.RXDropped != 0 {
			t.Errorf("socket %d: the kernel counts drops: %+v", q, st)
		}
	}

	// Asleep when a socket's receiver closes (as Lease.Close closes
	// them): it returns ErrLeaseClosed.
	errc := make(chan error, 1)
	go func() {
		for {
			if _, err := pl.Receive(-1, func(int, []byte) {}); err != nil {
				errc <- err
				return
			}
		}
	}()
	if err := client.CloseReceiver(l.Receiver(1)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, client.ErrLeaseClosed) {
			t.Errorf("a closed lease's Poller: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a Poller waiting for ever did not end when the lease closed")
	}
}
