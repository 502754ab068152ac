package xsk

import (
	"errors"
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrNoTXRing is returned when transmitting on a socket set up without a TX
// ring (a receive-only socket).
var ErrNoTXRing = errors.New("socket has no TX ring")

// ErrNoRXRing is returned when receiving on a socket set up without an RX ring.
var ErrNoRXRing = errors.New("socket has no RX ring")

// Rings gives the number of entries of each ring of a socket. Each is a
// power of two; RX or TX may be 0 for a transmit-only or receive-only
// socket, but not both.
type Rings struct {
	Fill       uint32
	Completion uint32
	RX         uint32
	TX         uint32
}

// DefaultRings are the ring sizes of libxdp's defaults.
var DefaultRings = Rings{Fill: 2048, Completion: 2048, RX: 2048, TX: 2048}

// Validate checks that the sizes are usable.
func (r Rings) Validate() error {
	pow2 := func(name string, v uint32, zeroOK bool) error {
		if v == 0 && zeroOK {
			return nil
		}
		if v == 0 || v&(v-1) != 0 || v > 1<<20 {
			return fmt.Errorf("%s ring size %d: must be a power of two from 1 to %d", name, v, 1<<20)
		}
		return nil
	}
	if r.RX == 0 && r.TX == 0 {
		return errors.New("rings: a socket needs an RX ring, a TX ring or both")
	}
	return errors.Join(pow2("fill", r.Fill, false), pow2("completion", r.Completion, false),
		pow2("rx", r.RX, true), pow2("tx", r.TX, true))
}

// Statistics are the kernel's counters for one socket (XDP_STATISTICS).
type Statistics struct {
	RXDropped            uint64 // frames dropped for reasons other than a full ring
	RXInvalidDescs       uint64 // invalid descriptors on the fill ring
	TXInvalidDescs       uint64 // invalid descriptors on the TX ring
	RXRingFull           uint64 // frames dropped because the RX ring was full
	RXFillRingEmptyDescs uint64 // times the fill ring was empty when a frame came
	TXRingEmptyDescs     uint64 // times the TX ring was empty when the kernel looked
}

// Socket is a bound AF_XDP socket with its rings mapped into this process.
type Socket struct {
	fd    int
	umem  *UMEM
	rings Rings
	fill  *ring[uint64]
	comp  *ring[uint64]
	rx    *ring[Desc]
	tx    *ring[Desc]
}

// Adopt maps the rings of fd, a socket bound by the privileged side with
// the given ring sizes and umem's memfd as its UMEM. The pod cannot read
// the ring sizes from the socket, so they travel with the fd. On success
// the Socket owns fd; on error the caller still does.
func Adopt(fd int, umem *UMEM, rings Rings) (*Socket, error) {
	if err := rings.Validate(); err != nil {
		return nil, fmt.Errorf("adopt xsk fd %d: %w", fd, err)
	}
	off, err := mmapOffsets(fd)
	if err != nil {
		return nil, fmt.Errorf("adopt xsk fd %d: read ring offsets: %w", fd, err)
	}
	s := &Socket{fd: fd, umem: umem, rings: rings}
	fail := func(what string, err error) (*Socket, error) {
		s.unmap()
		return nil, fmt.Errorf("adopt xsk fd %d: map %s ring: %w", fd, what, err)
	}
	if s.fill, err = mapRing[uint64](fd, unix.XDP_UMEM_PGOFF_FILL_RING, off.Fr, rings.Fill, true); err != nil {
		return fail("fill", err)
	}
	if s.comp, err = mapRing[uint64](fd, unix.XDP_UMEM_PGOFF_COMPLETION_RING, off.Cr, rings.Completion, false); err != nil {
		return fail("completion", err)
	}
	if rings.RX > 0 {
		if s.rx, err = mapRing[Desc](fd, unix.XDP_PGOFF_RX_RING, off.Rx, rings.RX, false); err != nil {
			return fail("rx", err)
		}
	}
	if rings.TX > 0 {
		if s.tx, err = mapRing[Desc](fd, unix.XDP_PGOFF_TX_RING, off.Tx, rings.TX, true); err != nil {
			return fail("tx", err)
		}
	}
	return s, nil
}

// FD returns the socket's file descriptor, for poll or an XSKMAP.
func (s *Socket) FD() int { return s.fd }

// UMEM returns the UMEM the socket's frames live in.
func (s *Socket) UMEM() *UMEM { return s.umem }

// Rings returns the ring sizes.
func (s *Socket) Rings() Rings { return s.rings }

// Fill gives frames to the kernel for receiving and returns how many fit.
func (s *Socket) Fill(addrs []uint64) int {
	return s.fill.produce(addrs)
}

// FillFree returns how many frames the fill ring can take now.
func (s *Socket) FillFree() int {
	return int(s.fill.free(s.fill.size))
}

// Receive copies up to len(descs) received descriptors and returns how
// many. The frames belong to the application until it puts them on the
// fill or TX ring again. When nothing was received and the kernel asked to
// be woken (need_wakeup), Receive wakes it.
func (s *Socket) Receive(descs []Desc) int {
	if s.rx == nil {
		return 0
	}
	n := s.rx.consume(descs)
	if n == 0 && s.fill.needWakeup() {
		// On the datapath, with no error to return: the transient errors
		// are nil already, and another one recurs at the next empty
		// Receive, which the caller sees as no frames.
		_ = kickRX(s.fd)
	}
	return n
}

// WakeRX makes the non-blocking recvfrom that wakes the kernel's receive
// side. Receive makes one when the kernel asks for it (need_wakeup); a
// socket with preferred busy polling (SO_PREFER_BUSY_POLL) makes one each
// round of its loop instead, since that call is what runs the queue's
// NAPI while its interrupts are deferred.
func (s *Socket) WakeRX() error {
	if s.rx == nil {
		return ErrNoRXRing
	}
	return kickRX(s.fd)
}

// Transmit queues up to len(descs) frames for transmission and returns how
// many it queued, waking the kernel when it asks for it.
func (s *Socket) Transmit(descs []Desc) (int, error) {
	if s.tx == nil {
		return 0, ErrNoTXRing
	}
	n := s.tx.produce(descs)
	if s.tx.needWakeup() {
		if err := kickTX(s.fd); err != nil {
			return n, fmt.Errorf("xsk tx wakeup: %w", err)
		}
	}
	return n, nil
}

// Kick wakes the kernel to transmit what the TX ring holds, for callers
// that queued frames while the kernel did not ask for a wakeup.
func (s *Socket) Kick() error {
	if s.tx == nil {
		return ErrNoTXRing
	}
	if s.tx.pending() == 0 && !s.tx.needWakeup() {
		return nil
	}
	return kickTX(s.fd)
}

// TXFree returns how many descriptors the TX ring can take now; 0 for a
// socket without one. A packet in several descriptors goes on the ring
// whole: check that it fits before Transmit.
func (s *Socket) TXFree() int {
	if s.tx == nil {
		return 0
	}
	return int(s.tx.free(s.tx.size))
}

// TXPending returns how many queued frames the kernel has not taken yet.
func (s *Socket) TXPending() int {
	if s.tx == nil {
		return 0
	}
	return int(s.tx.pending())
}

// Complete copies up to len(addrs) addresses of transmitted frames and
// returns how many; the frames are the application's again.
func (s *Socket) Complete(addrs []uint64) int {
	return s.comp.consume(addrs)
}

// Poll waits up to timeout for received frames (POLLIN) and reports
// whether there are any. A negative timeout waits forever.
func (s *Socket) Poll(timeout time.Duration) (bool, error) {
	if s.rx == nil {
		return false, ErrNoRXRing
	}
	deadline := time.Now().Add(timeout)
	fds := []unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLIN}}
	for {
		var ts *unix.Timespec // to the nanosecond: a receive loop waits less than a millisecond
		if timeout >= 0 {
			t := unix.NsecToTimespec(max(time.Until(deadline), 0).Nanoseconds())
			ts = &t
		}
		n, err := unix.Ppoll(fds, ts, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("poll xsk: %w", err)
		}
		return n > 0 && fds[0].Revents&unix.POLLIN != 0, nil
	}
}

// Statistics reads the kernel's counters for the socket.
func (s *Socket) Statistics() (Statistics, error) {
	return statistics(s.fd)
}

// StatisticsOf reads the kernel's counters of the AF_XDP socket fd
// refers to, in whichever process bound it: the daemon reads those of the
// sockets it handed to pods through its own duplicates.
func StatisticsOf(fd int) (Statistics, error) {
	return statistics(fd)
}

func statistics(fd int) (Statistics, error) {
	var st unix.XDPStatistics
	if err := getsockopt(fd, unix.XDP_STATISTICS, unsafe.Pointer(&st), unsafe.Sizeof(st)); err != nil {
		return Statistics{}, fmt.Errorf("xsk statistics: %w", err)
	}
	return Statistics{
		RXDropped:            st.Rx_dropped,
		RXInvalidDescs:       st.Rx_invalid_descs,
		TXInvalidDescs:       st.Tx_invalid_descs,
		RXRingFull:           st.Rx_ring_full,
		RXFillRingEmptyDescs: st.Rx_fill_ring_empty_descs,
		TXRingEmptyDescs:     st.Tx_ring_empty_descs,
	}, nil
}

// ZeroCopy reports whether the kernel granted zero-copy mode (XDP_OPTIONS).
func (s *Socket) ZeroCopy() (bool, error) {
	return zeroCopy(s.fd)
}

func zeroCopy(fd int) (bool, error) {
	var opt uint32
	if err := getsockopt(fd, unix.XDP_OPTIONS, unsafe.Pointer(&opt), unsafe.Sizeof(opt)); err != nil {
		return false, fmt.Errorf("xsk options: %w", err)
	}
	return opt&unix.XDP_OPTIONS_ZEROCOPY != 0, nil
}

func (s *Socket) unmap() {
	s.fill.unmap()
	s.comp.unmap()
	s.rx.unmap()
	s.tx.unmap()
}

// Close unmaps the rings and closes the socket. The kernel removes the
// socket from every XSKMAP it was in. The UMEM stays mapped.
func (s *Socket) Close() error {
	if s.fd < 0 {
		return nil
	}
	s.unmap()
	err := unix.Close(s.fd)
	s.fd = -1
	return err
}
