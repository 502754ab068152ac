package xsk_test

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// TestBindRefusesRequest: what is wrong with a bind request itself (no
// queues, a queue twice, rings or a mode Bind does not take, a memfd not
// sealed or not sized for the frames) is refused as such before any
// socket is made, so it runs as any user: the error names the fault,
// not the socket the caller may not create, and no descriptor is left.
// TestBindRefuses has the refusals that need a netdev and root.
func TestBindRefusesRequest(t *testing.T) {
	dev := xsk.Netdev{Name: "eth1", Ifindex: 1 << 30} // no such netdev: Bind must not get that far
	cfg := xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048}, Rings: xsk.Rings{Fill: 64, Completion: 64, RX: 64}}
	memfd := func(size int64) int {
		f, err := xsk.NewMemfd("umem", size, false)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fd, err := unix.Dup(int(f.Fd()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	good := memfd(1 << 20)
	unsealed, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(unsealed) })
	if err := unix.Ftruncate(unsealed, 1<<20); err != nil {
		t.Fatal(err)
	}
	with := func(f func(*xsk.Config)) xsk.Config {
		c := cfg
		f(&c)
		return c
	}
	for _, c := range []struct {
		name   string
		memfd  int
		queues []uint32
		cfg    xsk.Config
		want   string
	}{
		{"no queues", good, nil, cfg, "bind xsk eth1: no queues"},
		{"a queue twice", good, []uint32{1, 2, 1}, cfg, "bind xsk eth1: queue 1 given twice"},
		{"no fill ring", good, []uint32{0}, with(func(c *xsk.Config) { c.Rings.Fill = 0 }), "bind xsk eth1: "},
		{"a ring not a power of two", good, []uint32{0}, with(func(c *xsk.Config) { c.Rings.RX = 100 }), "bind xsk eth1: "},
		{"an unknown mode", good, []uint32{0}, with(func(c *xsk.Config) { c.Mode = 7 }), "unknown bind mode 7"},
		{"an unsealed memfd", unsealed, []uint32{0}, cfg, "not sealed against shrink and grow"},
		{"not a memfd", int(pipeFD(t)), []uint32{0}, cfg, "bind xsk eth1: "},
		{"a frame size the kernel lacks", good, []uint32{0}, with(func(c *xsk.Config) { c.UMEM.FrameSize = 1000 }), "umem: frame size 1000"},
		{"headroom past half a frame", good, []uint32{0}, with(func(c *xsk.Config) { c.UMEM.Headroom = 1500 }), "umem: headroom 1500"},
		{"a memfd not a whole number of frames", memfd(4096 + 2048), []uint32{0}, with(func(c *xsk.Config) { c.UMEM.FrameSize = 4096 }),
			"umem: umem size 6144: must be a positive multiple of the frame size 4096"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := testnet.OpenFDs()
			bound, err := xsk.Bind(dev, c.memfd, c.queues, c.cfg)
			for _, b := range bound {
				unix.Close(b.FD)
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Bind: %v; want it refused saying %q", err, c.want)
			}
			if strings.Contains(err.Error(), "operation not permitted") || strings.Contains(err.Error(), "socket") {
				t.Errorf("Bind: %v; refused at the socket, not for the request's fault", err)
			}
			for _, fd := range testnet.FDsLeftOpen(before) {
				t.Errorf("descriptor %s left open", fd)
			}
		})
	}
}

// pipeFD is a descriptor that is no memfd: a pipe's end.
func pipeFD(t *testing.T) int {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
	return p[0]
}
