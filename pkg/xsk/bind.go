package xsk

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
	"unsafe"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// Mode chooses between copy and zero-copy binding.
type Mode int

const (
	// ModeAuto lets the kernel try zero-copy and fall back to copy mode.
	ModeAuto Mode = iota
	// ModeCopy always copies frames between the driver and the UMEM.
	ModeCopy
	// ModeZeroCopy fails unless the driver supports zero-copy.
	ModeZeroCopy
)

func (m Mode) String() string {
	switch m {
	case ModeAuto:
		return "auto"
	case ModeCopy:
		return "copy"
	case ModeZeroCopy:
		return "zero-copy"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

func (m Mode) flags() (uint16, error) {
	switch m {
	case ModeAuto:
		return 0, nil
	case ModeCopy:
		return unix.XDP_COPY, nil
	case ModeZeroCopy:
		return unix.XDP_ZEROCOPY, nil
	}
	return 0, fmt.Errorf("unknown bind mode %d", int(m))
}

// Netdev names the network device a socket binds to.
type Netdev struct {
	Name    string // for error messages
	Ifindex int
	// NetNS is the path of the network namespace the netdev lives in
	// (for example /run/netns/node); empty for the caller's own.
	NetNS string
}

func (d Netdev) String() string {
	if d.Name != "" {
		return d.Name
	}
	return fmt.Sprintf("ifindex %d", d.Ifindex)
}

// Config describes the sockets the privileged side creates.
type Config struct {
	UMEM  UMEMConfig
	Rings Rings
	Mode  Mode
	// BusyRetry bounds how long a bind retries while the queue is busy: a
	// queue stays busy for tens of milliseconds after its previous socket
	// closed. Zero means 100ms; negative, no retry.
	BusyRetry time.Duration
	// MultiBuffer binds with XDP_USE_SG: a frame larger than a UMEM frame
	// (a jumbo frame) is received in several descriptors, every one but
	// the last marked Continues, and may be sent so. Without it the kernel
	// drops such a frame (Statistics.RXDropped). The sockets sharing the
	// UMEM inherit it from the first, as they inherit the mode. A kernel
	// or driver that cannot is an error wrapping ErrNoMultiBuffer.
	MultiBuffer bool
}

// ErrNoMultiBuffer is wrapped by a bind with Config.MultiBuffer that the
// kernel refused for it: Linux before 6.6 does not know XDP_USE_SG
// (EINVAL), and a driver without multi-buffer support refuses it in
// zero-copy mode (EOPNOTSUPP; in copy mode every driver takes it).
var ErrNoMultiBuffer = errors.New("multi-buffer AF_XDP (XDP_USE_SG) needs Linux 6.6 or later, and in zero-copy mode a driver that supports it")

// Bound is a socket bound to a queue. Its fd belongs to the caller.
type Bound struct {
	FD       int
	Queue    uint32
	ZeroCopy bool
}

// Bind creates one AF_XDP socket per queue of dev, in dev's network
// namespace; registers memfd (sealed against shrink and grow) as the UMEM
// they share, each socket with its own fill and completion ring; binds each
// socket to its queue with need_wakeup; and returns them in the order of
// queues. The memfd is mapped only while it is registered. On error no
// socket is left open.
func Bind(dev Netdev, memfd int, queues []uint32, cfg Config) ([]Bound, error) {
	if len(queues) == 0 {
		return nil, fmt.Errorf("bind xsk %s: no queues", dev)
	}
	seen := map[uint32]bool{}
	for _, q := range queues {
		if seen[q] {
			return nil, fmt.Errorf("bind xsk %s: queue %d given twice", dev, q)
		}
		seen[q] = true
	}
	if err := cfg.Rings.Validate(); err != nil {
		return nil, fmt.Errorf("bind xsk %s: %w", dev, err)
	}
	modeFlags, err := cfg.Mode.flags()
	if err != nil {
		return nil, fmt.Errorf("bind xsk %s: %w", dev, err)
	}
	size, err := CheckMemfd(memfd)
	if err != nil {
		return nil, fmt.Errorf("bind xsk %s: %w", dev, err)
	}
	if err := cfg.UMEM.Validate(size); err != nil {
		return nil, fmt.Errorf("bind xsk %s: umem: %w", dev, err)
	}

	fds, err := sockets(dev.NetNS, len(queues))
	if err != nil {
		return nil, fmt.Errorf("bind xsk %s: %w", dev, err)
	}
	bound := make([]Bound, len(queues))
	ok := false
	defer func() {
		if !ok {
			closeFDs(fds...)
		}
	}()

	if err := registerUMEM(fds[0], memfd, size, cfg.UMEM); err != nil {
		return nil, fmt.Errorf("bind xsk %s/q%d: register umem: %w", dev, queues[0], err)
	}
	retry := cfg.BusyRetry
	if retry == 0 {
		retry = 100 * time.Millisecond
	}
	retry = max(retry, 0)
	for i, q := range queues {
		if err := setRings(fds[i], cfg.Rings); err != nil {
			return nil, fmt.Errorf("bind xsk %s/q%d: %w", dev, q, err)
		}
		sa := &unix.SockaddrXDP{Ifindex: uint32(dev.Ifindex), QueueID: q}
		if i == 0 {
			sa.Flags = modeFlags | unix.XDP_USE_NEED_WAKEUP
			if cfg.MultiBuffer {
				sa.Flags |= unix.XDP_USE_SG
			}
		} else {
			// The other sockets inherit mode, need_wakeup and multi-buffer
			// from the first (the kernel refuses those flags here).
			sa.Flags = unix.XDP_SHARED_UMEM
			sa.SharedUmemFD = uint32(fds[0])
		}
		if err := bindRetry(fds[i], sa, retry); err != nil {
			if cfg.MultiBuffer && i == 0 && (errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL)) {
				return nil, fmt.Errorf("bind xsk %s/q%d (%s) with multi-buffer: %w: %w", dev, q, cfg.Mode, err, ErrNoMultiBuffer)
			}
			return nil, fmt.Errorf("bind xsk %s/q%d (%s): %w", dev, q, cfg.Mode, err)
		}
		zc, err := zeroCopy(fds[i])
		if err != nil {
			return nil, fmt.Errorf("bind xsk %s/q%d: %w", dev, q, err)
		}
		bound[i] = Bound{FD: fds[i], Queue: q, ZeroCopy: zc}
	}
	ok = true
	return bound, nil
}

// sockets creates n AF_XDP sockets in the network namespace at nsPath.
// A socket binds to a netdev of the namespace it was created in.
func sockets(nsPath string, n int) ([]int, error) {
	var fds []int
	create := func(ns.NetNS) error {
		for range n {
			fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("create AF_XDP socket: %w", err)
			}
			fds = append(fds, fd)
		}
		return nil
	}
	var err error
	if nsPath == "" {
		err = create(nil)
	} else {
		err = ns.WithNetNSPath(nsPath, create)
	}
	if err != nil {
		closeFDs(fds...)
		return nil, err
	}
	return fds, nil
}

func registerUMEM(fd, memfd int, size int64, cfg UMEMConfig) error {
	mem, err := unix.Mmap(memfd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mmap memfd: %w", err)
	}
	// The kernel pins the pages at registration; the mapping is not needed after.
	defer func() { _ = unix.Munmap(mem) }() // fails only for a bad address; the pages stay pinned by the UMEM either way
	reg := unix.XDPUmemReg{
		Addr:     uint64(uintptr(unsafe.Pointer(&mem[0]))),
		Len:      uint64(size),
		Size:     cfg.FrameSize,
		Headroom: cfg.Headroom,
	}
	if err := setsockopt(fd, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg)); err != nil {
		if errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.ENOBUFS) {
			return fmt.Errorf("%w (RLIMIT_MEMLOCK too low for %d bytes?)", err, size)
		}
		return err
	}
	return nil
}

func setRings(fd int, r Rings) error {
	set := func(name string, opt int, n uint32) error {
		if n == 0 {
			return nil
		}
		if err := setsockoptInt(fd, opt, int(n)); err != nil {
			return fmt.Errorf("set %s ring size %d: %w", name, n, err)
		}
		return nil
	}
	return errors.Join(
		set("fill", unix.XDP_UMEM_FILL_RING, r.Fill),
		set("completion", unix.XDP_UMEM_COMPLETION_RING, r.Completion),
		set("rx", unix.XDP_RX_RING, r.RX),
		set("tx", unix.XDP_TX_RING, r.TX),
	)
}

// bindRetry binds, retrying while the queue is still held by a socket that
// is being torn down (EBUSY) until the deadline.
func bindRetry(fd int, sa *unix.SockaddrXDP, retry time.Duration) error {
	deadline := time.Now().Add(retry)
	wait := time.Millisecond
	for {
		err := unix.Bind(fd, sa)
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			if errors.Is(err, unix.EBUSY) {
				return fmt.Errorf("%w: queue still in use after %v", err, retry)
			}
			return err
		}
		time.Sleep(wait)
		wait = min(2*wait, 10*time.Millisecond)
	}
}

// Open is Bind and Adopt in one process: it creates a UMEM of frames frames
// backed by a new memfd, binds one socket per queue of dev and maps them.
// It serves the daemon's own tests and benchmarks and applications that
// run privileged; pods receive their sockets through the broker instead.
func Open(dev Netdev, queues []uint32, frames int, cfg Config) (*UMEM, []*Socket, error) {
	size := int64(frames) * int64(cfg.UMEM.FrameSize)
	if err := cfg.UMEM.Validate(size); err != nil {
		return nil, nil, fmt.Errorf("open xsk %s: umem: %w", dev, err)
	}
	mf, err := NewMemfd("xdpq-umem", size, false)
	if err != nil {
		return nil, nil, fmt.Errorf("open xsk %s: %w", dev, err)
	}
	defer func() { _ = mf.Close() }() // the UMEM's mapping and the sockets hold the memory
	umem, err := MapUMEM(int(mf.Fd()), cfg.UMEM)
	if err != nil {
		return nil, nil, fmt.Errorf("open xsk %s: %w", dev, err)
	}
	bound, err := Bind(dev, int(mf.Fd()), queues, cfg)
	if err != nil {
		_ = umem.Close() // an unmap that fails leaks address space only; err says what failed
		return nil, nil, err
	}
	socks := make([]*Socket, 0, len(bound))
	for i, b := range bound {
		s, err := Adopt(b.FD, umem, cfg.Rings)
		if err != nil {
			// Given up: closing frees the descriptors and mappings even on
			// an error, and err is what the caller must hear.
			for _, s := range socks {
				_ = s.Close()
			}
			for _, b := range bound[i:] {
				closeFDs(b.FD)
			}
			_ = umem.Close()
			return nil, nil, fmt.Errorf("open xsk %s/q%d: %w", dev, b.Queue, err)
		}
		socks = append(socks, s)
	}
	return umem, socks, nil
}

// BusyQueues answers, for each of the queues of dev, whether an AF_XDP
// socket is bound to it (true) or not (false). The kernel lists AF_XDP sockets only with CONFIG_XDP_SOCKETS_DIAG,
// which kernels such as this project's test machines lack, so it tries: a
// small copy-mode socket per queue; one that binds means the queue was free
// and is closed at once (the queue then stays busy for some tens of
// milliseconds, which Bind's retry absorbs); EBUSY means it is taken.
//
// Closing a bound socket waits for an RCU grace period (8 to 30 ms here),
// so the probes are closed concurrently: the grace periods overlap and a
// 64-queue netdev costs about one, not 64. A queue that cannot be probed
// (one dev lacks, say) has no answer and is named in the error; the
// others are still answered.
func BusyQueues(dev Netdev, queues []uint32) (map[uint32]bool, error) {
	busy := map[uint32]bool{}
	if len(queues) == 0 {
		return busy, nil
	}
	size := int64(os.Getpagesize())
	mf, err := NewMemfd("xdpq-probe", size, false)
	if err != nil {
		return busy, err
	}
	defer func() { _ = mf.Close() }() // a probe's memfd, never written
	fds, err := sockets(dev.NetNS, len(queues))
	if err != nil {
		return busy, fmt.Errorf("probe %s: %w", dev, err)
	}
	defer func() {
		var wg sync.WaitGroup
		for _, fd := range fds {
			wg.Go(func() { closeFDs(fd) })
		}
		wg.Wait()
	}()
	var errs []error
	for i, q := range queues {
		err := registerUMEM(fds[i], int(mf.Fd()), size, UMEMConfig{FrameSize: FrameSize2K})
		if err == nil {
			err = setRings(fds[i], Rings{Fill: 2, Completion: 2, RX: 2})
		}
		if err == nil {
			err = unix.Bind(fds[i], &unix.SockaddrXDP{Flags: unix.XDP_COPY, Ifindex: uint32(dev.Ifindex), QueueID: q})
		}
		switch {
		case err == nil:
			busy[q] = false
		case errors.Is(err, unix.EBUSY):
			busy[q] = true
		default:
			errs = append(errs, fmt.Errorf("probe %s/q%d: %w", dev, q, err))
		}
	}
	return busy, errors.Join(errs...)
}
