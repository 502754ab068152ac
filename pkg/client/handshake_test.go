package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/pkg/client"
	"github.com/xdpq/xdpq/pkg/wire"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// The client's decisions in the handshake, against a daemon the test
// scripts on a socket of its own: no socket is ever bound, so any user
// runs them. The tests on veth (receive_test.go) take real leases.

// script is a fake daemon: each connection is answered by answer, which
// gets the client's messages as they come (and the memfd's size, when
// one came) and returns what to send back, or "" to close.
type script struct {
	path     string
	mu       sync.Mutex
	conns    int
	requests []wire.Message
	sizes    []int64 // the memfds' sizes
}

func startScript(t *testing.T, answer func(n int, m wire.Message) (reply wire.Message, fds []int)) *script {
	t.Helper()
	s := &script{path: filepath.Join(t.TempDir(), "xdpq.sock")}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: s.path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns++
			n := s.conns
			s.mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				buf := make([]byte, wire.MaxMessage)
				for {
					k, fds, err := xsk.RecvFDs(c, buf, 4)
					if err != nil || k == 0 {
						return
					}
					var m wire.Message
					if err := json.Unmarshal(buf[:k], &m); err != nil {
						t.Errorf("the client sent %q: %v", buf[:k], err)
						return
					}
					if m.Type == wire.TypeRequest {
						s.mu.Lock()
						s.requests = append(s.requests, m)
						for _, fd := range fds {
							var st unix.Stat_t
							if unix.Fstat(fd, &st) == nil {
								s.sizes = append(s.sizes, st.Size)
							}
						}
						s.mu.Unlock()
					}
					for _, fd := range fds {
						unix.Close(fd)
					}
					reply, out := answer(n, m)
					if reply.Type == "" {
						return
					}
					b, _ := json.Marshal(reply)
					err = xsk.SendFDs(c, b, out)
					for _, fd := range out {
						unix.Close(fd)
					}
					if err != nil {
						return
					}
				}
			})
		}
	})
	return s
}

func (s *script) counts() (conns int, requests []wire.Message, sizes []int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns, append([]wire.Message(nil), s.requests...), append([]int64(nil), s.sizes...)
}

var welcome = wire.Message{Type: wire.TypeWelcome, Version: wire.Version, Allocation: "upf-1", Netdev: "eth1", Queues: []uint32{2, 3},
	Limits: &wire.DefaultLimits}

func refusal(code, reason string) wire.Message {
	return wire.Message{Type: wire.TypeError, Code: code, Reason: reason}
}

// TestConnectRetriesBusy: a busy allocation (a predecessor's connection
// the daemon has not seen close yet) is tried again until it is free or
// the timeout passes, or the caller's context ends; any other refusal
// ends Connect at once, with the daemon's code and reason.
func TestConnectRetriesBusy(t *testing.T) {
	busyThenForbidden := startScript(t, func(n int, m wire.Message) (wire.Message, []int) {
		if n < 4 {
			return refusal(wire.CodeBusy, "allocation upf-1 is in use by another connection"), nil
		}
		return refusal(wire.CodeForbidden, "this allocation belongs to pod a"), nil
	})
	_, err := client.Connect(busyThenForbidden.path, client.Options{Timeout: 10 * time.Second})
	var pe *wire.ProtocolError
	if !errors.As(err, &pe) || pe.Code != wire.CodeForbidden || !strings.Contains(err.Error(), "belongs to pod a") {
		t.Fatalf("Connect: %v; want the forbidden refusal after the busy ones", err)
	}
	if conns, _, _ := busyThenForbidden.counts(); conns != 4 {
		t.Errorf("%d connections, want three busy and the refused one", conns)
	}

	busy := startScript(t, func(int, wire.Message) (wire.Message, []int) {
		return refusal(wire.CodeBusy, "allocation upf-1 is in use by another connection"), nil
	})
	start := time.Now()
	_, err = client.Connect(busy.path, client.Options{Timeout: 300 * time.Millisecond})
	if !errors.As(err, &pe) || pe.Code != wire.CodeBusy {
		t.Errorf("Connect to an allocation busy throughout: %v; want busy", err)
	}
	if conns, _, _ := busy.counts(); conns < 2 || time.Since(start) < 300*time.Millisecond {
		t.Errorf("gave up after %d connections in %v; want retries until the timeout", conns, time.Since(start))
	}

	// The caller gives up while the allocation is busy: at the third
	// refusal.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cancelled := startScript(t, func(n int, _ wire.Message) (wire.Message, []int) {
		if n == 3 {
			cancel()
		}
		return refusal(wire.CodeBusy, "allocation upf-1 is in use by another connection"), nil
	})
	_, err = client.ConnectContext(ctx, cancelled.path, client.Options{Timeout: time.Minute})
	if !errors.Is(err, context.Canceled) || !errors.As(err, &pe) || pe.Code != wire.CodeBusy {
		t.Errorf("ConnectContext cancelled while busy: %v; want busy and the cancellation", err)
	}
}

// TestConnectRequest: what the client asks for from the welcome and its
// options: the allocation's queues (or those asked, which must be the
// allocation's: else nothing is sent), one ring size for fill,
// completion and RX, TX only when asked, and a memfd with a frame for
// every ring entry of every queue, rounded up to whole pages. A daemon
// that answers with other sockets than asked (too few, bound with
// multi-buffer unasked) is not taken at its word.
func TestConnectRequest(t *testing.T) {
	// The daemon answers with no socket at all, or with as many as asked
	// but bound with multi-buffer, which the client did not ask for.
	wrongSockets := func(multiBuffer bool) func(int, wire.Message) (wire.Message, []int) {
		return func(_ int, m wire.Message) (wire.Message, []int) {
			switch m.Type {
			case wire.TypeHello:
				return welcome, nil
			case wire.TypeRequest:
				var out []int
				for range m.Queues {
					if !multiBuffer {
						break
					}
					fds, _ := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
					unix.Close(fds[1])
					out = append(out, fds[0])
				}
				return wire.Message{Type: wire.TypeSockets, Queues: m.Queues, Rings: m.Rings, FrameSize: m.FrameSize, MultiBuffer: multiBuffer}, out
			}
			return wire.Message{}, nil
		}
	}
	for _, c := range []struct {
		name   string
		opts   client.Options
		queues []uint32
		rings  wire.Rings
		size   int64
		mb     bool // the daemon says it bound with multi-buffer
		err    string
	}{
		{name: "defaults", opts: client.Options{Ring: 64}, queues: []uint32{2, 3}, rings: wire.Rings{Fill: 64, Completion: 64, RX: 64},
			size: 2 * (64 + 64) * 2048},
		{name: "multi-buffer not asked for", opts: client.Options{Ring: 64}, queues: []uint32{2, 3}, rings: wire.Rings{Fill: 64, Completion: 64, RX: 64},
			size: 2 * (64 + 64) * 2048, mb: true, err: "asked for multi-buffer false, the daemon bound the sockets with true"},
		{name: "tx, one queue", opts: client.Options{Ring: 32, TX: true, Queues: []uint32{3}, FrameSize: 4096}, queues: []uint32{3},
			rings: wire.Rings{Fill: 32, Completion: 32, RX: 32, TX: 32}, size: (32 + 32 + 32) * 4096},
		{name: "rounded to pages", opts: client.Options{Ring: 1, TX: true, Queues: []uint32{2}}, queues: []uint32{2},
			rings: wire.Rings{Fill: 1, Completion: 1, RX: 1, TX: 1}, size: 8192}, // 3 frames of 2048 bytes
		{name: "a queue not the allocation's", opts: client.Options{Ring: 64, Queues: []uint32{2, 7}},
			err: "queue 7 is not in allocation upf-1 (it has [2 3])"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := startScript(t, wrongSockets(c.mb))
			_, err := client.Connect(s.path, c.opts)
			want := c.err
			if want == "" {
				want = fmt.Sprintf("the daemon sent 0 sockets for %d queues", len(c.queues))
			}
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("Connect: %v; want %q", err, want)
			}
			_, reqs, sizes := s.counts()
			if c.queues == nil {
				if len(reqs) != 0 {
					t.Errorf("sent %+v", reqs)
				}
				return
			}
			if len(reqs) != 1 || len(sizes) != 1 {
				t.Fatalf("requests %+v with memfds of %v bytes; want one with its memfd", reqs, sizes)
			}
			r := reqs[0]
			if !equalQueues(r.Queues, c.queues) || r.Rings == nil || *r.Rings != c.rings || sizes[0] != c.size {
				t.Errorf("request queues %v rings %+v memfd %d bytes; want %v %+v %d", r.Queues, r.Rings, sizes[0], c.queues, c.rings, c.size)
			}
		})
	}
}

func equalQueues(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
