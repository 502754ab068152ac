// Package client is the pod side of xdpq's socket broker: it connects to
// the allocation's socket ($XDPQ_SOCKET), proves nothing itself (the
// daemon reads its credentials), hands over a memfd it allocated as the
// UMEM, and returns sockets bound to its queues, ready for the datapath.
// It needs no privilege.
package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// EnvSocket is the environment variable that holds the socket's path.
const EnvSocket = "XDPQ_SOCKET"

// Options say what to ask for. Zero values take the defaults.
type Options struct {
	Name      string   // shown in the daemon's log
	Queues    []uint32 // nil: every queue of the allocation
	FrameSize uint32   // 2048 (default) or 4096
	Headroom  uint32
	Ring      uint32 // entries of every ring; default 2048
	TX        bool   // ask for a TX ring too (the pool must allow it)
	HugeTLB   bool   // back the UMEM with huge pages
	Timeout   time.Duration
}

// Lease holds the sockets; closing it gives them back.
type Lease struct {
	Allocation string
	Netdev     string
	Queues     []uint32
	Sockets    []*xsk.Socket // in the order of Queues
	UMEM       *xsk.UMEM
	ZeroCopy   bool
	Limits     broker.Limits
	conn       *net.UnixConn
	rx, spare  [][]uint64
	tx         [][]uint64
}

// RXFrames returns the UMEM frames socket i was given for receiving
// (they are on its fill ring when Connect returns).
func (l *Lease) RXFrames(i int) []uint64 { return l.rx[i] }

// SpareFrames returns an RX ring's worth of frames of socket i that are
// on no ring: a receive loop refills from them while the frames it holds
// are still being processed, so the fill ring never runs dry.
func (l *Lease) SpareFrames(i int) []uint64 { return l.spare[i] }

// TXFrames returns the UMEM frames socket i may transmit from.
func (l *Lease) TXFrames(i int) []uint64 { return l.tx[i] }

// Close gives the sockets back: they leave the XSKMAP and close.
func (l *Lease) Close() error {
	var errs []error
	for _, s := range l.Sockets {
		errs = append(errs, s.Close())
	}
	errs = append(errs, l.conn.Close(), l.UMEM.Close())
	return errors.Join(errs...)
}

// Connect runs the whole handshake with the daemon at path ("" means
// $XDPQ_SOCKET) and returns the lease. While the allocation is still held
// by a connection the daemon has not seen close yet (a restarted
// container's predecessor), it retries until the timeout.
func Connect(path string, o Options) (*Lease, error) {
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Second
	}
	deadline := time.Now().Add(o.Timeout)
	for {
		l, err := connect(path, o)
		var pe *broker.ProtocolError
		if err == nil || !errors.As(err, &pe) || pe.Code != broker.CodeBusy || time.Now().After(deadline) {
			return l, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func connect(path string, o Options) (*Lease, error) {
	if path == "" {
		path = os.Getenv(EnvSocket)
		if path == "" {
			return nil, fmt.Errorf("xdpq: no socket path and %s is not set", EnvSocket)
		}
	}
	if o.FrameSize == 0 {
		o.FrameSize = xsk.FrameSize2K
	}
	if o.Ring == 0 {
		o.Ring = 2048
	}
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Second
	}
	if o.Name == "" {
		o.Name = "xdpq-client"
	}
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("xdpq: connect %s: %w", path, err)
	}
	l := &Lease{conn: c}
	ok := false
	defer func() {
		if !ok {
			for _, s := range l.Sockets {
				s.Close()
			}
			if l.UMEM != nil {
				l.UMEM.Close()
			}
			c.Close()
		}
	}()
	c.SetDeadline(time.Now().Add(o.Timeout))

	if err := send(c, broker.Message{Type: broker.TypeHello, Version: broker.Version, Client: o.Name}); err != nil {
		return nil, err
	}
	w, _, err := expect(c, broker.TypeWelcome, 0)
	if err != nil {
		return nil, err
	}
	l.Allocation, l.Netdev, l.Queues = w.Allocation, w.Netdev, w.Queues
	if w.Limits != nil {
		l.Limits = *w.Limits
	}
	if o.Queues != nil {
		for _, q := range o.Queues {
			if !slices.Contains(w.Queues, q) {
				return nil, fmt.Errorf("xdpq: queue %d is not in allocation %s (it has %v)", q, w.Allocation, w.Queues)
			}
		}
		l.Queues = o.Queues
	}
	rings := broker.Rings{Fill: o.Ring, Completion: o.Ring, RX: o.Ring}
	if o.TX {
		rings.TX = o.Ring
	}
	// Each socket: a fill ring's worth of frames to receive into, an RX
	// ring's worth of spares (frames in the RX ring are not on the fill
	// ring), and a TX ring's worth to transmit from.
	per := int(rings.Fill + rings.RX + rings.TX)
	size := int64(per*len(l.Queues)) * int64(o.FrameSize)
	if page := int64(os.Getpagesize()); size%page != 0 {
		size += page - size%page
	}
	mf, err := xsk.NewMemfd("xdpq-umem", size, o.HugeTLB)
	if err != nil {
		return nil, fmt.Errorf("xdpq: %w", err)
	}
	defer mf.Close()
	l.UMEM, err = xsk.MapUMEM(int(mf.Fd()), xsk.UMEMConfig{FrameSize: o.FrameSize, Headroom: o.Headroom})
	if err != nil {
		return nil, fmt.Errorf("xdpq: %w", err)
	}
	err = send(c, broker.Message{Type: broker.TypeRequest, FrameSize: o.FrameSize, Headroom: o.Headroom,
		Rings: &rings, Queues: l.Queues}, int(mf.Fd()))
	if err != nil {
		return nil, err
	}
	m, fds, err := expect(c, broker.TypeSockets, len(l.Queues))
	if err != nil {
		return nil, err
	}
	if len(fds) != len(l.Queues) || m.Rings == nil {
		closeFDs(fds)
		return nil, fmt.Errorf("xdpq: the daemon sent %d sockets for %d queues", len(fds), len(l.Queues))
	}
	got := xsk.Rings{Fill: m.Rings.Fill, Completion: m.Rings.Completion, RX: m.Rings.RX, TX: m.Rings.TX}
	l.ZeroCopy = m.ZeroCopy
	for i, fd := range fds {
		s, err := xsk.Adopt(fd, l.UMEM, got)
		if err != nil {
			closeFDs(fds[i:])
			return nil, fmt.Errorf("xdpq: queue %d: %w", l.Queues[i], err)
		}
		l.Sockets = append(l.Sockets, s)
		next := i * per
		take := func(n uint32) []uint64 {
			out := make([]uint64, n)
			for j := range out {
				out[j] = l.UMEM.FrameAddr(next)
				next++
			}
			return out
		}
		rx := take(rings.Fill)
		l.rx, l.spare, l.tx = append(l.rx, rx), append(l.spare, take(rings.RX)), append(l.tx, take(rings.TX))
		if n := s.Fill(rx); n != len(rx) {
			return nil, fmt.Errorf("xdpq: queue %d: fill ring took %d of %d frames", l.Queues[i], n, len(rx))
		}
	}
	if err := send(c, broker.Message{Type: broker.TypeReady}); err != nil {
		return nil, err
	}
	if _, _, err := expect(c, broker.TypeActive, 0); err != nil {
		return nil, err
	}
	c.SetDeadline(time.Time{})
	ok = true
	return l, nil
}

func send(c *net.UnixConn, m broker.Message, fds ...int) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := xsk.SendFDs(c, b, fds); err != nil {
		return fmt.Errorf("xdpq: send %s: %w", m.Type, err)
	}
	return nil
}

// expect receives the next message; the daemon's refusal becomes an
// error carrying its code and reason.
func expect(c *net.UnixConn, want string, maxFDs int) (*broker.Message, []int, error) {
	buf := make([]byte, broker.MaxMessage)
	n, fds, err := xsk.RecvFDs(c, buf, maxFDs)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, fmt.Errorf("xdpq: waiting for %s: %w", want, err)
	}
	if n == 0 {
		closeFDs(fds)
		return nil, nil, fmt.Errorf("xdpq: the daemon closed the connection before %s", want)
	}
	if e, perr := broker.ParseMessage(buf[:n], broker.TypeError); perr == nil {
		closeFDs(fds)
		return nil, nil, fmt.Errorf("xdpq: refused: %w", &broker.ProtocolError{Code: e.Code, Reason: e.Reason})
	}
	m, err := broker.ParseMessage(buf[:n], want)
	if err != nil {
		closeFDs(fds)
		return nil, nil, fmt.Errorf("xdpq: %w", err)
	}
	return m, fds, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
