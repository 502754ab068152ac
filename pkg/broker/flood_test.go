package broker_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/testing/handover"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/client"
	"github.com/xdpq/xdpq/pkg/wire"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// TestAcceptSurvivesFlood: an allocation's socket is open to every local
// user. The accept loop survives running out of descriptors (EMFILE); a
// flood of connections from another user (uid 65534), with the daemon's
// descriptor limit low, does not keep the owner from its lease; and the
// owner's own connections in a handshake are bounded.
func TestAcceptSurvivesFlood(t *testing.T) {
	e := newEnvWith(t, envConfig{owner: rootOwned, stepTimeout: 5 * time.Second, maxHandshakes: 2})
	// An owner known by uid has its socket to itself (TestSocketModes); in
	// Kubernetes the socket is open to the container's processes, of any
	// uid. Open it as there, for the flood to reach it.
	if err := os.Chmod(e.alloc.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(e.alloc.SocketPath(), 0o666); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	fl, err := handover.StartPod([]string{"-test.run=^$"}, podEnv+"=flood", nil, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fl.Kill)
	fl.Conn.SetDeadline(time.Now().Add(time.Minute))
	command := func(step, answer string) handover.Msg {
		t.Helper()
		if err := handover.Send(fl.Conn, handover.Msg{Step: step, Path: e.alloc.SocketPath()}); err != nil {
			t.Fatal(err)
		}
		m, _, err := handover.Expect(fl.Conn, answer, 0)
		if err != nil {
			t.Fatalf("%s: %v\nflooder stderr:\n%s", step, err, &stderr)
		}
		return m
	}
	var orig unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	restore := func() {
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &orig); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(restore)
	limit := func(n uint64) {
		t.Helper()
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: n, Max: orig.Max}); err != nil {
			t.Fatal(err)
		}
	}
	lease := func(what string) {
		t.Helper()
		l, err := client.Connect(e.alloc.SocketPath(), client.Options{Ring: 64, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatalf("the owner's lease %s: %v", what, err)
		}
		l.Close()
		e.waitEnded(t, e.alloc.ID)
	}

	// No descriptor left: accept fails with EMFILE, and goes on once there
	// are descriptors again.
	limit(lowestFreeFD())
	if fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0); !errors.Is(err, unix.EMFILE) {
		unix.Close(fd)
		t.Fatalf("open with the limit at the lowest free descriptor: %v, want EMFILE", err)
	}
	command("connect", "connected")
	e.logs.wait(t, "accept failing with EMFILE", func(msgs []string) bool {
		for _, m := range msgs {
			if strings.HasPrefix(m, "accept; retrying") && strings.Contains(m, "too many open files") {
				return true
			}
		}
		return false
	})
	restore()
	lease("after accept failed with EMFILE")

	// A flood from another user while the daemon has few descriptors to
	// spare: each of its connections is refused and closed at once, so the
	// daemon never runs out of descriptors.
	acceptErrs := countLogs(e.logs.snapshot(), "accept; retrying")
	limit(lowestFreeFD() + 128)
	command("flood", "flooding")
	for i := range 3 {
		lease(fmt.Sprintf("during the flood, try %d", i+1))
	}
	st := command("stop", "stopped")
	restore()
	if n := countLogs(e.logs.snapshot(), "accept; retrying") - acceptErrs; n > 0 {
		t.Errorf("accept failed %d times during the flood", n)
	}
	t.Logf("the flooder made %d connections (%d attempts failed)", st.Counts[0], st.Counts[1])
	if st.Counts[0] < floodProgress {
		t.Errorf("the flood made only %d connections", st.Counts[0])
	}

	// The owner's own connections in a handshake are bounded: with two
	// silent ones open, a third is closed without a welcome.
	left := countLogs(e.logs.snapshot(), "client left during the handshake")
	a, b := dial(t, e), dial(t, e)
	c := dial(t, e)
	defer c.Close()
	if err := xsk.SendFDs(c, []byte(`{"type":"hello","version":1}`), nil); err != nil && !errors.Is(err, unix.EPIPE) {
		t.Fatal(err)
	}
	buf := make([]byte, wire.MaxMessage)
	if n, _, err := xsk.RecvFDs(c, buf, 0); n != 0 || (err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, unix.ECONNRESET)) {
		t.Errorf("a third connection in a handshake got %q (%v), want it closed", buf[:n], err)
	}
	a.Close()
	b.Close()
	e.logs.wait(t, "the two handshakes to end", func(msgs []string) bool {
		return countLogs(msgs, "client left during the handshake") >= left+2
	})
	lease("once the handshakes ended")
	command("exit", "bye")
	if err := fl.Wait(); err != nil {
		t.Fatalf("flooder: %v\n%s", err, &stderr)
	}
}

// lowestFreeFD returns the lowest descriptor number not open: with
// RLIMIT_NOFILE there, nothing more can be opened.
func lowestFreeFD() uint64 {
	for fd := 0; ; fd++ {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); errors.Is(err, unix.EBADF) {
			return uint64(fd)
		}
	}
}

// floodProgress is how many connections the flooder has made when it
// says it is flooding; it holds up to floodHeld at a time.
const (
	floodProgress = 2000
	floodHeld     = 3000
)

// flood is the hostile user: it connects to the allocation's socket once
// and holds the connection ("connect"), or as fast as it can, holding up
// to floodHeld connections at a time, half of them silent and half sending
// a hello ("flood", until "stop").
func flood(c *net.UnixConn) error {
	var held []*net.UnixConn
	defer func() {
		for _, h := range held {
			h.Close()
		}
	}()
	var stop chan struct{}
	var done chan [2]uint64
	for {
		m, _, err := handover.Recv(c, 0)
		if err != nil {
			return err
		}
		switch m.Step {
		case "connect":
			h, derr := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: m.Path, Net: "unixpacket"})
			if derr != nil {
				return derr
			}
			held = append(held, h)
			err = handover.Send(c, handover.Msg{Step: "connected"})
		case "flood":
			stop, done = make(chan struct{}), make(chan [2]uint64, 1)
			progress := make(chan struct{})
			go floodLoop(m.Path, stop, progress, done)
			select {
			case <-progress:
			case n := <-done:
				return fmt.Errorf("the flood stopped after %d connections", n[0])
			}
			err = handover.Send(c, handover.Msg{Step: "flooding"})
		case "stop":
			close(stop)
			n := <-done
			err = handover.Send(c, handover.Msg{Step: "stopped", Counts: n[:]})
		case "exit":
			return handover.Send(c, handover.Msg{Step: "bye"})
		default:
			return errors.New("unknown step " + m.Step)
		}
		if err != nil {
			return err
		}
	}
}

func floodLoop(path string, stop, progress chan struct{}, done chan<- [2]uint64) {
	var open []*net.UnixConn
	var made, failed uint64
	defer func() {
		for _, o := range open {
			o.Close()
		}
		done <- [2]uint64{made, failed}
	}()
	for {
		select {
		case <-stop:
			return
		default:
		}
		o, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
		if err != nil {
			failed++ // EAGAIN: the socket's backlog is full
			continue
		}
		made++
		if made%2 == 0 {
			// Half start a handshake; the server may have closed it
			// already, which is what the flood is for.
			_, _ = o.Write([]byte(`{"type":"hello","version":1}`))
		}
		open = append(open, o)
		if len(open) == floodHeld {
			for _, o := range open {
				o.Close()
			}
			open = open[:0]
		}
		if made == floodProgress {
			close(progress)
		}
	}
}

// TestMaxConnections: the connections in a handshake are bounded across
// all allocations together; one over the bound is closed unanswered, and
// a slot given back (a handshake refused) is taken by the next.
func TestMaxConnections(t *testing.T) {
	e := newEnvWith(t, envConfig{owner: rootOwned, twoAllocs: true, stepTimeout: 10 * time.Second, maxConns: 3})
	hello := func(path string) *net.UnixConn {
		t.Helper()
		c := dialPath(t, path)
		if err := xsk.SendFDs(c, []byte(`{"type":"hello","version":1}`), nil); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4096)
		n, _, err := xsk.RecvFDs(c, buf, 0)
		if err != nil || !strings.Contains(string(buf[:n]), `"welcome"`) {
			t.Fatalf("hello: %q %v", buf[:n], err)
		}
		return c
	}
	first := hello(e.allocs[0].SocketPath())
	defer first.Close()
	defer hello(e.allocs[1].SocketPath()).Close()
	// A device plugin connection counts for as long as it is open.
	dp := dialPath(t, e.allocs[0].SocketPath())
	defer dp.Close()
	xsk.SendFDs(dp, []byte("/connect,h"), nil)
	buf := make([]byte, 4096)
	if n, _, err := xsk.RecvFDs(dp, buf, 0); string(buf[:n]) != "/host_ok" {
		t.Fatalf("/connect: %q %v", buf[:n], err)
	}
	over := dialPath(t, e.allocs[1].SocketPath())
	defer over.Close()
	if n, err := over.Read(make([]byte, 64)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("a fourth connection: read %d, %v; want it closed", n, err)
	}
	// A request without its memfd is refused; the refusal is sent once
	// the slot is free again.
	if err := xsk.SendFDs(first, []byte(`{"type":"request"}`), nil); err != nil {
		t.Fatal(err)
	}
	if n, _, err := xsk.RecvFDs(first, buf, 0); err != nil || !strings.Contains(string(buf[:n]), `"error"`) {
		t.Fatalf("request without a memfd: %q %v", buf[:n], err)
	}
	l, err := client.Connect(e.allocs[0].SocketPath(), client.Options{Ring: 64, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("a lease once a slot is free: %v", err)
	}
	l.Close()
}

// TestSocketModes: who can reach an allocation's socket. An owner known
// by uid (standalone) owns its socket, and nobody else may list the
// directory or connect; an owner known by its pod (Kubernetes, uid
// unknown) has a socket open to whoever sees it, the directory being
// mounted into its container only. Root owns the directory always: the
// daemon, without CAP_DAC_OVERRIDE, writes there.
func TestSocketModes(t *testing.T) {
	for _, c := range []struct {
		name              string
		owner             broker.Owner
		uid               uint32
		dirMode, sockMode os.FileMode
	}{
		{"owned by uid 65534", broker.Owner{UID: uid(65534)}, 65534, 0o711, 0o600},
		{"owned by root", broker.Owner{UID: uid(0)}, 0, 0o711, 0o600},
		{"owned by a pod", broker.Owner{PodUID: podA}, 0, 0o755, 0o666},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnvWith(t, envConfig{owner: c.owner, links: []string{"afxdp.sock"}})
			for path, mode := range map[string]os.FileMode{e.alloc.Dir: c.dirMode, e.alloc.SocketPath(): c.sockMode, e.allocs[0].Links[0]: c.sockMode} {
				fi, err := os.Lstat(path)
				if err != nil {
					t.Fatal(err)
				}
				want := c.uid
				if path == e.alloc.Dir {
					want = 0
				}
				if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != mode || st.Uid != want {
					t.Errorf("%s is uid %d mode %v, want uid %d mode %v", path, st.Uid, fi.Mode().Perm(), want, mode)
				}
			}
		})
	}
}
