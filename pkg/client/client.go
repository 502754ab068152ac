package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/pkg/wire"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// EnvSocket is the environment variable that holds the socket's path.
const EnvSocket = "XDPQ_SOCKET"

// The default entries of every ring (Options.Ring): a ring of 2048
// holds 1.4 ms of traffic at 1.5 Mpps; multi-buffer sockets take a jumbo
// frame in 3 descriptors and get twice the ring.
const (
	DefaultRing            = 2048
	DefaultRingMultiBuffer = 4096
)

// Options say what to ask for. Zero values take the defaults.
type Options struct {
	Name      string   // shown in the daemon's log
	Queues    []uint32 // nil: every queue of the allocation
	FrameSize uint32   // 2048 (default) or 4096 (default with MultiBuffer)
	Headroom  uint32
	// Ring is the entries of every ring; default 2048 (4096 with
	// MultiBuffer). A frame is lost when the application falls behind
	// the wire by more than a ring (2048 frames: about 1 ms at 2 Mpps);
	// a deeper ring rides out longer pauses (a neighbour on the core) at
	// the cost of memory (two UMEM frames per entry) and, in copy mode,
	// of the copying core's cache (docs/clients.md, "Ring depth").
	Ring    uint32
	TX      bool // ask for a TX ring too (the pool must allow it)
	HugeTLB bool // back the UMEM with huge pages
	// MultiBuffer asks for sockets that take packets larger than a UMEM
	// frame (jumbo frames, up to a 9000-byte MTU and beyond): such a
	// packet comes in several descriptors, which a Receiver's Receive
	// gathers into one buffer (see Receiver), and is sent in several
	// (xsk.UMEM.Scatter). Without it the kernel drops a packet larger
	// than a frame (Statistics.RXDropped). Rings count descriptors, not
	// packets: a received descriptor holds a frame less the kernel's 256
	// bytes of headroom (in copy mode), so a 9014-byte frame takes 3 of
	// 4 KiB frames (6 of 2 KiB; 3 and 5 to send), and MultiBuffer's
	// defaults are 4 KiB frames and rings of 4096, which take a burst of
	// 1024 such frames (TestReceiverJumbo). The UMEM is then 32 MiB a
	// queue (48 MiB with TX): a pool's default limit (256 MiB) takes 8
	// queues (5 with TX); for more, a smaller Ring or a pool with a
	// larger maxUMEM.
	MultiBuffer bool
	// Timeout bounds each handshake (of Connect and of a resume), and how
	// long Connect retries a busy allocation; default 30s.
	Timeout time.Duration
	// OnEvent, if set, hears what happens to the lease after Connect:
	// lost, resumed, failed. It is called on the lease's own goroutine,
	// one event at a time and in order; it may call Close (which then
	// does not wait for that goroutine, which ends when OnEvent returns).
	OnEvent func(Event)
}

// EventKind says what happened to a lease.
type EventKind int

const (
	// EventLost: the daemon's end of the connection went (the daemon
	// stopped or restarted). The sockets keep working; the lease redials
	// to resume.
	EventLost EventKind = iota + 1
	// EventResumed: a daemon took the lease back; it is tracked again.
	EventResumed
	// EventFailed: the daemon refused the resume (Err says why); the lease
	// stops trying. Close it and Connect again.
	EventFailed
)

func (k EventKind) String() string {
	switch k {
	case EventLost:
		return "lost"
	case EventResumed:
		return "resumed"
	case EventFailed:
		return "failed"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event is something that happened to a lease.
type Event struct {
	Kind EventKind
	// Err is how the connection ended (EventLost) or why the lease cannot
	// be resumed (EventFailed); nil for EventResumed.
	Err error
}

// Resume backoff: the first redial is at once, then 50 ms doubling to 2 s.
const (
	firstBackoff = 50 * time.Millisecond
	maxBackoff   = 2 * time.Second
)

// Lease holds the sockets; closing it gives them back.
type Lease struct {
	Allocation string
	Netdev     string
	Queues     []uint32
	Sockets    []*xsk.Socket // in the order of Queues
	UMEM       *xsk.UMEM
	ZeroCopy   bool
	// MultiBuffer is whether the sockets take packets in several
	// descriptors (Options.MultiBuffer).
	MultiBuffer bool
	Limits      wire.Limits
	// BusyPoll is the busy polling the daemon set the sockets up for, or
	// nil (see the package documentation).
	BusyPoll *wire.BusyPoll

	path      string
	opts      Options
	rx, spare [][]uint64
	tx        [][]uint64

	rmu       sync.Mutex  // guards receivers
	receivers []*Receiver // made by Receiver, by socket
	made      []sync.Once // of each socket's Receiver

	mu      sync.Mutex    // guards conn, closed and inEvent
	conn    *net.UnixConn // to the daemon; nil while redialing
	closed  bool          // Close was called
	inEvent bool          // OnEvent runs
	stop    chan struct{} // closed by Close
	done    chan struct{} // closed when watch returns
	once    sync.Once     // of Close
	errs    error         // what Close returns
}

// RXFrames returns the UMEM frames socket i was given for receiving
// (they are on its fill ring when Connect returns).
func (l *Lease) RXFrames(i int) []uint64 { return l.rx[i] }

// SpareFrames returns an RX ring's worth of frames of socket i that are
// on no ring: a receive loop refills from them while the frames it holds
// are still being processed, so the fill ring never runs dry (a
// Receiver does once they are more than half the ring).
func (l *Lease) SpareFrames(i int) []uint64 { return l.spare[i] }

// TXFrames returns the UMEM frames socket i may transmit from.
func (l *Lease) TXFrames(i int) []uint64 { return l.tx[i] }

// Close gives the sockets back: they leave the XSKMAP and close. It stops
// a resume in progress and waits for the lease's goroutine to end (unless
// called from OnEvent). Closing again does nothing.
func (l *Lease) Close() error {
	l.once.Do(func() {
		l.mu.Lock()
		l.closed = true
		c, wait := l.conn, !l.inEvent
		l.conn = nil
		l.mu.Unlock()
		var errs []error
		if l.stop != nil {
			close(l.stop)
		}
		if c != nil {
			errs = append(errs, c.Close())
		}
		if wait && l.done != nil {
			<-l.done
		}
		l.rmu.Lock()
		receivers := slices.Clone(l.receivers)
		l.rmu.Unlock()
		for _, r := range receivers {
			if r != nil {
				errs = append(errs, r.close())
			}
		}
		for _, s := range l.Sockets {
			errs = append(errs, s.Close())
		}
		if l.UMEM != nil {
			errs = append(errs, l.UMEM.Close())
		}
		l.errs = errors.Join(errs...)
	})
	return l.errs
}

// Connect runs the whole handshake with the daemon at path ("" means
// $XDPQ_SOCKET) and returns the lease. While the allocation is still held
// by a connection the daemon has not seen close yet (a restarted
// container's predecessor), or the daemon's socket has a full backlog, it
// retries until the timeout.
func Connect(path string, o Options) (*Lease, error) {
	return ConnectContext(context.Background(), path, o)
}

// ConnectContext is Connect that gives up when ctx ends: it stops
// retrying a busy allocation, and a handshake under way ends by ctx's
// deadline if that comes before the timeout.
func ConnectContext(ctx context.Context, path string, o Options) (*Lease, error) {
	if path == "" {
		path = os.Getenv(EnvSocket)
		if path == "" {
			return nil, fmt.Errorf("no socket path given and %s is not set", EnvSocket)
		}
	}
	if o.FrameSize == 0 {
		o.FrameSize = xsk.FrameSize2K
		if o.MultiBuffer {
			o.FrameSize = xsk.FrameSize4K
		}
	}
	if o.Ring == 0 {
		o.Ring = DefaultRing
		if o.MultiBuffer {
			o.Ring = DefaultRingMultiBuffer
		}
	}
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Second
	}
	if o.Name == "" {
		o.Name = "xdpq-client"
	}
	deadline := time.Now().Add(o.Timeout)
	var busy error // the last refusal to retry: what kept the lease from ctx's end
	for {
		if err := ctx.Err(); err != nil {
			if busy != nil {
				return nil, fmt.Errorf("%w; gave up: %w", busy, err)
			}
			return nil, fmt.Errorf("connect %s: %w", path, err)
		}
		attempt := time.Now().Add(o.Timeout)
		cut := false // the attempt ends at ctx's deadline
		if d, ok := ctx.Deadline(); ok && d.Before(attempt) {
			attempt, cut = d, true
		}
		l, err := connect(path, o, attempt)
		if err == nil {
			l.path, l.opts = path, o
			l.stop, l.done = make(chan struct{}), make(chan struct{})
			l.receivers, l.made = make([]*Receiver, len(l.Sockets)), make([]sync.Once, len(l.Sockets))
			go l.watch()
			return l, nil
		}
		var pe *wire.ProtocolError
		retry := (errors.As(err, &pe) && pe.Code == wire.CodeBusy) || errors.Is(err, unix.EAGAIN)
		if retry {
			busy = err
		}
		// The attempt may have been cut short by ctx: say what kept it
		// waiting. Its socket's deadline (ctx's) can pass a moment before
		// ctx's own timer says so.
		end := ctx.Err()
		if end == nil && cut && !time.Now().Before(attempt) {
			end = context.DeadlineExceeded
		}
		if end != nil {
			why := err
			if busy != nil {
				why = busy
			}
			return nil, fmt.Errorf("%w; gave up: %w", why, end)
		}
		if !retry || time.Now().After(deadline) {
			return nil, err
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func dial(path string) (*net.UnixConn, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", path, err)
	}
	return c, nil
}

func connect(path string, o Options, deadline time.Time) (*Lease, error) {
	c, err := dial(path)
	if err != nil {
		return nil, err
	}
	l := &Lease{conn: c}
	ok := false
	defer func() {
		if !ok {
			// Given up: closing frees the sockets, mapping and connection
			// even on an error, and the handshake's error is the one to
			// tell.
			for _, s := range l.Sockets {
				_ = s.Close()
			}
			if l.UMEM != nil {
				_ = l.UMEM.Close()
			}
			_ = c.Close()
		}
	}()
	if err := c.SetDeadline(deadline); err != nil {
		return nil, fmt.Errorf("set handshake deadline: %w", err)
	}

	w, err := hello(c, o.Name)
	if err != nil {
		return nil, err
	}
	l.Allocation, l.Netdev, l.Queues, l.BusyPoll = w.Allocation, w.Netdev, w.Queues, w.BusyPoll
	if w.Limits != nil {
		l.Limits = *w.Limits
	}
	if o.Queues != nil {
		for _, q := range o.Queues {
			if !slices.Contains(w.Queues, q) {
				return nil, fmt.Errorf("queue %d is not in allocation %s (it has %v)", q, w.Allocation, w.Queues)
			}
		}
		l.Queues = o.Queues
	}
	rings := wire.Rings{Fill: o.Ring, Completion: o.Ring, RX: o.Ring}
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
		return nil, err // names the memfd
	}
	defer func() { _ = mf.Close() }() // the mapping and the daemon's copy hold the memory
	l.UMEM, err = xsk.MapUMEM(int(mf.Fd()), xsk.UMEMConfig{FrameSize: o.FrameSize, Headroom: o.Headroom})
	if err != nil {
		return nil, err // says "umem"
	}
	err = send(c, wire.Message{Type: wire.TypeRequest, FrameSize: o.FrameSize, Headroom: o.Headroom,
		Rings: &rings, Queues: l.Queues, MultiBuffer: o.MultiBuffer}, int(mf.Fd()))
	if err != nil {
		return nil, err
	}
	m, fds, err := expect(c, wire.TypeSockets, len(l.Queues))
	if err != nil {
		return nil, err
	}
	if len(fds) != len(l.Queues) || m.Rings == nil {
		closeFDs(fds)
		return nil, fmt.Errorf("the daemon sent %d sockets for %d queues", len(fds), len(l.Queues))
	}
	if m.MultiBuffer != o.MultiBuffer {
		closeFDs(fds)
		return nil, fmt.Errorf("asked for multi-buffer %v, the daemon bound the sockets with %v", o.MultiBuffer, m.MultiBuffer)
	}
	got := xsk.Rings{Fill: m.Rings.Fill, Completion: m.Rings.Completion, RX: m.Rings.RX, TX: m.Rings.TX}
	l.ZeroCopy, l.MultiBuffer = m.ZeroCopy, m.MultiBuffer
	for i, fd := range fds {
		s, err := xsk.Adopt(fd, l.UMEM, got)
		if err != nil {
			closeFDs(fds[i:])
			return nil, fmt.Errorf("queue %d: %w", l.Queues[i], err)
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
			return nil, fmt.Errorf("queue %d: fill ring took %d of %d frames", l.Queues[i], n, len(rx))
		}
	}
	if err := send(c, wire.Message{Type: wire.TypeReady}); err != nil {
		return nil, err
	}
	if _, _, err := expect(c, wire.TypeActive, 0); err != nil {
		return nil, err
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return nil, fmt.Errorf("clear handshake deadline: %w", err)
	}
	ok = true
	return l, nil
}

// hello opens the handshake and returns the daemon's welcome.
func hello(c *net.UnixConn, name string) (*wire.Message, error) {
	if err := send(c, wire.Message{Type: wire.TypeHello, Version: wire.Version, Client: name}); err != nil {
		return nil, err
	}
	w, _, err := expect(c, wire.TypeWelcome, 0)
	return w, err
}

// watch follows the connection to the daemon: when the daemon's end goes,
// it redials and resumes, until Close.
func (l *Lease) watch() {
	defer close(l.done)
	for {
		l.mu.Lock()
		c := l.conn
		l.mu.Unlock()
		if c == nil { // closed
			return
		}
		why := waitClosed(c)
		if !l.setConn(nil) {
			return // Close closed it
		}
		_ = c.Close() // the daemon's end is gone already; why says how
		l.emit(Event{Kind: EventLost, Err: why})
		if !l.redial() {
			return
		}
	}
}

// waitClosed reads the connection until the daemon closes it (the daemon
// sends nothing once the lease is active; what a newer one might send is
// ignored) and says how it ended.
func waitClosed(c *net.UnixConn) error {
	buf := make([]byte, wire.MaxMessage)
	for {
		n, fds, err := xsk.RecvFDs(c, buf, 0)
		closeFDs(fds)
		switch {
		case errors.Is(err, io.EOF) || (err == nil && n == 0):
			return errors.New("the daemon closed the connection")
		case errors.Is(err, xsk.ErrTruncated):
		case err != nil:
			return fmt.Errorf("connection to the daemon: %w", err)
		}
	}
}

// redial resumes the lease, backing off between attempts. It returns
// true once resumed, false when the lease is closed or the daemon refused.
func (l *Lease) redial() bool {
	delay := time.Duration(0)
	for {
		if delay > 0 {
			t := time.NewTimer(delay)
			select {
			case <-l.stop:
				t.Stop()
				return false
			case <-t.C:
			}
		}
		delay = min(max(2*delay, firstBackoff), maxBackoff)
		err := l.resume()
		var pe *wire.ProtocolError
		switch {
		case err == nil:
			l.emit(Event{Kind: EventResumed})
			return true
		case l.isClosed():
			return false
		case errors.As(err, &pe) && pe.Code != wire.CodeBusy && pe.Code != wire.CodeTimeout && pe.Code != wire.CodeInternal:
			l.emit(Event{Kind: EventFailed, Err: err})
			return false
		case errors.Is(err, errOther):
			l.emit(Event{Kind: EventFailed, Err: err})
			return false
		}
		// The daemon is not back yet (no socket, refused, closed during
		// the handshake), busy, or failed for now: try again.
	}
}

var errOther = errors.New("the socket serves another allocation")

// resume runs one resume handshake on a new connection.
func (l *Lease) resume() error {
	c, err := dial(l.path)
	if err != nil {
		return err
	}
	if !l.setConn(c) {
		_ = c.Close() // never used: the lease is closed
		return net.ErrClosed
	}
	ok := false
	defer func() {
		if !ok && l.setConn(nil) {
			_ = c.Close() // the resume failed; its error is the one to tell
		}
	}()
	if err := c.SetDeadline(time.Now().Add(l.opts.Timeout)); err != nil {
		return fmt.Errorf("set handshake deadline: %w", err)
	}
	w, err := hello(c, l.opts.Name)
	if err != nil {
		return err
	}
	if w.Allocation != l.Allocation {
		return fmt.Errorf("%w: %s, not %s", errOther, w.Allocation, l.Allocation)
	}
	fds := make([]int, len(l.Sockets))
	for i, s := range l.Sockets {
		fds[i] = s.FD()
	}
	if err := send(c, wire.Message{Type: wire.TypeResume, Queues: l.Queues}, fds...); err != nil {
		return err
	}
	if _, _, err := expect(c, wire.TypeActive, 0); err != nil {
		return err
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return fmt.Errorf("clear handshake deadline: %w", err)
	}
	ok = true
	return nil
}

// setConn makes c the lease's connection; false if the lease is closed
// (or, for nil, if Close took the connection already).
func (l *Lease) setConn(c *net.UnixConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.conn = c
	return true
}

func (l *Lease) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// emit tells OnEvent, unless the lease is closed.
func (l *Lease) emit(e Event) {
	if l.opts.OnEvent == nil {
		return
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.inEvent = true
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.inEvent = false
		l.mu.Unlock()
	}()
	l.opts.OnEvent(e)
}

func send(c *net.UnixConn, m wire.Message, fds ...int) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := xsk.SendFDs(c, b, fds); err != nil {
		return fmt.Errorf("send %s: %w", m.Type, err)
	}
	return nil
}

// expect receives the next message; the daemon's refusal becomes an
// error carrying its code and reason. Fields it does not know are
// ignored: a newer daemon may add some.
func expect(c *net.UnixConn, want string, maxFDs int) (*wire.Message, []int, error) {
	buf := make([]byte, wire.MaxMessage)
	n, fds, err := xsk.RecvFDs(c, buf, maxFDs)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, fmt.Errorf("waiting for %s: %w", want, err)
	}
	if n == 0 {
		closeFDs(fds)
		return nil, nil, fmt.Errorf("the daemon closed the connection before %s", want)
	}
	var m wire.Message
	if err := json.Unmarshal(buf[:n], &m); err != nil {
		closeFDs(fds)
		return nil, nil, fmt.Errorf("waiting for %s: not a protocol message: %w", want, err)
	}
	if m.Type == wire.TypeError {
		closeFDs(fds)
		return nil, nil, fmt.Errorf("the daemon refused: %w", &wire.ProtocolError{Code: m.Code, Reason: m.Reason})
	}
	if m.Type != want {
		closeFDs(fds)
		return nil, nil, fmt.Errorf("got a %q message, want %q", m.Type, want)
	}
	return &m, fds, nil
}

// closeFDs closes descriptors received and not kept: Linux frees a
// descriptor even when close reports an error, and nothing was written
// through them.
func closeFDs(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}
