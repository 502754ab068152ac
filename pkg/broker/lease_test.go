package broker_test

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/client"
	"github.com/xdpq/xdpq/pkg/wire"
	"github.com/xdpq/xdpq/pkg/xsk"
)

var allowTX = wire.Limits{MaxUMEM: 64 << 20, MaxRing: 4096, AllowTX: true, MaxQueue: 8}

// TestLease: a client gets both queues' sockets, receives and transmits
// byte-exact; closing the lease takes the sockets out of the XSKMAP and
// frees the queues for the next lease.
func TestLease(t *testing.T) {
	e := newEnv(t, rootOwned, allowTX)
	pr := e.peer(t)
	l, err := client.Connect(e.alloc.SocketPath(), client.Options{Name: "test", TX: true, Ring: 1024})
	if err != nil {
		t.Fatal(err)
	}
	if l.Netdev != "xa" || len(l.Sockets) != 2 || l.ZeroCopy || l.BusyPoll != nil {
		t.Fatalf("lease %+v", l)
	}
	// The lease was reported, with the sockets the client holds, before
	// the client heard it was active; they are in the XSKMAP.
	recorded := e.leases.snapshot()
	if len(recorded) != 1 || !slices.Equal(recorded[0].socks, clientSockets(t, l)) {
		t.Errorf("OnLease reported %+v; the client holds %+v", recorded, clientSockets(t, l))
	}
	if s := e.sockets(); !slices.Equal(s, []uint32{0, 1}) {
		t.Errorf("sockets in the XSKMAP: %v", s)
	}
	for i, q := range l.Queues {
		want := frames(e.p.B, e.p.A, q, 500)
		if err := pr.Send[i].Send(want, time.Now().Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
		r, err := traffic.NewReceiver(l.Sockets[i], nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Expect(want, time.Now().Add(5*time.Second)); err != nil {
			t.Fatalf("queue %d: %v", q, err)
		}
		back := frames(e.p.A, e.p.B, 100+q, 500)
		if err := traffic.NewSender(l.Sockets[i], l.TXFrames(i), 0).Send(back, time.Now().Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
		if err := pr.Recv[i].Expect(back, time.Now().Add(5*time.Second)); err != nil {
			t.Fatalf("queue %d back: %v", q, err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	e.waitEnded(t, e.alloc.ID)
	if s := e.sockets(); len(s) != 0 {
		t.Errorf("sockets in the XSKMAP after the lease: %v", s)
	}
	l2, err := client.Connect(e.alloc.SocketPath(), client.Options{Ring: 64})
	if err != nil {
		t.Fatalf("the next lease: %v", err)
	}
	l2.Close()
}

// clientSockets returns what the lease's sockets are to the kernel.
func clientSockets(t *testing.T, l *client.Lease) []broker.LeaseSocket {
	t.Helper()
	var out []broker.LeaseSocket
	for i, s := range l.Sockets {
		var st unix.Stat_t
		if err := unix.Fstat(s.FD(), &st); err != nil {
			t.Fatal(err)
		}
		out = append(out, broker.LeaseSocket{Queue: l.Queues[i], Inode: st.Ino})
	}
	return out
}

// TestRefusals: every bad request is refused with a reason, the daemon
// keeps no descriptor of it, and the allocation stays usable.
func TestRefusals(t *testing.T) {
	e := newEnv(t, rootOwned, wire.Limits{MaxUMEM: 1 << 20, MaxRing: 1024, AllowTX: false, MaxQueue: 8})
	hello := `{"type":"hello","version":1,"client":"t"}`
	memfd := func(size int64, seal bool) int {
		if seal {
			f, err := xsk.NewMemfd("t", size, false)
			if err != nil {
				t.Fatal(err)
			}
			fd, _ := unix.Dup(int(f.Fd()))
			f.Close()
			return fd
		}
		fd, _ := unix.MemfdCreate("t", unix.MFD_ALLOW_SEALING)
		if err := unix.Ftruncate(fd, size); err != nil {
			t.Fatal(err)
		}
		return fd
	}
	request := func(queues string, rings string) string {
		return `{"type":"request","frame_size":2048,"rings":` + rings + `,"queues":` + queues + `}`
	}
	rx64 := `{"fill":64,"completion":64,"rx":64,"tx":0}`
	// A lease first: whatever the process opens once (the agent's
	// notification socket, the runtime's poller) is open before counting.
	warm, err := client.Connect(e.alloc.SocketPath(), client.Options{Ring: 64})
	if err != nil {
		t.Fatal(err)
	}
	warm.Close()
	e.waitEnded(t, e.alloc.ID)
	type step struct {
		msg string
		fds func() []int
	}
	one := func(size int64, seal bool) func() []int { return func() []int { return []int{memfd(size, seal)} } }
	for _, c := range []struct {
		name   string
		steps  []step
		code   string
		reason string
	}{
		{"malformed json", []step{{msg: `{"type":"hello",`}}, wire.CodeBadMessage, "not a protocol message"},
		{"unknown field", []step{{msg: `{"type":"hello","version":1,"admin":true}`}}, wire.CodeBadMessage, "unknown field"},
		{"unknown version", []step{{msg: `{"type":"hello","version":99}`}}, wire.CodeVersion, "speaks 1"},
		{"fd on hello", []step{{msg: hello, fds: one(4096, true)}}, wire.CodeBadMessage, "no descriptor"},
		{"oversized memfd", []step{{msg: hello}, {msg: request("[0]", rx64), fds: one(2<<20, true)}}, wire.CodeLimit, "at most 1048576"},
		{"unsealed memfd", []step{{msg: hello}, {msg: request("[0]", rx64), fds: one(1<<20, false)}}, wire.CodeBadRequest, "not sealed"},
		{"queue not given", []step{{msg: hello}, {msg: request("[3]", rx64), fds: one(1<<20, true)}}, wire.CodeForbidden, "queue 3 was not given"},
		{"two fds", []step{{msg: hello}, {msg: request("[0]", rx64), fds: func() []int { return []int{memfd(1<<20, true), memfd(4096, true)} }}}, wire.CodeBadRequest, "exactly one descriptor"},
		{"too many fds", []step{{msg: hello}, {msg: request("[0]", rx64), fds: func() []int { return []int{memfd(1<<20, true), memfd(4096, true), memfd(4096, true)} }}}, wire.CodeBadMessage, "too many descriptors"},
		{"unknown type", []step{{msg: hello}, {msg: `{"type":"ready"}`}}, wire.CodeBadMessage, `want "request" or "resume"`},
		{"no memfd", []step{{msg: hello}, {msg: request("[0]", rx64)}}, wire.CodeBadRequest, "exactly one descriptor"},
		{"tx not allowed", []step{{msg: hello}, {msg: request("[0]", `{"fill":64,"completion":64,"rx":64,"tx":64}`), fds: one(1<<20, true)}}, wire.CodeLimit, "receive-only"},
		{"ring too large", []step{{msg: hello}, {msg: request("[0]", `{"fill":2048,"completion":64,"rx":64,"tx":0}`), fds: one(1<<20, true)}}, wire.CodeLimit, "at most 1024"},
		{"never ready", []step{{msg: hello}, {msg: request("[0,1]", rx64), fds: one(1<<20, true)}}, wire.CodeTimeout, "no message within"},
	} {
		t.Run(c.name, func(t *testing.T) {
			// No case becomes a lease; the warm-up lease has ended.
			if e.srv.Leased(e.alloc.ID) {
				t.Fatal("the allocation is leased")
			}
			before := testnet.OpenFDs()
			conn := dial(t, e)
			defer conn.Close()
			buf := make([]byte, wire.MaxMessage)
			var got *wire.Message
			for _, s := range c.steps {
				var fds []int
				if s.fds != nil {
					fds = s.fds()
				}
				if err := xsk.SendFDs(conn, []byte(s.msg), fds); err != nil {
					t.Fatal(err)
				}
				for _, fd := range fds {
					unix.Close(fd)
				}
				// Read what comes back: welcome, sockets, or the refusal.
				for {
					n, rfds, err := xsk.RecvFDs(conn, buf, 4)
					if err != nil {
						t.Fatal(err)
					}
					for _, fd := range rfds {
						unix.Close(fd) // the client's own copies of sockets
					}
					var m wire.Message
					if err := json.Unmarshal(buf[:n], &m); err != nil {
						t.Fatalf("%q: %v", buf[:n], err)
					}
					got = &m
					break
				}
				if got.Type == wire.TypeError {
					break
				}
			}
			if got.Type == wire.TypeSockets { // never ready: wait for the timeout
				n, _, err := xsk.RecvFDs(conn, buf, 0)
				if err != nil {
					t.Fatal(err)
				}
				if err := json.Unmarshal(buf[:n], got); err != nil {
					t.Fatal(err)
				}
			}
			if got.Type != wire.TypeError || got.Code != c.code || !strings.Contains(got.Reason, c.reason) {
				t.Fatalf("got %+v, want %s %q", got, c.code, c.reason)
			}
			// Then the daemon closes the connection.
			if n, _, err := xsk.RecvFDs(conn, buf, 0); n != 0 || (err != nil && !errors.Is(err, io.EOF)) {
				t.Fatalf("after the refusal: %d bytes, %v", n, err)
			}
			conn.Close()
			// A leak is a descriptor that is open now and was not before (one
			// of the warm-up lease may close meanwhile: that is no leak).
			for _, fd := range testnet.FDsLeftOpen(before) {
				t.Errorf("descriptor %s left open", fd)
			}
			if s := e.sockets(); len(s) != 0 {
				t.Errorf("sockets in the XSKMAP after a refusal: %v", s)
			}
		})
	}
	// Disconnect in the middle (after hello, after the request), then a
	// good lease still works and nothing of the broken ones is left.
	before := testnet.OpenFDs()
	conn := dial(t, e)
	xsk.SendFDs(conn, []byte(hello), nil)
	conn.Close()
	conn = dial(t, e)
	xsk.SendFDs(conn, []byte(hello), nil)
	mfd := memfd(1<<20, true)
	xsk.SendFDs(conn, []byte(request("[0,1]", rx64)), []int{mfd})
	unix.Close(mfd)
	conn.Close()
	l, err := client.Connect(e.alloc.SocketPath(), client.Options{Ring: 64})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	// The server reports the end after closing the lease's connection.
	e.waitEnded(t, e.alloc.ID)
	for _, fd := range testnet.FDsLeftOpen(before) {
		t.Errorf("after disconnects mid-handshake, descriptor %s left open", fd)
	}
	if err := e.srv.Add(e.alloc); err == nil {
		t.Error("an allocation was added twice")
	}
}

// TestOneLeaseAtATime: a second client is refused while the first holds
// the allocation, and gets it once the first lets go.
func TestOneLeaseAtATime(t *testing.T) {
	e := newEnv(t, rootOwned, wire.Limits{})
	l, err := client.Connect(e.alloc.SocketPath(), client.Options{Ring: 64})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Connect(e.alloc.SocketPath(), client.Options{Ring: 64, Timeout: 200 * time.Millisecond}); !refusedWith(err, wire.CodeBusy) {
		t.Errorf("second lease: %v", err)
	}
	l.Close()
	e.waitEnded(t, e.alloc.ID)
	// The default limits hand out receive-only sockets.
	if _, err := client.Connect(e.alloc.SocketPath(), client.Options{Ring: 64, TX: true}); !refusedWith(err, wire.CodeLimit) ||
		!strings.Contains(err.Error(), "receive-only") {
		t.Errorf("a TX ring under the default limits: %v", err)
	}
	_, err = client.Connect(e.alloc.SocketPath(), client.Options{Queues: []uint32{7}, Timeout: 5 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "queue 7 is not in allocation alloc-1") {
		t.Errorf("a queue outside the allocation: %v", err)
	}
	l2, err := client.Connect(e.alloc.SocketPath(), client.Options{Ring: 64, Queues: []uint32{1}})
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if len(l2.Sockets) != 1 || l2.Queues[0] != 1 {
		t.Errorf("lease of queue 1: %v", l2.Queues)
	}
	// Removing the allocation ends the lease.
	if err := e.srv.Remove(e.alloc.ID); err != nil {
		t.Fatal(err)
	}
	e.waitEnded(t, e.alloc.ID)
	if s := e.sockets(); len(s) != 0 {
		t.Errorf("sockets in the XSKMAP after Remove: %v", s)
	}
	if _, err := os.Stat(e.alloc.SocketPath()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left after Remove: %v", err)
	}
}

// ownNetdev is the agent of a netdev that is the allocation's alone, as
// the daemon's agent of a netdev-mode pool's netdev in its pod is.
type ownNetdev struct {
	*agent.Agent
	name string
}

func (o ownNetdev) XSKMapFD() (int, error) { return o.Agent.XSKMapFD(o.name) }

// dpdkConn connects to the allocation's socket as DPDK's af_xdp PMD does
// (drivers/net/af_xdp, uds_get_xskmap_fd): write() of each command without
// terminator, recvmsg() of replies into a 128-byte buffer with one
// descriptor of control space. request sends a command (with a
// descriptor, unless sendFD < 0) and returns the reply and the descriptor
// it carried (-1 for none).
func dpdkConn(t *testing.T, path string) (request func(cmd string, sendFD int) (string, int), fd int) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	return func(cmd string, sendFD int) (string, int) {
		t.Helper()
		if sendFD < 0 {
			if _, err := unix.Write(fd, []byte(cmd)); err != nil {
				t.Fatal(err)
			}
		} else if err := unix.Sendmsg(fd, []byte(cmd), unix.UnixRights(sendFD), nil, 0); err != nil {
			t.Fatal(err)
		}
		resp := make([]byte, 128)
		oob := make([]byte, unix.CmsgSpace(4))
		n, oobn, _, _, err := unix.Recvmsg(fd, resp, oob, 0)
		if err != nil {
			t.Fatal(err)
		}
		got := -1
		if msgs, _ := unix.ParseSocketControlMessage(oob[:oobn]); len(msgs) == 1 {
			if fds, _ := unix.ParseUnixRights(&msgs[0]); len(fds) == 1 {
				got = fds[0]
			}
		}
		return string(resp[:n]), got
	}, fd
}

// TestDPDKHandshake speaks the AF_XDP device plugin handshake exactly as
// DPDK's af_xdp PMD does. While the allocation's netdev is shared (a
// queue pool) its XSKMAP is refused, and the log says why; once the
// netdev is the allocation's own (retargeted with a PodDatapath, as the
// daemon does when a netdev-mode pool's netdev is in its pod) the map it
// gets takes a socket it created itself, which then receives.
func TestDPDKHandshake(t *testing.T) {
	e := newEnv(t, rootOwned, wire.Limits{})
	pr := e.peer(t)
	host, _ := os.Hostname()
	request, _ := dpdkConn(t, e.alloc.SocketPath())
	if r, _ := request("/connect,"+host, -1); r != "/host_ok" {
		t.Fatalf("/connect: %q", r)
	}
	if r, fd := request("/xsk_map_fd,xa", -1); r != "/fd_nak" || fd >= 0 {
		t.Fatalf("/xsk_map_fd of a shared netdev: %q %d", r, fd)
	}
	if !slices.Contains(e.logs.snapshot(), "xskmap refused") {
		t.Errorf("the refusal of a shared map is not logged: %q", e.logs.snapshot())
	}
	if err := e.srv.Retarget(e.alloc.ID, e.alloc.Netdev, ownNetdev{e.a, "xa"}); err != nil {
		t.Fatal(err)
	}
	request, fd := dpdkConn(t, e.alloc.SocketPath())
	if r, _ := request("/xsk_map_fd,xa", -1); r != "/fd_nak" {
		t.Fatalf("/xsk_map_fd before /connect: %q", r)
	}
	if r, _ := request("/connect,"+host, -1); r != "/host_ok" {
		t.Fatalf("/connect: %q", r)
	}
	if r, _ := request("/version", -1); r != "0.1" {
		t.Fatalf("/version: %q", r)
	}
	if r, fd := request("/xsk_map_fd,eth9", -1); r != "/fd_nak" || fd >= 0 {
		t.Fatalf("/xsk_map_fd of a netdev not allocated: %q %d", r, fd)
	}
	r, mapFD := request("/xsk_map_fd,xa", -1)
	if r != "/fd_ack" || mapFD < 0 {
		t.Fatalf("/xsk_map_fd: %q %d", r, mapFD)
	}
	if r, _ := request("/bogus", -1); r != "/nak" {
		t.Fatalf("unknown command: %q", r)
	}

	// As DPDK does with the map: bind its own socket to queue 1 and insert it.
	dev := xsk.Netdev{Name: "xa", Ifindex: e.p.A.Index, NetNS: e.p.NSPath()}
	umem, socks, err := xsk.Open(dev, []uint32{1}, 256, xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048},
		Rings: xsk.Rings{Fill: 256, Completion: 64, RX: 256}})
	if err != nil {
		t.Fatal(err)
	}
	defer umem.Close()
	defer socks[0].Close()
	m, err := ebpf.NewMapFromFD(mapFD)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Update(uint32(1), uint32(socks[0].FD()), ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if err := e.a.AddSocket("xa", 0, socks[0].FD()); err != nil { // the program attaches for the first socket
		t.Fatal(err)
	}
	addrs := make([]uint64, 256)
	for i := range addrs {
		addrs[i] = umem.FrameAddr(i)
	}
	rcv, _ := traffic.NewReceiver(socks[0], addrs)
	want := frames(e.p.B, e.p.A, 1, 100)
	if err := pr.Send[1].Send(want, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := rcv.Expect(want, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}

	// CNDP's busy-poll request, on the client's own AF_XDP socket: none
	// while the pool has no busy polling, then within the pool's setting
	// (which a configuration reload changes for open connections too).
	if r, _ := request("/config_busy_poll,20,64", socks[0].FD()); r != "/config_busy_poll_nak" {
		t.Fatalf("/config_busy_poll without busy polling in the pool: %q", r)
	}
	if err := e.srv.SetLimits(e.alloc.ID, wire.Limits{}, &wire.BusyPoll{TimeoutMicros: 50, Budget: 64}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cmd, want string
	}{
		{"/config_busy_poll,51,64", "/config_busy_poll_nak"},
		{"/config_busy_poll,20,65", "/config_busy_poll_nak"},
		{"/config_busy_poll,1000000,65535", "/config_busy_poll_nak"},
		{"/config_busy_poll,20,64", "/config_busy_poll_ack"},
	} {
		if r, _ := request(c.cmd, socks[0].FD()); r != c.want {
			t.Errorf("%s: %q, want %q", c.cmd, r, c.want)
		}
	}
	if v, _ := unix.GetsockoptInt(socks[0].FD(), unix.SOL_SOCKET, unix.SO_BUSY_POLL); v != 20 {
		t.Errorf("SO_BUSY_POLL %d, want 20", v)
	}
	if v, _ := unix.GetsockoptInt(socks[0].FD(), unix.SOL_SOCKET, unix.SO_PREFER_BUSY_POLL); v != 1 {
		t.Errorf("SO_PREFER_BUSY_POLL %d, want 1", v)
	}
	if r, _ := request("/config_busy_poll,20,64", mapFD); r != "/config_busy_poll_nak" {
		t.Errorf("busy poll on a map fd: %q", r)
	}
	if r, _ := request("/fin", -1); r != "/fin_ack" {
		t.Fatalf("/fin: %q", r)
	}
	if n, _ := unix.Read(fd, make([]byte, 8)); n != 0 {
		t.Error("connection still open after /fin_ack")
	}
	e.a.RemoveSocket("xa", 0, 0)
}

// TestDPDKRefusedPeer: a peer that is not the owner gets /host_nak.
func TestDPDKRefusedPeer(t *testing.T) {
	e := newEnv(t, broker.Owner{UID: uid(12345)}, wire.Limits{})
	c := dial(t, e)
	defer c.Close()
	xsk.SendFDs(c, []byte("/connect,h"), nil)
	buf := make([]byte, 128)
	n, _, _ := xsk.RecvFDs(c, buf, 0)
	if string(buf[:n]) != "/host_nak" {
		t.Fatalf("got %q", buf[:n])
	}
	var _ net.Conn = c
}

// TestSocketLinks: an allocation's socket is also reachable by the other
// paths asked for (DPDK's afxdp.sock beside it, a path outside its
// directory), also after the daemon restarted and made the socket anew;
// the links go with the allocation, and bad ones are refused.
func TestSocketLinks(t *testing.T) {
	e := newEnvWith(t, envConfig{owner: rootOwned, links: []string{"afxdp.sock"}})
	outside := filepath.Join(t.TempDir(), "alloc-1.sock")
	e.stopDaemon(t, false)
	e.allocs[0].Links = append(e.allocs[0].Links, outside)
	e.startDaemon(t, nil)
	for _, path := range e.allocs[0].Links {
		lease := func(when string) {
			t.Helper()
			l, err := client.Connect(path, client.Options{Ring: 64, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatalf("%s: a lease through %s: %v", when, path, err)
			}
			l.Close()
			e.waitEnded(t, e.alloc.ID)
		}
		lease("at first")
		e.stopDaemon(t, false)
		e.startDaemon(t, nil)
		lease("after a restart")
	}
	if err := e.srv.Remove(e.alloc.ID); err != nil {
		t.Fatal(err)
	}
	for _, l := range e.allocs[0].Links {
		if _, err := os.Lstat(l); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after Remove: %v", l, err)
		}
	}
	for _, bad := range []string{"", "relative.sock", e.alloc.SocketPath(), "/a/../b", "/"} {
		a := e.allocs[0]
		a.ID, a.Links = "alloc-bad", []string{bad}
		if err := e.srv.Add(a); err == nil {
			t.Errorf("link %q accepted", bad)
			e.srv.Remove(a.ID)
		}
	}
}

// TestSocketNoPathFollowed: the owner of an allocation can write in its
// directory (standalone: its uid owns it; Kubernetes: the container's
// root). Whatever it leaves at the socket's paths, even symlinks to a
// file of the node, the daemon starting again replaces without following
// them: the file keeps its mode, and the paths are the allocation's
// socket. (This checks the outcome; the race it cannot reach, a swap
// between the bind and the chmod of the socket, listen closes by making
// the socket in a staging directory only root may write.)
func TestSocketNoPathFollowed(t *testing.T) {
	e := newEnvWith(t, envConfig{owner: rootOwned, links: []string{"afxdp.sock"}})
	e.stopDaemon(t, false)
	victim := filepath.Join(t.TempDir(), "shadow")
	if err := os.WriteFile(victim, []byte("secret"), 0o640); err != nil {
		t.Fatal(err)
	}
	for _, p := range append([]string{e.alloc.SocketPath()}, e.allocs[0].Links...) {
		os.Remove(p)
		if err := os.Symlink(victim, p); err != nil {
			t.Fatal(err)
		}
	}
	e.startDaemon(t, nil)
	if fi, err := os.Stat(victim); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("the file the symlinks named: %v %v, want mode 0640", fi.Mode(), err)
	}
	for _, p := range append([]string{e.alloc.SocketPath()}, e.allocs[0].Links...) {
		if fi, err := os.Lstat(p); err != nil || fi.Mode().Type() != os.ModeSocket {
			t.Errorf("%s: %v %v, want the socket", p, fi, err)
		}
	}
	l, err := client.Connect(e.alloc.SocketPath(), client.Options{Ring: 64, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
}

// TestQueueHeldByPreviousHolder: a queue of the allocation is still bound
// by a socket its previous holder has not closed (a deleted pod whose
// process has not exited yet while its queues go to the next pod). The
// client is told busy, not a failure, and keeps trying: once the old
// socket closes, it gets its lease.
func TestQueueHeldByPreviousHolder(t *testing.T) {
	e := newEnv(t, rootOwned, wire.Limits{})
	umem, held, err := xsk.Open(xsk.Netdev{Name: "xa", NetNS: e.p.NSPath(), Ifindex: e.p.A.Index}, []uint32{0}, 64, xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048}, Rings: xsk.Rings{Fill: 64, Completion: 64, RX: 64}})
	if err != nil {
		t.Fatal(err)
	}
	defer umem.Close()
	_, err = client.Connect(e.alloc.SocketPath(), client.Options{Ring: 64, Timeout: 200 * time.Millisecond})
	var pe *wire.ProtocolError
	if !errors.As(err, &pe) || pe.Code != wire.CodeBusy || !strings.Contains(pe.Reason, "previous holder") {
		t.Fatalf("connect while queue 0 is held: %v, want busy naming the previous holder", err)
	}
	refused := func(logs []string) (n int) {
		for _, l := range logs {
			if l == "refused" {
				n++
			}
		}
		return n
	}
	before := refused(e.logs.snapshot())
	got := make(chan error, 1)
	go func() {
		l, err := client.Connect(e.alloc.SocketPath(), client.Options{Ring: 64, Timeout: 20 * time.Second})
		if err == nil {
			l.Close()
		}
		got <- err
	}()
	// Refused again while it is held: the client is retrying.
	e.logs.wait(t, "a second refusal", func(logs []string) bool { return refused(logs) > before })
	if n := e.srv.Refusals()[wire.CodeBusy]; n < 2 {
		t.Errorf("%d busy refusals, want the first connect's and the second's", n)
	}
	held[0].Close()
	if err := <-got; err != nil {
		t.Errorf("connect once the previous holder's socket closed: %v", err)
	}
}

// TestMultiBufferRefused: a bind the kernel refuses for multi-buffer is a
// bad request that says what to do, not an internal error. Here the
// kernel's EOPNOTSUPP of veth in a zero-copy pool; a kernel before 6.6
// says EINVAL, which Bind maps the same way.
func TestMultiBufferRefused(t *testing.T) {
	e := newEnvWith(t, envConfig{owner: rootOwned, limits: wire.DefaultLimits, mode: xsk.ModeZeroCopy})
	l, err := client.Connect(e.alloc.SocketPath(), client.Options{Ring: 64, MultiBuffer: true})
	if err == nil {
		l.Close()
		t.Fatal("a multi-buffer lease in zero-copy mode on veth")
	}
	var pe *wire.ProtocolError
	if !errors.As(err, &pe) || pe.Code != wire.CodeBadRequest || !strings.Contains(pe.Reason, "ask without multi_buffer") {
		t.Fatalf("%v; want a bad request that says to ask without multi_buffer", err)
	}
	t.Log(err)
}
