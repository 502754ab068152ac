package xsk

import (
	"errors"
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// MaxFDs is the most descriptors one message may carry, the kernel's
// SCM_MAX_FD.
const MaxFDs = 253

// SendFDs sends b with fds attached (SCM_RIGHTS) as one message on c, an
// AF_UNIX SOCK_SEQPACKET connection. The caller keeps its fds and should
// close them once sent: an open copy keeps a socket alive.
func SendFDs(c *net.UnixConn, b []byte, fds []int) error {
	if len(fds) > MaxFDs {
		return fmt.Errorf("send fds: %d fds, at most %d", len(fds), MaxFDs)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, oobn, err := c.WriteMsgUnix(b, oob, nil)
	if err != nil {
		return fmt.Errorf("send fds: %w", err)
	}
	if n != len(b) || oobn != len(oob) {
		return fmt.Errorf("send fds: short write (%d of %d bytes, %d of %d control)", n, len(b), oobn, len(oob))
	}
	return nil
}

// ErrTruncated is returned when a message or its descriptors did not fit.
var ErrTruncated = errors.New("message truncated")

// RecvFDs receives one message into b with at most maxFDs descriptors
// attached. The received descriptors are close-on-exec and belong to the
// caller. A message whose data or descriptors did not fit is refused with
// ErrTruncated and any descriptors that did arrive are closed.
func RecvFDs(c *net.UnixConn, b []byte, maxFDs int) (int, []int, error) {
	maxFDs = min(max(maxFDs, 0), MaxFDs)
	oob := make([]byte, unix.CmsgSpace(4*max(maxFDs, 1)))
	n, oobn, flags, _, err := c.ReadMsgUnix(b, oob)
	if err != nil {
		return 0, nil, fmt.Errorf("receive fds: %w", err)
	}
	fds, perr := parseRights(oob[:oobn])
	if perr == nil && len(fds) > maxFDs {
		perr = fmt.Errorf("%w: %d fds, at most %d", ErrTruncated, len(fds), maxFDs)
	}
	if perr == nil && flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		perr = fmt.Errorf("%w (flags %#x)", ErrTruncated, flags)
	}
	if perr != nil {
		closeFDs(fds...)
		return 0, nil, fmt.Errorf("receive fds: %w", perr)
	}
	return n, fds, nil
}

func parseRights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("parse control message: %w", err)
	}
	var fds []int
	var bad error
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_RIGHTS {
			bad = fmt.Errorf("unexpected control message level %d type %d", m.Header.Level, m.Header.Type)
			continue
		}
		r, err := unix.ParseUnixRights(&m)
		if err != nil {
			bad = err
			continue
		}
		fds = append(fds, r...)
	}
	if bad != nil {
		closeFDs(fds...)
		return nil, bad
	}
	return fds, nil
}
