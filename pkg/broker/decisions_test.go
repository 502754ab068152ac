package broker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/wire"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// The broker's decisions without root: who is let in, what a handshake
// refuses, what a lease puts into the XSKMAP and takes out again. The
// kernel's part is faked: the binder hands out sockets of a socketpair
// for AF_XDP ones (xsk.Bind needs CAP_NET_RAW), the datapath records
// what it is asked, and procfs is a directory of the test's that gives
// the test's process the pod cgroup the case has. Peer credentials,
// pidfds, fd passing and the memfd's seals are the kernel's own. The
// tests on veth (lease_test.go, pod_test.go) show the same with real
// sockets in a real XSKMAP.

// fakeDatapath records the sockets it is given and takes back, as
// "add xa/q0 <inode>", "remove xa/q0 <inode>"; failAdd fails AddSocket
// of a queue.
type fakeDatapath struct {
	mu      sync.Mutex
	calls   []string
	failAdd map[uint32]error
}

func (d *fakeDatapath) AddSocket(netdev string, q uint32, fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, fmt.Sprintf("add %s/q%d %d", netdev, q, st.Ino))
	return d.failAdd[q]
}

func (d *fakeDatapath) RemoveSocket(netdev string, q uint32, inode uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, fmt.Sprintf("remove %s/q%d %d", netdev, q, inode))
	return nil
}

func (d *fakeDatapath) took() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.calls
	d.calls = nil
	return c
}

// fakeBinder binds "sockets" that are one end of a socketpair each, or
// fails with err.
type fakeBinder struct {
	mu    sync.Mutex
	err   error
	calls []string // "bind xa [0 1] memfd <size>"
}

func (b *fakeBinder) bind(dev xsk.Netdev, memfd int, queues []uint32, _ xsk.Config) ([]xsk.Bound, error) {
	var st unix.Stat_t
	if err := unix.Fstat(memfd, &st); err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.calls = append(b.calls, fmt.Sprintf("bind %s %v memfd %d", dev.Name, queues, st.Size))
	err := b.err
	b.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var out []xsk.Bound
	for _, q := range queues {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			for _, o := range out {
				unix.Close(o.FD)
			}
			return nil, err
		}
		unix.Close(fds[1])
		out = append(out, xsk.Bound{FD: fds[0], Queue: q})
	}
	return out, nil
}

func (b *fakeBinder) took() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.calls
	b.calls = nil
	return c
}

// fakeEnv is a server of allocation alloc-1 (queues 0 and 1 of xa) with
// a fake kernel.
type fakeEnv struct {
	srv     *broker.Server
	dp      *fakeDatapath
	b       *fakeBinder
	alloc   broker.Allocation
	proc    string // the server's procfs
	leases  *record[leaseEvent]
	refused *record[string] // OnRefuse: "<code> <reason>"
}

type fakeEnvConfig struct {
	owner    broker.Owner
	limits   wire.Limits
	claimPod func(ctx context.Context, alloc string, pod broker.PodIdentity) error
	// resumable is the lease a previous daemon recorded.
	resumable               []broker.LeaseSocket
	maxConns, maxHandshakes int
	stepTimeout             time.Duration // 1s if zero
}

func newFakeEnv(t *testing.T, cfg fakeEnvConfig) *fakeEnv {
	t.Helper()
	e := &fakeEnv{dp: &fakeDatapath{}, b: &fakeBinder{}, proc: t.TempDir(), leases: &record[leaseEvent]{}, refused: &record[string]{}}
	e.inCgroup(t, "0::/user.slice/user-1000.slice/session-1.scope\n")
	if cfg.stepTimeout == 0 {
		cfg.stepTimeout = time.Second
	}
	e.srv = broker.NewUnprivilegedServer(broker.Config{ProcRoot: e.proc, StepTimeout: cfg.stepTimeout, ClaimPod: cfg.claimPod,
		MaxConnections: cfg.maxConns, MaxHandshakes: cfg.maxHandshakes,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnLease: func(alloc string, socks []broker.LeaseSocket) {
			e.leases.add(leaseEvent{alloc, socks})
		},
		OnRefuse: func(_ string, _ broker.Peer, code, reason string) { e.refused.add(code + " " + reason) },
	}, e.dp, e.b.bind)
	t.Cleanup(e.srv.Close)
	e.alloc = broker.Allocation{ID: "alloc-1", Netdev: xsk.Netdev{Name: "xa", Ifindex: 7}, Queues: []uint32{0, 1}, Owner: cfg.owner,
		Limits: cfg.limits, Dir: filepath.Join(t.TempDir(), "alloc-1"), Resumable: cfg.resumable}
	if err := e.srv.Add(e.alloc); err != nil {
		t.Fatal(err)
	}
	return e
}

// inCgroup has the server find the test's process in cgroup (the
// content of /proc/<pid>/cgroup).
func (e *fakeEnv) inCgroup(t *testing.T, cgroup string) {
	t.Helper()
	dir := filepath.Join(e.proc, strconv.Itoa(os.Getpid()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup), 0o644); err != nil {
		t.Fatal(err)
	}
}

// podCgroup is the cgroup of container cid of pod uid, as kubelet's
// cgroupfs driver names it.
func podCgroup(uid, cid string) string { return "0::/kubepods/burstable/pod" + uid + "/" + cid + "\n" }

// The containers of the pods (podA, podB) of the tests.
const (
	ctrA = container
	ctrB = "5b825dc642cb6eb9a060e54bf8d69288fbee4904abcdef0123456789abcdef01"
)

// exchange sends msg with fds (and closes them: the server has its
// copies) and returns the answer and the descriptors it carries.
func exchange(t *testing.T, c *net.UnixConn, msg string, fds ...int) (wire.Message, []int) {
	t.Helper()
	if err := xsk.SendFDs(c, []byte(msg), fds); err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	return receive(t, c)
}

func receive(t *testing.T, c *net.UnixConn) (wire.Message, []int) {
	t.Helper()
	buf := make([]byte, wire.MaxMessage)
	n, fds, err := xsk.RecvFDs(c, buf, 4)
	if err != nil {
		t.Fatal(err)
	}
	var m wire.Message
	if err := json.Unmarshal(buf[:n], &m); err != nil {
		t.Fatalf("%q: %v", buf[:n], err)
	}
	return m, fds
}

// sealedMemfd is a UMEM memfd of size bytes, sealed as the protocol
// asks, or not.
func sealedMemfd(t *testing.T, size int64, seal bool) int {
	t.Helper()
	if seal {
		f, err := xsk.NewMemfd("t", size, false)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fd, err := unix.Dup(int(f.Fd()))
		if err != nil {
			t.Fatal(err)
		}
		return fd
	}
	fd, err := unix.MemfdCreate("t", unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	return fd
}

const (
	hello = `{"type":"hello","version":1,"client":"t"}`
	rx64  = `{"fill":64,"completion":64,"rx":64,"tx":0}`
)

func request(queues, rings string) string {
	return `{"type":"request","frame_size":2048,"rings":` + rings + `,"queues":` + queues + `}`
}

func me() broker.Owner { return broker.Owner{UID: uid(uint32(os.Geteuid()))} }

// TestHandshakeRefusedUnprivileged: every bad request is refused with
// its code and reason, before anything is bound when the request is at
// fault; a bind the kernel refuses is told apart (a queue still held by
// its previous holder: busy, try again; multi-buffer the driver lacks:
// ask without); a socket the XSKMAP does not take undoes the ones it
// took. No descriptor stays open, no socket stays in the XSKMAP, and the
// allocation stays free for the next client.
func TestHandshakeRefusedUnprivileged(t *testing.T) {
	e := newFakeEnv(t, fakeEnvConfig{owner: me(), limits: wire.Limits{MaxUMEM: 1 << 20, MaxRing: 1024, MaxQueue: 8}})
	type step struct {
		msg string
		fds func() []int
	}
	one := func(size int64, seal bool) func() []int {
		return func() []int { return []int{sealedMemfd(t, size, seal)} }
	}
	good := []step{{msg: hello}, {msg: request("[0,1]", rx64), fds: one(1<<20, true)}}
	for _, c := range []struct {
		name    string
		steps   []step
		bindErr error
		failAdd map[uint32]error
		code    string
		reason  string
		bound   bool     // the binder was asked
		dp      []string // the datapath's calls, inodes left out
	}{
		{name: "malformed json", steps: []step{{msg: `{"type":"hello",`}}, code: wire.CodeBadMessage, reason: "not a protocol message"},
		{name: "unknown field", steps: []step{{msg: `{"type":"hello","version":1,"admin":true}`}}, code: wire.CodeBadMessage, reason: "unknown field"},
		{name: "unknown version", steps: []step{{msg: `{"type":"hello","version":99}`}}, code: wire.CodeVersion, reason: "speaks 1"},
		{name: "fd on hello", steps: []step{{msg: hello, fds: one(4096, true)}}, code: wire.CodeBadMessage, reason: "no descriptor"},
		{name: "oversized memfd", steps: []step{{msg: hello}, {msg: request("[0]", rx64), fds: one(2<<20, true)}}, code: wire.CodeLimit, reason: "at most 1048576"},
		{name: "unsealed memfd", steps: []step{{msg: hello}, {msg: request("[0]", rx64), fds: one(1<<20, false)}}, code: wire.CodeBadRequest, reason: "not sealed"},
		{name: "queue not given", steps: []step{{msg: hello}, {msg: request("[3]", rx64), fds: one(1<<20, true)}}, code: wire.CodeForbidden, reason: "queue 3 was not given"},
		{name: "no memfd", steps: []step{{msg: hello}, {msg: request("[0]", rx64)}}, code: wire.CodeBadRequest, reason: "exactly one descriptor"},
		{name: "unknown type", steps: []step{{msg: hello}, {msg: `{"type":"ready"}`}}, code: wire.CodeBadMessage, reason: `want "request" or "resume"`},
		{name: "tx not allowed", steps: []step{{msg: hello}, {msg: request("[0]", `{"fill":64,"completion":64,"rx":64,"tx":64}`), fds: one(1<<20, true)}},
			code: wire.CodeLimit, reason: "receive-only"},
		{name: "ring too large", steps: []step{{msg: hello}, {msg: request("[0]", `{"fill":2048,"completion":64,"rx":64,"tx":0}`), fds: one(1<<20, true)}},
			code: wire.CodeLimit, reason: "at most 1024"},
		{name: "queue held by its previous holder", steps: good, bindErr: fmt.Errorf("bind xa/q0: %w", unix.EBUSY),
			code: wire.CodeBusy, reason: "try again", bound: true},
		{name: "no multi-buffer", steps: good, bindErr: fmt.Errorf("xa/q0: %w", xsk.ErrNoMultiBuffer),
			code: wire.CodeBadRequest, reason: "ask without multi_buffer", bound: true},
		{name: "bind fails", steps: good, bindErr: errors.New("umem: cannot allocate memory"),
			code: wire.CodeInternal, reason: "cannot allocate memory", bound: true},
		{name: "never ready", steps: good, code: wire.CodeTimeout, reason: "no message within", bound: true},
		{name: "xskmap refuses the second socket", steps: append(slices.Clone(good), step{msg: `{"type":"ready"}`}),
			failAdd: map[uint32]error{1: errors.New("map full")}, code: wire.CodeInternal, reason: "map full", bound: true,
			dp: []string{"add xa/q0", "add xa/q1", "remove xa/q0"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e.b.mu.Lock()
			e.b.err = c.bindErr
			e.b.mu.Unlock()
			e.dp.mu.Lock()
			e.dp.failAdd = c.failAdd
			e.dp.mu.Unlock()
			before := testnet.OpenFDs()
			conn := dialPath(t, e.alloc.SocketPath())
			defer conn.Close()
			var got wire.Message
			for _, s := range c.steps {
				var fds []int
				if s.fds != nil {
					fds = s.fds()
				}
				var rfds []int
				got, rfds = exchange(t, conn, s.msg, fds...)
				closeAll(rfds)
				if got.Type == wire.TypeError {
					break
				}
			}
			if got.Type == wire.TypeSockets { // never ready: wait for the timeout
				var rfds []int
				got, rfds = receive(t, conn)
				closeAll(rfds)
			}
			if got.Type != wire.TypeError || got.Code != c.code || !strings.Contains(got.Reason, c.reason) {
				t.Fatalf("got %+v, want %s %q", got, c.code, c.reason)
			}
			buf := make([]byte, 64)
			if n, _, err := xsk.RecvFDs(conn, buf, 0); n != 0 || (err != nil && !errors.Is(err, io.EOF)) {
				t.Fatalf("after the refusal: %d bytes, %v; want the connection closed", n, err)
			}
			conn.Close()
			if bound := len(e.b.took()) > 0; bound != c.bound {
				t.Errorf("bound: %v, want %v", bound, c.bound)
			}
			var dp []string
			for _, call := range e.dp.took() {
				dp = append(dp, call[:strings.LastIndexByte(call, ' ')])
			}
			if !slices.Equal(dp, c.dp) {
				t.Errorf("the datapath was asked %v, want %v", dp, c.dp)
			}
			// The allocation is free again before the client is told.
			if e.srv.Leased(e.alloc.ID) {
				t.Error("the allocation is leased after the refusal")
			}
			for _, fd := range testnet.FDsLeftOpen(before) {
				t.Errorf("descriptor %s left open", fd)
			}
		})
	}
}

func inode(t *testing.T, fd int) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestLeaseLifecycleUnprivileged: a lease's sockets go to the client
// and, once it is ready, into the XSKMAP at their queues; the lease is
// reported (queue and inode) before the client hears it is active; a
// second client is refused as busy while it lasts; when its connection
// closes its sockets leave the XSKMAP, its end is reported, and the
// allocation can be leased again.
func TestLeaseLifecycleUnprivileged(t *testing.T) {
	e := newFakeEnv(t, fakeEnvConfig{owner: me()})
	conn := dialPath(t, e.alloc.SocketPath())
	defer conn.Close()
	welcome, _ := exchange(t, conn, hello)
	if welcome.Type != wire.TypeWelcome || welcome.Allocation != "alloc-1" || welcome.Netdev != "xa" ||
		!slices.Equal(welcome.Queues, []uint32{0, 1}) || welcome.Limits == nil || *welcome.Limits != wire.DefaultLimits {
		t.Fatalf("welcome %+v", welcome)
	}
	socks, fds := exchange(t, conn, request("[0,1]", rx64), sealedMemfd(t, 1<<20, true))
	defer closeAll(fds)
	if socks.Type != wire.TypeSockets || !slices.Equal(socks.Queues, []uint32{0, 1}) || len(fds) != 2 {
		t.Fatalf("sockets %+v with %d descriptors", socks, len(fds))
	}
	if got := e.b.took(); !slices.Equal(got, []string{"bind xa [0 1] memfd 1048576"}) {
		t.Errorf("bound %v", got)
	}
	if got := e.dp.took(); len(got) != 0 {
		t.Errorf("the XSKMAP was given %v before the client was ready", got)
	}
	active, _ := exchange(t, conn, `{"type":"ready"}`)
	if active.Type != wire.TypeActive {
		t.Fatalf("after ready: %+v", active)
	}
	want := []broker.LeaseSocket{{Queue: 0, Inode: inode(t, fds[0])}, {Queue: 1, Inode: inode(t, fds[1])}}
	// Reported before the client was told: it is there already.
	if got, ok := lastLease(e.leases.snapshot(), "alloc-1"); !ok || !slices.Equal(got, want) {
		t.Errorf("the lease reported %v, want %v", got, want)
	}
	added := []string{fmt.Sprintf("add xa/q0 %d", want[0].Inode), fmt.Sprintf("add xa/q1 %d", want[1].Inode)}
	if got := e.dp.took(); !slices.Equal(got, added) {
		t.Errorf("the XSKMAP was given %v, want %v", got, added)
	}
	if !e.srv.Leased("alloc-1") {
		t.Error("the allocation is not leased")
	}

	second := dialPath(t, e.alloc.SocketPath())
	defer second.Close()
	if m, _ := exchange(t, second, hello); m.Type != wire.TypeError || m.Code != wire.CodeBusy {
		t.Errorf("a second client while leased: %+v, want busy", m)
	}

	conn.Close()
	e.waitEnded(t, "alloc-1")
	removed := []string{fmt.Sprintf("remove xa/q0 %d", want[0].Inode), fmt.Sprintf("remove xa/q1 %d", want[1].Inode)}
	if got := e.dp.took(); !slices.Equal(got, removed) {
		t.Errorf("at the lease's end the XSKMAP was asked %v, want %v", got, removed)
	}
	if e.srv.Leased("alloc-1") {
		t.Error("the allocation is still leased")
	}
	again := dialPath(t, e.alloc.SocketPath())
	defer again.Close()
	exchange(t, again, hello)
	m, fds2 := exchange(t, again, request("[1]", rx64), sealedMemfd(t, 1<<20, true))
	closeAll(fds2)
	if m.Type != wire.TypeSockets || !slices.Equal(m.Queues, []uint32{1}) {
		t.Errorf("the next lease: %+v", m)
	}
}

func (e *fakeEnv) waitEnded(t *testing.T, alloc string) {
	t.Helper()
	e.leases.wait(t, "lease of "+alloc+" ended", func(evs []leaseEvent) bool {
		socks, ok := lastLease(evs, alloc)
		return ok && socks == nil
	})
}

// TestOwnerUnprivileged: who may use an allocation, by its owner and
// the peer's credentials and cgroup. A peer that is not the owner is
// refused as forbidden with the reason, counted and reported; an
// allocation for any pod asks ClaimPod and then belongs to the first pod
// it allows.
func TestOwnerUnprivileged(t *testing.T) {
	// (An allocation of another uid is left out: its socket is chowned
	// to that uid, which needs root.)
	for _, c := range []struct {
		name   string
		owner  broker.Owner
		cgroup string // the client's
		claim  error  // ClaimPod's answer; nil: it allows
		reason string // the refusal's; "": welcomed
		claims int    // ClaimPod calls
	}{
		{name: "its uid", owner: me()},
		{name: "its pod", owner: broker.Owner{PodUID: podA}, cgroup: podCgroup(podA, ctrA)},
		{name: "another pod", owner: broker.Owner{PodUID: podA}, cgroup: podCgroup(podB, ctrB), reason: "not to pod " + podB},
		{name: "no pod", owner: broker.Owner{PodUID: podA}, reason: "is in no pod"},
		{name: "its container", owner: broker.Owner{PodUID: podA, ContainerID: ctrA}, cgroup: podCgroup(podA, ctrA)},
		{name: "another container", owner: broker.Owner{PodUID: podA, ContainerID: ctrA}, cgroup: podCgroup(podA, ctrB),
			reason: "belongs to container " + ctrA},
		{name: "any pod, claimed", owner: broker.Owner{AnyPod: true}, cgroup: podCgroup(podA, ctrA), claims: 1},
		{name: "any pod, claim refused", owner: broker.Owner{AnyPod: true}, cgroup: podCgroup(podA, ctrA),
			claim: errors.New("kubelet gave it none of the devices"), reason: "none of the devices", claims: 1},
		{name: "any pod, no pod", owner: broker.Owner{AnyPod: true}, reason: "is for a pod"},
		{name: "no owner", owner: broker.Owner{}, reason: "has no owner"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var claims record[string]
			e := newFakeEnv(t, fakeEnvConfig{owner: c.owner, claimPod: func(_ context.Context, alloc string, pod broker.PodIdentity) error {
				claims.add(alloc + " " + pod.PodUID)
				return c.claim
			}})
			if c.cgroup != "" {
				e.inCgroup(t, c.cgroup)
			}
			conn := dialPath(t, e.alloc.SocketPath())
			defer conn.Close()
			m, _ := exchange(t, conn, hello)
			if got := len(claims.snapshot()); got != c.claims {
				t.Errorf("ClaimPod asked %d times, want %d", got, c.claims)
			}
			if c.reason == "" {
				if m.Type != wire.TypeWelcome {
					t.Fatalf("got %+v, want welcome", m)
				}
				if n := e.srv.Refusals()[wire.CodeForbidden]; n != 0 {
					t.Errorf("%d refusals counted", n)
				}
				if c.owner.AnyPod {
					// Claimed: the allocation is podA's now, no other pod's.
					conn.Close()
					e.inCgroup(t, podCgroup(podB, ctrB))
					second := dialPath(t, e.alloc.SocketPath())
					defer second.Close()
					if m, _ := exchange(t, second, hello); m.Type != wire.TypeError || !strings.Contains(m.Reason, "not to pod "+podB) {
						t.Errorf("another pod after the claim: %+v", m)
					}
				}
				return
			}
			if m.Type != wire.TypeError || m.Code != wire.CodeForbidden || !strings.Contains(m.Reason, c.reason) {
				t.Fatalf("got %+v, want forbidden saying %q", m, c.reason)
			}
			if n := e.srv.Refusals()[wire.CodeForbidden]; n != 1 {
				t.Errorf("%d refusals counted, want 1", n)
			}
			e.refused.wait(t, "the refusal reported", func(r []string) bool {
				return len(r) == 1 && strings.HasPrefix(r[0], wire.CodeForbidden+" ") && strings.Contains(r[0], c.reason)
			})
			if got := e.b.took(); len(got) != 0 {
				t.Errorf("bound for a refused peer: %v", got)
			}
		})
	}
}

// ownDatapath is the datapath of a netdev that is the allocation's
// alone; its XSKMAP is a memfd here.
type ownDatapath struct {
	fakeDatapath
	xskmap int
}

func (d *ownDatapath) XSKMapFD() (int, error) { return unix.Dup(d.xskmap) }

// dpdkSay sends a command of DPDK's af_xdp handshake and returns the
// answer and how many descriptors came with it (closed).
func dpdkSay(t *testing.T, c *net.UnixConn, cmd string, fds ...int) (string, []int) {
	t.Helper()
	if err := xsk.SendFDs(c, []byte(cmd), fds); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256)
	n, got, err := xsk.RecvFDs(c, buf, 2)
	if err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	return string(buf[:n]), got
}

// TestDPDKHandshakeUnprivileged: DPDK's af_xdp driver (use_cni) asks
// the allocation's socket for the netdev's XSKMAP. It is handed out only
// after /connect, only for a netdev that is the allocation's alone
// (retargeted into its pod), and only by that netdev's name; a queue
// pool's map, shared with other allocations, never leaves the daemon.
// Busy polling is configured only within the pool's setting, on an
// AF_XDP socket. What the protocol does not know is /nak; a peer that is
// not the owner hears /host_nak.
func TestDPDKHandshakeUnprivileged(t *testing.T) {
	mapFile, err := unix.MemfdCreate("xskmap", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(mapFile) })
	own := &ownDatapath{xskmap: mapFile}
	pair := func() int {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		unix.Close(fds[1])
		return fds[0]
	}
	type say struct {
		cmd    string
		fd     func() int // a descriptor sent with it
		answer string
		mapFD  bool // the answer carries the XSKMAP
	}
	for _, c := range []struct {
		name   string
		own    bool   // retargeted to a netdev of its own
		cgroup string // the client's, when not the test's own
		steps  []say
	}{
		{name: "queue pool", steps: []say{
			{cmd: "/connect,pod-host", answer: "/host_ok"},
			{cmd: "/version", answer: "0.1"},
			{cmd: "/xsk_map_fd,xa", answer: "/fd_nak"},
			{cmd: "/fin", answer: "/fin_ack"},
		}},
		{name: "own netdev", own: true, steps: []say{
			{cmd: "/xsk_map_fd,xa", answer: "/fd_nak"}, // not connected yet
			{cmd: "/connect,pod-host\x00", answer: "/host_ok"},
			{cmd: "/xsk_map_fd,eth9", answer: "/fd_nak"},
			{cmd: "/xsk_map_fd", answer: "/fd_nak"},
			{cmd: "/xsk_map_fd,xa", answer: "/fd_ack", mapFD: true},
			{cmd: "/fin", answer: "/fin_ack"},
		}},
		{name: "what the protocol does not know", steps: []say{
			{cmd: "/connect,pod-host", answer: "/host_ok"},
			{cmd: "/shell,rm -rf /", answer: "/nak"},
			{cmd: "/version\x01", answer: "/nak"},
			{cmd: "/version", answer: "0.1"},
		}},
		{name: "busy poll the pool does not have", steps: []say{
			{cmd: "/connect,pod-host", answer: "/host_ok"},
			{cmd: "/config_busy_poll,20,64", fd: pair, answer: "/config_busy_poll_nak"},
		}},
		{name: "not the owner", cgroup: podCgroup(podB, ctrB), steps: []say{
			{cmd: "/connect,pod-host", answer: "/host_nak"},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			owner := me()
			if c.cgroup != "" {
				owner = broker.Owner{PodUID: podA}
			}
			e := newFakeEnv(t, fakeEnvConfig{owner: owner})
			if c.cgroup != "" {
				e.inCgroup(t, c.cgroup)
			}
			if c.own {
				if err := e.srv.Retarget(e.alloc.ID, xsk.Netdev{Name: "xa", Ifindex: 3, NetNS: "/proc/self/ns/net"}, own); err != nil {
					t.Fatal(err)
				}
			}
			before := testnet.OpenFDs()
			conn := dialPath(t, e.alloc.SocketPath())
			for _, s := range c.steps {
				var fds []int
				if s.fd != nil {
					fds = []int{s.fd()}
				}
				got, rfds := dpdkSay(t, conn, s.cmd, fds...)
				closeAll(fds)
				if got != s.answer {
					t.Errorf("%q: %q, want %q", s.cmd, got, s.answer)
				}
				if s.mapFD != (len(rfds) == 1) {
					t.Errorf("%q: %d descriptors", s.cmd, len(rfds))
				}
				if s.mapFD && len(rfds) == 1 && inode(t, rfds[0]) != inode(t, mapFile) {
					t.Errorf("%q: a descriptor that is not the netdev's XSKMAP", s.cmd)
				}
				closeAll(rfds)
			}
			conn.Close()
			if got := e.b.took(); len(got) != 0 {
				t.Errorf("bound %v for a DPDK client", got)
			}
			// The server's copies are gone with the connection (the
			// listener's accept loop holds none).
			e.srv.Close()
			for _, fd := range testnet.FDsLeftOpen(before) {
				t.Errorf("descriptor %s left open", fd)
			}
		})
	}
}

// TestResumeRefusedUnprivileged: a client resumes a lease a previous
// daemon recorded by sending back its sockets. A resume with no recorded
// lease, one that is not the whole lease or carries more than queues and
// sockets, and descriptors that are not AF_XDP sockets are refused
// before anything reaches the XSKMAP; the recorded lease stays for the
// client that holds it. A recorded lease that does not fit the
// allocation is refused when the allocation is added.
func TestResumeRefusedUnprivileged(t *testing.T) {
	recorded := []broker.LeaseSocket{{Queue: 0, Inode: 1001}, {Queue: 1, Inode: 1002}}
	udp := func() int {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		return fd
	}
	memfd := func() int { return sealedMemfd(t, 4096, true) }
	for _, c := range []struct {
		name   string
		none   bool // no lease recorded
		msg    string
		fds    []func() int
		code   string
		reason string
	}{
		{name: "no lease recorded", none: true, msg: `{"type":"resume","queues":[0,1]}`, fds: []func() int{udp, udp},
			code: wire.CodeForbidden, reason: "no lease to resume"},
		{name: "fewer sockets than queues", msg: `{"type":"resume","queues":[0,1]}`, fds: []func() int{udp},
			code: wire.CodeBadRequest, reason: "got 1 sockets for queues [0 1]"},
		{name: "part of the lease", msg: `{"type":"resume","queues":[0]}`, fds: []func() int{udp},
			code: wire.CodeBadRequest, reason: "the lease to resume has 2 sockets"},
		{name: "rings with it", msg: `{"type":"resume","queues":[0,1],"rings":{"fill":64,"completion":64,"rx":64,"tx":0}}`,
			fds: []func() int{udp, udp}, code: wire.CodeBadRequest, reason: "only queues and their sockets"},
		{name: "a queue twice", msg: `{"type":"resume","queues":[0,0]}`, fds: []func() int{udp, udp},
			code: wire.CodeBadRequest, reason: "queue 0 named twice"},
		{name: "not AF_XDP sockets", msg: `{"type":"resume","queues":[0,1]}`, fds: []func() int{udp, udp},
			code: wire.CodeBadRequest, reason: "not an AF_XDP socket"},
		{name: "not sockets", msg: `{"type":"resume","queues":[0,1]}`, fds: []func() int{memfd, memfd},
			code: wire.CodeBadRequest, reason: "not a socket"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := fakeEnvConfig{owner: me(), resumable: recorded}
			if c.none {
				cfg.resumable = nil
			}
			e := newFakeEnv(t, cfg)
			before := testnet.OpenFDs()
			conn := dialPath(t, e.alloc.SocketPath())
			defer conn.Close()
			exchange(t, conn, hello)
			var fds []int
			for _, f := range c.fds {
				fds = append(fds, f())
			}
			m, rfds := exchange(t, conn, c.msg, fds...)
			closeAll(rfds)
			if m.Type != wire.TypeError || m.Code != c.code || !strings.Contains(m.Reason, c.reason) {
				t.Fatalf("got %+v, want %s %q", m, c.code, c.reason)
			}
			conn.Close()
			if got := e.dp.took(); len(got) != 0 {
				t.Errorf("the XSKMAP was asked %v", got)
			}
			if got := e.leases.snapshot(); len(got) != 0 {
				t.Errorf("leases reported %v; want the recorded one kept as it was", got)
			}
			e.srv.Close()
			for _, fd := range testnet.FDsLeftOpen(before) {
				t.Errorf("descriptor %s left open", fd)
			}
		})
	}

	srv := broker.NewUnprivilegedServer(broker.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, &fakeDatapath{}, (&fakeBinder{}).bind)
	t.Cleanup(srv.Close)
	for _, c := range []struct {
		lease []broker.LeaseSocket
		says  string
	}{
		{[]broker.LeaseSocket{{Queue: 5, Inode: 1}}, "queue 5 is not the allocation's"},
		{[]broker.LeaseSocket{{Queue: 0, Inode: 1}, {Queue: 0, Inode: 2}}, "queue 0 recorded twice"},
		{[]broker.LeaseSocket{{Queue: 1}}, "queue 1: no inode"},
	} {
		a := broker.Allocation{ID: "alloc-r", Netdev: xsk.Netdev{Name: "xa"}, Queues: []uint32{0, 1}, Owner: me(),
			Dir: filepath.Join(t.TempDir(), "alloc-r"), Resumable: c.lease}
		if err := srv.Add(a); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("Add with the recorded lease %v: %v; want it refused saying %q", c.lease, err, c.says)
		}
	}
}

// TestSocketFilesUnprivileged: an allocation's socket and its other
// names (DPDK's afxdp.sock beside it, a path outside its directory).
// Who may reach them: an owner known by uid has its socket (mode 0600)
// in a directory others may not list (0711); a pod's (uid unknown) are
// open to whoever sees them (0755, 0666), the directory being mounted
// into its container only; sockets are made in a staging directory only
// the daemon may write (0700). Every name answers, also as a restarted
// daemon made them anew over symlinks the owner left there, which are
// replaced, never followed; the names go with the allocation; links
// that are not other absolute paths are refused. (Root's ownership of
// the directory is TestSocketModes', as root.)
func TestSocketFilesUnprivileged(t *testing.T) {
	for _, c := range []struct {
		name              string
		owner             broker.Owner
		dirMode, sockMode os.FileMode
	}{
		{"owned by its uid", me(), 0o711, 0o600},
		{"owned by a pod", broker.Owner{PodUID: podA}, 0o755, 0o666},
	} {
		t.Run(c.name, func(t *testing.T) {
			base := t.TempDir()
			a := broker.Allocation{ID: "alloc-1", Netdev: xsk.Netdev{Name: "xa"}, Queues: []uint32{0}, Owner: c.owner,
				Dir: filepath.Join(base, "alloc-1")}
			a.Links = []string{filepath.Join(a.Dir, "afxdp.sock"), filepath.Join(t.TempDir(), "alloc-1.sock")}
			names := append([]string{a.SocketPath()}, a.Links...)
			victim := filepath.Join(t.TempDir(), "shadow")
			if err := os.WriteFile(victim, []byte("secret"), 0o640); err != nil {
				t.Fatal(err)
			}
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			for run := range 2 {
				if run == 1 {
					// What the owner left while no daemon ran: symlinks
					// to a file of the node at every name.
					for _, p := range names {
						os.Remove(p)
						if err := os.Symlink(victim, p); err != nil {
							t.Fatal(err)
						}
					}
				}
				srv := broker.NewUnprivilegedServer(broker.Config{ProcRoot: t.TempDir(), Logger: log}, &fakeDatapath{}, (&fakeBinder{}).bind)
				if err := srv.Add(a); err != nil {
					t.Fatal(err)
				}
				for path, mode := range map[string]os.FileMode{a.Dir: c.dirMode, names[0]: c.sockMode, names[1]: c.sockMode,
					names[2]: c.sockMode, filepath.Join(base, broker.StagingDir): 0o700} {
					fi, err := os.Lstat(path)
					if err != nil {
						t.Fatal(err)
					}
					if fi.Mode().Perm() != mode {
						t.Errorf("run %d: %s has mode %v, want %v", run, path, fi.Mode().Perm(), mode)
					}
				}
				for _, p := range names {
					if fi, err := os.Lstat(p); err != nil || fi.Mode().Type() != os.ModeSocket {
						t.Fatalf("run %d: %s is %v (%v), want the socket", run, p, fi, err)
					}
				}
				srv.Close() // the names stay for the next daemon
			}
			if fi, err := os.Stat(victim); err != nil || fi.Mode().Perm() != 0o640 {
				t.Errorf("the file the symlinks named: %v %v, want mode 0640 untouched", fi, err)
			}

			// Every name reaches the allocation; Remove takes them all.
			srv := broker.NewUnprivilegedServer(broker.Config{Logger: log}, &fakeDatapath{}, (&fakeBinder{}).bind)
			t.Cleanup(srv.Close)
			if err := srv.Add(a); err != nil {
				t.Fatal(err)
			}
			if c.owner.UID != nil {
				// DPDK's /connect: it takes no lease, so the next name's
				// connection need not wait for this one's end.
				for _, p := range names {
					conn := dialPath(t, p)
					if got, _ := dpdkSay(t, conn, "/connect,pod-host"); got != "/host_ok" {
						t.Errorf("through %s: %q", p, got)
					}
					conn.Close()
				}
			}
			if err := srv.Remove(a.ID); err != nil {
				t.Fatal(err)
			}
			for _, p := range names {
				if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s after Remove: %v", p, err)
				}
			}
			for _, bad := range []string{"", "relative.sock", a.SocketPath(), "/a/../b", "/"} {
				b := a
				b.ID, b.Links = "alloc-bad", []string{bad}
				if err := srv.Add(b); err == nil || !strings.Contains(err.Error(), "is not another absolute path for its socket") {
					t.Errorf("link %q: %v; want it refused as no other absolute path", bad, err)
				}
			}
		})
	}
}

// TestConnectionBoundsUnprivileged: the connections in a handshake are
// bounded across all allocations together (MaxConnections) and per
// allocation (MaxHandshakes); a device plugin connection counts for as
// long as it is open. One over a bound is closed unanswered; a slot
// given back (a handshake refused, a connection closed) is the next
// one's.
func TestConnectionBoundsUnprivileged(t *testing.T) {
	closedUnanswered := func(t *testing.T, c *net.UnixConn, what string) {
		t.Helper()
		if n, err := c.Read(make([]byte, 64)); n != 0 || !errors.Is(err, io.EOF) {
			t.Fatalf("%s: read %d, %v; want it closed unanswered", what, n, err)
		}
	}
	welcomed := func(t *testing.T, path string) *net.UnixConn {
		t.Helper()
		c := dialPath(t, path)
		if m, _ := exchange(t, c, hello); m.Type != wire.TypeWelcome {
			t.Fatalf("hello: %+v", m)
		}
		return c
	}

	t.Run("across allocations", func(t *testing.T) {
		e := newFakeEnv(t, fakeEnvConfig{owner: me(), maxConns: 3})
		a2 := e.alloc
		a2.ID, a2.Dir, a2.Queues = "alloc-2", filepath.Join(filepath.Dir(e.alloc.Dir), "alloc-2"), []uint32{2}
		if err := e.srv.Add(a2); err != nil {
			t.Fatal(err)
		}
		first := welcomed(t, e.alloc.SocketPath())
		defer first.Close()
		second := welcomed(t, a2.SocketPath())
		defer second.Close()
		dp := dialPath(t, e.alloc.SocketPath())
		defer dp.Close()
		if got, _ := dpdkSay(t, dp, "/connect,h"); got != "/host_ok" {
			t.Fatalf("/connect: %q", got)
		}
		over := dialPath(t, a2.SocketPath())
		defer over.Close()
		closedUnanswered(t, over, "a fourth connection")
		// A request without its memfd is refused: its slot is the next one's.
		if m, _ := exchange(t, first, request("[0]", rx64)); m.Type != wire.TypeError {
			t.Fatalf("request without a memfd: %+v", m)
		}
		next := dialPath(t, a2.SocketPath())
		defer next.Close()
		if got, _ := dpdkSay(t, next, "/version"); got != "0.1" {
			t.Errorf("a connection once a slot is free: %q", got)
		}
	})

	t.Run("per allocation", func(t *testing.T) {
		e := newFakeEnv(t, fakeEnvConfig{owner: me(), maxHandshakes: 2})
		first := welcomed(t, e.alloc.SocketPath())
		defer first.Close()
		dp := dialPath(t, e.alloc.SocketPath())
		defer dp.Close()
		if got, _ := dpdkSay(t, dp, "/connect,h"); got != "/host_ok" {
			t.Fatalf("/connect: %q", got)
		}
		over := dialPath(t, e.alloc.SocketPath())
		defer over.Close()
		closedUnanswered(t, over, "a third handshake")
		// The refusal of the first's request is sent once its slot is
		// free again: the next connection has it.
		if m, _ := exchange(t, first, request("[0]", rx64)); m.Type != wire.TypeError {
			t.Fatalf("request without a memfd: %+v", m)
		}
		welcomed(t, e.alloc.SocketPath()).Close()
	})
}

// TestSetLimitsUnprivileged: a change of the pool's limits and busy
// polling (SetLimits) holds from the next handshake on: its welcome
// tells the client, and its request is checked against them; busy
// polling the protocol cannot give is refused, and so is an allocation
// the server does not serve.
func TestSetLimitsUnprivileged(t *testing.T) {
	e := newFakeEnv(t, fakeEnvConfig{owner: me()})
	rings := func(size uint32, tx bool) string {
		var t uint32
		if tx {
			t = size
		}
		return fmt.Sprintf(`{"fill":%d,"completion":%d,"rx":%d,"tx":%d}`, size, size, size, t)
	}
	// lease runs a handshake to its end: the welcome, and the request's
	// refusal (nil: a lease, ended again).
	lease := func(ringSize uint32, tx bool) (wire.Message, *wire.Message) {
		t.Helper()
		conn := dialPath(t, e.alloc.SocketPath())
		defer conn.Close()
		welcome, _ := exchange(t, conn, hello)
		m, fds := exchange(t, conn, request("[0]", rings(ringSize, tx)), sealedMemfd(t, 1<<20, true))
		closeAll(fds)
		if m.Type == wire.TypeError {
			return welcome, &m
		}
		if active, _ := exchange(t, conn, `{"type":"ready"}`); active.Type != wire.TypeActive {
			t.Fatalf("after ready: %+v", active)
		}
		conn.Close()
		e.waitEnded(t, e.alloc.ID)
		return welcome, nil
	}
	welcome, refused := lease(64, true)
	if *welcome.Limits != wire.DefaultLimits || welcome.BusyPoll != nil || refused == nil || refused.Code != wire.CodeLimit {
		t.Fatalf("under the default limits: welcome %+v, a TX ring %+v; want it refused", welcome, refused)
	}
	allowTX := wire.Limits{MaxUMEM: 1 << 20, MaxRing: 1024, AllowTX: true, MaxQueue: 2}
	bp := &wire.BusyPoll{TimeoutMicros: 50, Budget: 16}
	if err := e.srv.SetLimits(e.alloc.ID, allowTX, bp); err != nil {
		t.Fatal(err)
	}
	bp.Budget = 1 // the server keeps its own copy
	welcome = exchangeWelcome(t, e)
	if *welcome.Limits != allowTX || welcome.BusyPoll == nil || *welcome.BusyPoll != (wire.BusyPoll{TimeoutMicros: 50, Budget: 16}) {
		t.Errorf("the welcome after SetLimits: limits %+v busy poll %+v", welcome.Limits, welcome.BusyPoll)
	}
	small := allowTX
	small.MaxRing, small.AllowTX = 512, false
	if err := e.srv.SetLimits(e.alloc.ID, small, nil); err != nil {
		t.Fatal(err)
	}
	if _, refused := lease(1024, false); refused == nil || refused.Code != wire.CodeLimit || !strings.Contains(refused.Reason, "at most 512") {
		t.Errorf("a ring beyond the new limit: %+v", refused)
	}
	if _, refused := lease(512, true); refused == nil || refused.Code != wire.CodeLimit {
		t.Errorf("a TX ring once the pool forbids it again: %+v", refused)
	}
	if welcome, refused := lease(512, false); refused != nil || welcome.BusyPoll != nil {
		t.Errorf("within the new limits: %+v, busy polling %+v", refused, welcome.BusyPoll)
	}
	for _, bad := range []*wire.BusyPoll{{TimeoutMicros: 0, Budget: 8}, {TimeoutMicros: 50, Budget: 70000}, {TimeoutMicros: 2_000_000, Budget: 8}} {
		if err := e.srv.SetLimits(e.alloc.ID, allowTX, bad); err == nil {
			t.Errorf("busy polling %+v accepted", *bad)
		}
	}
	if err := e.srv.SetLimits("alloc-9", allowTX, nil); err == nil {
		t.Error("limits of an allocation not served set")
	}
}

// exchangeWelcome says hello and returns the welcome, then sends a bad
// request: the allocation is free again once the refusal comes.
func exchangeWelcome(t *testing.T, e *fakeEnv) wire.Message {
	t.Helper()
	conn := dialPath(t, e.alloc.SocketPath())
	defer conn.Close()
	welcome, _ := exchange(t, conn, hello)
	if m, _ := exchange(t, conn, `{"type":"request"}`); m.Type != wire.TypeError {
		t.Fatalf("a request without rings: %+v", m)
	}
	return welcome
}

// activeLease makes a lease of queues 0 and 1 on e's allocation and
// returns its connection and the sockets it reported.
func activeLease(t *testing.T, e *fakeEnv) (*net.UnixConn, []broker.LeaseSocket) {
	t.Helper()
	conn := dialPath(t, e.alloc.SocketPath())
	t.Cleanup(func() { conn.Close() })
	exchange(t, conn, hello)
	_, fds := exchange(t, conn, request("[0,1]", rx64), sealedMemfd(t, 1<<20, true))
	closeAll(fds)
	if m, _ := exchange(t, conn, `{"type":"ready"}`); m.Type != wire.TypeActive {
		t.Fatalf("after ready: %+v", m)
	}
	socks, _ := lastLease(e.leases.snapshot(), e.alloc.ID)
	e.dp.took()
	return conn, socks
}

// TestLeaseEndsUnprivileged: how a lease ends when the daemon, not the
// client, acts. Remove (the allocation freed) closes the client's
// connection, takes the sockets out of the XSKMAP, reports the end and
// removes the socket. Close (the daemon stopping) closes the connection
// and leaves the lease as it is in the kernel, reporting nothing: the
// next daemon resumes it. Retarget (the netdev moved into the pod)
// closes the connection, its sockets bound where the netdev no longer
// is, and forgets a recorded lease not resumed.
func TestLeaseEndsUnprivileged(t *testing.T) {
	closed := func(t *testing.T, c *net.UnixConn) {
		t.Helper()
		if n, err := c.Read(make([]byte, 64)); n != 0 || !errors.Is(err, io.EOF) {
			t.Errorf("the client's connection: read %d, %v; want it closed", n, err)
		}
	}
	t.Run("remove", func(t *testing.T) {
		e := newFakeEnv(t, fakeEnvConfig{owner: me()})
		conn, socks := activeLease(t, e)
		if err := e.srv.Remove(e.alloc.ID); err != nil {
			t.Fatal(err)
		}
		closed(t, conn)
		e.waitEnded(t, e.alloc.ID)
		want := []string{fmt.Sprintf("remove xa/q0 %d", socks[0].Inode), fmt.Sprintf("remove xa/q1 %d", socks[1].Inode)}
		if got := e.dp.took(); !slices.Equal(got, want) {
			t.Errorf("the XSKMAP was asked %v, want %v", got, want)
		}
		if _, err := os.Lstat(e.alloc.SocketPath()); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the socket after Remove: %v", err)
		}
		if err := e.srv.Remove(e.alloc.ID); err == nil {
			t.Error("an allocation removed twice")
		}
	})
	t.Run("close", func(t *testing.T) {
		e := newFakeEnv(t, fakeEnvConfig{owner: me()})
		conn, _ := activeLease(t, e)
		before := len(e.leases.snapshot())
		e.srv.Close()
		closed(t, conn)
		if got := e.dp.took(); len(got) != 0 {
			t.Errorf("the XSKMAP was asked %v by a daemon stopping; want the lease left in the kernel", got)
		}
		if got := e.leases.snapshot(); len(got) != before {
			t.Errorf("OnLease told %v by a daemon stopping; want nothing", got[before:])
		}
		if err := e.srv.Add(e.alloc); err == nil {
			t.Error("an allocation added to a closed server")
		}
	})
	t.Run("retarget", func(t *testing.T) {
		recorded := []broker.LeaseSocket{{Queue: 0, Inode: 1001}, {Queue: 1, Inode: 1002}}
		// Connections wait for the client's next message longer than the
		// test: only Retarget closes them.
		e := newFakeEnv(t, fakeEnvConfig{owner: me(), resumable: recorded, stepTimeout: time.Minute})
		// A device plugin connection: open, and no native lease under way.
		conn := dialPath(t, e.alloc.SocketPath())
		defer conn.Close()
		if got, _ := dpdkSay(t, conn, "/version"); got != "0.1" {
			t.Fatalf("/version: %q", got)
		}
		// To where it is: the recorded lease stays.
		if err := e.srv.Retarget(e.alloc.ID, e.alloc.Netdev, nil); err != nil {
			t.Fatal(err)
		}
		closed(t, conn)
		// The recorded lease is still there to resume (a resume of part
		// of it is refused as such, not as no lease at all).
		c := dialPath(t, e.alloc.SocketPath())
		defer c.Close()
		exchange(t, c, hello)
		udp, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if m, _ := exchange(t, c, `{"type":"resume","queues":[0]}`, udp); !strings.Contains(m.Reason, "the lease to resume has 2 sockets") {
			t.Errorf("a resume after a retarget to where it was: %+v; want the recorded lease kept", m)
		}
		pod := xsk.Netdev{Name: "xa", Ifindex: 9, NetNS: "/proc/self/ns/net"}
		if err := e.srv.Retarget(e.alloc.ID, pod, &ownDatapath{xskmap: -1}); err != nil {
			t.Fatal(err)
		}
		e.waitEnded(t, e.alloc.ID)
		if err := e.srv.Retarget("alloc-9", pod, nil); err == nil {
			t.Error("an allocation not served retargeted")
		}
	})
}
