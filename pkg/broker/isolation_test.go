package broker_test

import (
	"bytes"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/testing/handover"
	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/client"
)

// TestXSKMapIsolation is issue 12's isolation break as a regression test.
// Two allocations share netdev xa, as a queue pool's do: alloc-1 (queues
// 0 and 1) is the test's and receives; alloc-2 (queues 2 and 3) belongs
// to a pod's process with no privileges (uid 65534, no capabilities).
// That process takes every descriptor it can get: the sockets of its
// lease (native protocol), whatever the DPDK handshake's /xsk_map_fd
// answers, and the netdev's pinned XSKMAP; with each it tries to delete,
// replace and read every slot of the XSKMAP. Every attempt fails, and
// alloc-1 receives all of its traffic byte for byte before and after.
// (Before, /xsk_map_fd handed any allocation's owner the shared map: its
// deletes emptied the other allocations' slots.)
func TestXSKMapIsolation(t *testing.T) {
	pod := broker.Owner{UID: uid(65534)}
	e := newEnvWith(t, envConfig{owner: rootOwned, owner2: &pod, twoAllocs: true})
	pr := e.peer(t)
	a, err := client.Connect(e.alloc.SocketPath(), client.Options{Ring: 256, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var recv []*traffic.Receiver
	for i, s := range a.Sockets {
		r, err := traffic.NewReceiver(s, a.RXFrames(i))
		if err != nil {
			t.Fatal(err)
		}
		recv = append(recv, r)
	}
	expect := func(when string) {
		t.Helper()
		for i, q := range a.Queues {
			want := frames(e.p.B, e.p.A, q, 200)
			if err := pr.Send[q].Send(want, time.Now().Add(5*time.Second)); err != nil {
				t.Fatal(err)
			}
			if err := recv[i].Expect(want, time.Now().Add(5*time.Second)); err != nil {
				t.Fatalf("%s: alloc-1's queue %d: %v", when, q, err)
			}
		}
	}
	expect("before the probe")

	pins, _ := filepath.Glob(filepath.Join(e.agentC.PinDir, "xa", "xsk*"))
	if len(pins) != 1 {
		t.Fatalf("pinned XSKMAP of xa: %v", pins)
	}
	var stderr bytes.Buffer
	p, err := handover.StartPod([]string{"-test.run=^$"}, podEnv+"=mapprobe", nil, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	p.Conn.SetDeadline(time.Now().Add(30 * time.Second))
	if err := handover.Send(p.Conn, handover.Msg{Step: "go", Path: e.allocs[1].SocketPath(), Pinned: pins[0]}); err != nil {
		t.Fatal(err)
	}
	rep, _, err := handover.Expect(p.Conn, "report", 0)
	if err != nil {
		t.Fatalf("%v\npod stderr:\n%s", err, stderr.String())
	}
	attempts := 0
	for _, r := range rep.Results {
		t.Log(r)
		if strings.Contains(r, ": ok") {
			t.Errorf("the pod of alloc-2 reached the XSKMAP: %s", r)
		}
		if strings.Contains(r, "slot") {
			attempts++
		}
	}
	// Its two sockets, 4 slots, 3 operations; more with any map it got.
	if attempts < 2*4*3 {
		t.Errorf("%d attempts on the map's slots, want at least 24: %q", attempts, rep.Results)
	}
	if rep.Reason != "/fd_nak" {
		t.Errorf("/xsk_map_fd on a queue pool's shared netdev answered %q, want /fd_nak", rep.Reason)
	}
	if got := e.sockets(); fmt.Sprint(got) != "[0 1 2 3]" {
		t.Errorf("sockets in the XSKMAP while both leases are held: %v", got)
	}
	expect("after the probe")
	handover.Send(p.Conn, handover.Msg{Step: "exit"})
	p.Wait()
}

// mapProbe is the hostile pod of TestXSKMapIsolation.
func mapProbe(c *net.UnixConn) error {
	m, _, err := handover.Expect(c, "go", 0)
	if err != nil {
		return err
	}
	rep := handover.Msg{Step: "report"}
	say := func(format string, args ...any) { rep.Results = append(rep.Results, fmt.Sprintf(format, args...)) }
	type held struct {
		what string
		fd   int
	}
	var fds []held

	// The native protocol: the lease's sockets.
	l, err := client.Connect(m.Path, client.Options{Ring: 64, Timeout: 5 * time.Second})
	if err != nil {
		return fmt.Errorf("lease: %w", err)
	}
	defer l.Close()
	for i, s := range l.Sockets {
		fds = append(fds, held{fmt.Sprintf("socket of queue %d", l.Queues[i]), s.FD()})
	}

	// The DPDK handshake, as DPDK's driver speaks it.
	u, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: m.Path, Net: "unixpacket"})
	if err != nil {
		return err
	}
	defer u.Close()
	ask := func(cmd string) (string, []int, error) {
		if _, err := u.Write([]byte(cmd)); err != nil {
			return "", nil, err
		}
		buf, oob := make([]byte, 128), make([]byte, unix.CmsgSpace(4))
		n, oobn, _, _, err := u.ReadMsgUnix(buf, oob)
		if err != nil {
			return "", nil, err
		}
		var got []int
		if msgs, _ := unix.ParseSocketControlMessage(oob[:oobn]); len(msgs) == 1 {
			got, _ = unix.ParseUnixRights(&msgs[0])
		}
		return string(buf[:n]), got, nil
	}
	if r, _, err := ask("/connect,pod"); err != nil || r != "/host_ok" {
		return fmt.Errorf("/connect: %q %v", r, err)
	}
	r, got, err := ask("/xsk_map_fd,xa")
	if err != nil {
		return err
	}
	rep.Reason = r
	for _, fd := range got {
		fds = append(fds, held{"/xsk_map_fd's descriptor", fd})
	}

	// The pinned map.
	if fd, err := objGet(m.Pinned); err != nil {
		say("open the pinned XSKMAP %s: %v", m.Pinned, err)
	} else {
		say("open the pinned XSKMAP %s: ok", m.Pinned)
		fds = append(fds, held{"the pinned XSKMAP", fd})
	}

	own := uint32(l.Sockets[0].FD())
	for _, h := range fds {
		for slot := range uint32(4) {
			say("%s, slot %d: delete: %s", h.what, slot, result(mapOp(unix.BPF_MAP_DELETE_ELEM, h.fd, slot, nil)))
			say("%s, slot %d: update: %s", h.what, slot, result(mapOp(unix.BPF_MAP_UPDATE_ELEM, h.fd, slot, &own)))
			var v uint32
			say("%s, slot %d: lookup: %s", h.what, slot, result(mapOp(unix.BPF_MAP_LOOKUP_ELEM, h.fd, slot, &v)))
		}
	}
	if err := handover.Send(c, rep); err != nil {
		return err
	}
	_, _, err = handover.Expect(c, "exit", 0)
	return err
}

func result(err error) string {
	if err == nil {
		return "ok"
	}
	return "refused (" + err.Error() + ")"
}

// mapOp is bpf(2) on a map element, by hand: cilium/ebpf's Map needs the
// map's info first, and the point is what the raw call on the descriptor
// can do.
func mapOp(cmd uintptr, fd int, key uint32, value *uint32) error {
	attr := struct {
		fd    uint32
		_     uint32
		key   uint64
		value uint64
		flags uint64
	}{fd: uint32(fd), key: uint64(uintptr(unsafe.Pointer(&key)))}
	if value != nil {
		attr.value = uint64(uintptr(unsafe.Pointer(value)))
	}
	_, _, errno := unix.Syscall(unix.SYS_BPF, cmd, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	if errno != 0 {
		return errno
	}
	return nil
}

// objGet is BPF_OBJ_GET of a pinned path.
func objGet(path string) (int, error) {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return -1, err
	}
	attr := struct {
		pathname uint64
		fd       uint32
		flags    uint32
	}{pathname: uint64(uintptr(unsafe.Pointer(p)))}
	fd, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_OBJ_GET, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	if errno != 0 {
		return -1, errno
	}
	return int(fd), nil
}
