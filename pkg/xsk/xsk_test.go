package xsk_test

import (
	"errors"
	"net"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/xsk"
)

func TestMemfd(t *testing.T) {
	f, err := xsk.NewMemfd("test", 1<<20, false)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	size, err := xsk.CheckMemfd(int(f.Fd()))
	if err != nil || size != 1<<20 {
		t.Fatalf("CheckMemfd: %d, %v", size, err)
	}
	// The seals hold against both sides.
	if err := unix.Ftruncate(int(f.Fd()), 1<<19); !errors.Is(err, unix.EPERM) {
		t.Errorf("shrink a sealed memfd: %v, want EPERM", err)
	}
	if err := unix.Ftruncate(int(f.Fd()), 1<<21); !errors.Is(err, unix.EPERM) {
		t.Errorf("grow a sealed memfd: %v, want EPERM", err)
	}

	unsealed, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(unsealed)
	if err := unix.Ftruncate(unsealed, 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := xsk.CheckMemfd(unsealed); err == nil || !strings.Contains(err.Error(), "not sealed") {
		t.Errorf("unsealed memfd: %v", err)
	}
	regular, err := os.CreateTemp(t.TempDir(), "umem")
	if err != nil {
		t.Fatal(err)
	}
	defer regular.Close()
	if _, err := xsk.CheckMemfd(int(regular.Fd())); err == nil {
		t.Error("a regular file passed as a memfd")
	}
	if _, err := xsk.NewMemfd("zero", 0, false); err == nil {
		t.Error("zero-sized memfd accepted")
	}
}

func TestUMEMConfigValidate(t *testing.T) {
	for _, c := range []struct {
		cfg  xsk.UMEMConfig
		size int64
		ok   bool
	}{
		{xsk.UMEMConfig{FrameSize: 2048}, 1 << 20, true},
		{xsk.UMEMConfig{FrameSize: 4096, Headroom: 256}, 1 << 20, true},
		{xsk.UMEMConfig{FrameSize: 2048, Headroom: 768}, 1 << 20, true},
		{xsk.UMEMConfig{FrameSize: 2048, Headroom: 769}, 1 << 20, false},
		{xsk.UMEMConfig{FrameSize: 1024}, 1 << 20, false},
		{xsk.UMEMConfig{FrameSize: 3000}, 1 << 20, false},
		{xsk.UMEMConfig{FrameSize: 2048}, 2048, false}, // not a page multiple
		{xsk.UMEMConfig{FrameSize: 4096}, 6144, false},
		{xsk.UMEMConfig{FrameSize: 2048}, 0, false},
	} {
		if err := c.cfg.Validate(c.size); (err == nil) != c.ok {
			t.Errorf("%+v size %d: %v, want ok=%v", c.cfg, c.size, err, c.ok)
		}
	}
}

func TestRingsValidate(t *testing.T) {
	for _, c := range []struct {
		r  xsk.Rings
		ok bool
	}{
		{xsk.DefaultRings, true},
		{xsk.Rings{Fill: 64, Completion: 64, RX: 64}, true},
		{xsk.Rings{Fill: 64, Completion: 64, TX: 64}, true},
		{xsk.Rings{Fill: 64, Completion: 64}, false},
		{xsk.Rings{Fill: 100, Completion: 64, RX: 64}, false},
		{xsk.Rings{Fill: 64, Completion: 0, RX: 64}, false},
		{xsk.Rings{Fill: 64, Completion: 64, RX: 1 << 21}, false},
	} {
		if err := c.r.Validate(); (err == nil) != c.ok {
			t.Errorf("%+v: %v, want ok=%v", c.r, err, c.ok)
		}
	}
}

func seqpacketPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "seqpacket")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

func TestFDPassing(t *testing.T) {
	a, b := seqpacketPair(t)
	files := make([]*os.File, 3)
	fds := make([]int, 3)
	for i := range files {
		f, err := xsk.NewMemfd("pass", 4096, false)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		files[i], fds[i] = f, int(f.Fd())
	}
	if err := xsk.SendFDs(a, []byte("three"), fds); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, got, err := xsk.RecvFDs(b, buf, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, fd := range got {
			unix.Close(fd)
		}
	}()
	if string(buf[:n]) != "three" || len(got) != 3 {
		t.Fatalf("got %q with %d fds", buf[:n], len(got))
	}
	for i := range got {
		var want, have unix.Stat_t
		if err := unix.Fstat(fds[i], &want); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fstat(got[i], &have); err != nil {
			t.Fatal(err)
		}
		if want.Ino != have.Ino {
			t.Errorf("fd %d: inode %d, want %d", i, have.Ino, want.Ino)
		}
		flags, _ := unix.FcntlInt(uintptr(got[i]), unix.F_GETFD, 0)
		if flags&unix.FD_CLOEXEC == 0 {
			t.Errorf("fd %d: received without close-on-exec", i)
		}
	}

	// More fds than the receiver takes: refused, and nothing leaks (the
	// package's TestMain counts descriptors).
	if err := xsk.SendFDs(a, []byte("too many"), fds); err != nil {
		t.Fatal(err)
	}
	if _, got, err := xsk.RecvFDs(b, buf, 1); !errors.Is(err, xsk.ErrTruncated) || got != nil {
		t.Errorf("too many fds: %v, %v", got, err)
	}
	// A message longer than the buffer: refused.
	if err := xsk.SendFDs(a, make([]byte, 100), fds[:1]); err != nil {
		t.Fatal(err)
	}
	if _, got, err := xsk.RecvFDs(b, buf, 1); !errors.Is(err, xsk.ErrTruncated) || got != nil {
		t.Errorf("long message: %v, %v", got, err)
	}
	if err := xsk.SendFDs(a, nil, make([]int, xsk.MaxFDs+1)); err == nil {
		t.Error("SendFDs accepted more than MaxFDs")
	}
}

func TestBindRefuses(t *testing.T) {
	p := testnet.NewPair(t, 4)
	dev := xsk.Netdev{Name: p.A.Name, Ifindex: p.A.Index, NetNS: p.NSPath()}
	cfg := xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048}, Rings: xsk.Rings{Fill: 64, Completion: 64, RX: 64}}
	mf, err := xsk.NewMemfd("umem", 1<<20, false)
	if err != nil {
		t.Fatal(err)
	}
	defer mf.Close()
	unsealed, _ := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
	defer unix.Close(unsealed)
	if err := unix.Ftruncate(unsealed, 1<<20); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name   string
		memfd  int
		queues []uint32
		cfg    xsk.Config
		want   string
	}{
		{"unsealed memfd", unsealed, []uint32{0}, cfg, "not sealed against shrink and grow"},
		{"no queues", int(mf.Fd()), nil, cfg, "no queues"},
		{"queue twice", int(mf.Fd()), []uint32{1, 1}, cfg, "queue 1 given twice"},
		{"queue out of range", int(mf.Fd()), []uint32{0, 9}, cfg, "xa/q9"},
		{"bad frame size", int(mf.Fd()), []uint32{0}, xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 1000}, Rings: cfg.Rings}, "frame size 1000"},
		{"zero-copy on veth", int(mf.Fd()), []uint32{0}, xsk.Config{UMEM: cfg.UMEM, Rings: cfg.Rings, Mode: xsk.ModeZeroCopy}, "zero-copy"},
		// The kernel's EOPNOTSUPP for a multi-buffer bind (veth has no
		// zero-copy at all; a kernel before 6.6 would say EINVAL).
		{"multi-buffer zero-copy on veth", int(mf.Fd()), []uint32{0}, xsk.Config{UMEM: cfg.UMEM, Rings: cfg.Rings, Mode: xsk.ModeZeroCopy, MultiBuffer: true}, "with multi-buffer: operation not supported: multi-buffer AF_XDP (XDP_USE_SG) needs Linux 6.6"},
	} {
		bound, err := xsk.Bind(dev, c.memfd, c.queues, c.cfg)
		if err == nil {
			for _, b := range bound {
				unix.Close(b.FD)
			}
			t.Errorf("%s: bound", c.name)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %q does not say %q", c.name, err, c.want)
		}
		if errors.Is(err, xsk.ErrNoMultiBuffer) != c.cfg.MultiBuffer {
			t.Errorf("%s: error %q: errors.Is ErrNoMultiBuffer %v", c.name, err, !c.cfg.MultiBuffer)
		}
	}
	// After all those failures the queues are still free.
	bound, err := xsk.Bind(dev, int(mf.Fd()), []uint32{0, 3}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bound {
		if b.ZeroCopy {
			t.Error("veth granted zero-copy")
		}
		unix.Close(b.FD)
	}
}

// TestNoTXRing: a socket bound without a TX ring cannot transmit, and its
// holder cannot add one: the kernel refuses the mapping, the wakeup and a
// TX ring set after bind.
func TestNoTXRing(t *testing.T) {
	p := testnet.NewPair(t, 4)
	dev := xsk.Netdev{Name: p.A.Name, Ifindex: p.A.Index, NetNS: p.NSPath()}
	cfg := xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048}, Rings: xsk.Rings{Fill: 64, Completion: 64, RX: 64}}
	umem, socks, err := xsk.Open(dev, []uint32{0}, 64, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer umem.Close()
	s := socks[0]
	defer s.Close()
	if _, err := s.Transmit([]xsk.Desc{{Addr: 0, Len: 60}}); !errors.Is(err, xsk.ErrNoTXRing) {
		t.Errorf("Transmit: %v, want ErrNoTXRing", err)
	}
	if m, err := unix.Mmap(s.FD(), unix.XDP_PGOFF_TX_RING, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
		unix.Munmap(m)
		t.Error("kernel mapped a TX ring that was never set")
	}
	if err := unix.Sendto(s.FD(), nil, unix.MSG_DONTWAIT, nil); !errors.Is(err, unix.ENOBUFS) {
		t.Errorf("sendto: %v, want ENOBUFS", err)
	}
	if err := unix.SetsockoptInt(s.FD(), unix.SOL_XDP, unix.XDP_TX_RING, 64); !errors.Is(err, unix.EBUSY) {
		t.Errorf("add a TX ring after bind: %v, want EBUSY", err)
	}
}

// TestScatter writes packets across UMEM frames: as many frames as the
// packet needs, every descriptor but the last marked Continues, the bytes
// in order; too few frames, or an address that is not a frame's start,
// write nothing.
func TestScatter(t *testing.T) {
	f, err := xsk.NewMemfd("scatter", 16*4096, false)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u, err := xsk.MapUMEM(int(f.Fd()), xsk.UMEMConfig{FrameSize: 2048})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	addrs := []uint64{u.FrameAddr(5), u.FrameAddr(2), u.FrameAddr(9), u.FrameAddr(0), u.FrameAddr(7)}
	for _, n := range []int{0, 1, 2047, 2048, 2049, 4096, 9014, 5 * 2048} {
		pkt := make([]byte, n)
		for i := range pkt {
			pkt[i] = byte(i*7 + n)
		}
		descs, used, err := u.Scatter(pkt, addrs, []xsk.Desc{{Addr: 1}})
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if want := max((n+2047)/2048, 1); used != want || len(descs) != want+1 {
			t.Fatalf("%d bytes: %d frames, %d descriptors; want %d", n, used, len(descs)-1, want)
		}
		var got []byte
		for i, d := range descs[1:] {
			if d.Addr != addrs[i] || d.Continues() != (i < used-1) {
				t.Errorf("%d bytes: descriptor %d %+v", n, i, d)
			}
			got = append(got, u.Bytes(d.Addr, d.Len)...)
		}
		if string(got) != string(pkt) {
			t.Errorf("%d bytes: the frames hold other bytes", n)
		}
	}
	before := string(u.Bytes(0, uint32(u.Size())))
	if _, _, err := u.Scatter(make([]byte, 5*2048+1), addrs, nil); err == nil {
		t.Error("a packet larger than the frames given was written")
	}
	if _, _, err := u.Scatter(make([]byte, 3000), []uint64{0, 100}, nil); err == nil {
		t.Error("an address inside a frame was taken as a frame")
	}
	if _, _, err := u.Scatter(make([]byte, 10), []uint64{uint64(u.Size())}, nil); err == nil {
		t.Error("an address outside the umem was taken")
	}
	dup := []uint64{u.FrameAddr(3), u.FrameAddr(4), u.FrameAddr(3)}
	if _, _, err := u.Scatter(make([]byte, 3*2048), dup, nil); err == nil || !strings.Contains(err.Error(), "given twice") {
		t.Errorf("a frame given twice: %v; want an error that says so", err)
	}
	if string(u.Bytes(0, uint32(u.Size()))) != before {
		t.Error("a refused Scatter wrote to the umem")
	}
	if _, used, err := u.Scatter(make([]byte, 2*2048), dup, nil); err != nil || used != 2 {
		t.Errorf("a frame given twice past the frames the packet needs: %d frames, %v", used, err)
	}
}

// TestGather: a packet in one descriptor is handed over as it is; one in
// several, once its last came, gathered; nothing while it goes on.
func TestGather(t *testing.T) {
	var g xsk.Gather
	one := []byte("single")
	if b, ok := g.Add(xsk.Desc{}, one); !ok || &b[0] != &one[0] {
		t.Fatalf("a packet in one descriptor: %q %v, want it in place", b, ok)
	}
	for round := range 2 { // the buffer is reused
		if b, ok := g.Add(xsk.Desc{Options: xsk.Continues}, []byte("ab")); ok || b != nil {
			t.Fatalf("round %d: after the first piece: %q %v", round, b, ok)
		}
		if _, ok := g.Add(xsk.Desc{Options: xsk.Continues}, []byte("cd")); ok {
			t.Fatalf("round %d: after the second piece: whole", round)
		}
		if b, ok := g.Add(xsk.Desc{}, []byte("e")); !ok || string(b) != "abcde" {
			t.Fatalf("round %d: the last piece: %q %v, want abcde", round, b, ok)
		}
	}
}
