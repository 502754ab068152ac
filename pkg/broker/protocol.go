package broker

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/xdpq/xdpq/pkg/wire"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// LeaseSocket is one socket of a lease as the kernel knows it: the queue
// it is bound to and its inode (fstat of its descriptor), which stays the
// same in every process that holds the socket.
type LeaseSocket struct {
	Queue uint32 `json:"queue"`
	Inode uint64 `json:"inode"`
}

func refuse(code, format string, args ...any) *wire.ProtocolError {
	return &wire.ProtocolError{Code: code, Reason: fmt.Sprintf(format, args...)}
}

// checkRequest validates a request against the allocation.
func checkRequest(m *wire.Message, queues []uint32, lim wire.Limits) (xsk.Config, error) {
	if m.Rings == nil {
		return xsk.Config{}, refuse(wire.CodeBadRequest, "no rings")
	}
	r := xskRings(*m.Rings)
	cfg := xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: m.FrameSize, Headroom: m.Headroom}, Rings: r, MultiBuffer: m.MultiBuffer}
	if err := r.Validate(); err != nil {
		return cfg, refuse(wire.CodeBadRequest, "%v", err)
	}
	for name, n := range map[string]uint32{"fill": r.Fill, "completion": r.Completion, "rx": r.RX, "tx": r.TX} {
		if n > lim.MaxRing {
			return cfg, refuse(wire.CodeLimit, "%s ring of %d entries; this allocation allows at most %d", name, n, lim.MaxRing)
		}
	}
	if r.TX > 0 && !lim.AllowTX {
		return cfg, refuse(wire.CodeLimit, "a TX ring was asked for; this pool hands out receive-only sockets")
	}
	if len(m.Queues) == 0 {
		return cfg, refuse(wire.CodeBadRequest, "no queues; this allocation has %v", queues)
	}
	if len(m.Queues) > lim.MaxQueue {
		return cfg, refuse(wire.CodeLimit, "%d queues; at most %d per request", len(m.Queues), lim.MaxQueue)
	}
	seen := map[uint32]bool{}
	for _, q := range m.Queues {
		if seen[q] {
			return cfg, refuse(wire.CodeBadRequest, "queue %d asked for twice", q)
		}
		seen[q] = true
		found := false
		for _, a := range queues {
			found = found || a == q
		}
		if !found {
			return cfg, refuse(wire.CodeForbidden, "queue %d was not given to this allocation (it has %v)", q, queues)
		}
	}
	return cfg, nil
}

// checkResume validates a resume message against the allocation's
// recorded lease: it must name every recorded socket's queue once, with as
// many descriptors, in the same order.
func checkResume(m *wire.Message, nfds int, recorded []LeaseSocket) error {
	if len(recorded) == 0 {
		return refuse(wire.CodeForbidden, "this allocation has no lease to resume; connect afresh")
	}
	if len(m.Queues) != nfds {
		return refuse(wire.CodeBadRequest, "a resume carries one socket per queue; got %d sockets for queues %v", nfds, m.Queues)
	}
	if len(m.Queues) != len(recorded) {
		return refuse(wire.CodeBadRequest, "the lease to resume has %d sockets; a resume carries all of them, got %d", len(recorded), len(m.Queues))
	}
	if m.Rings != nil || m.FrameSize != 0 || m.Headroom != 0 || m.MultiBuffer {
		return refuse(wire.CodeBadRequest, "a resume carries only queues and their sockets")
	}
	seen := map[uint32]bool{}
	for _, q := range m.Queues {
		if seen[q] {
			return refuse(wire.CodeBadRequest, "queue %d named twice", q)
		}
		seen[q] = true
	}
	return nil
}

// checkMemfd validates the UMEM memfd against the layout and the limits.
func checkMemfd(fd int, cfg xsk.UMEMConfig, lim wire.Limits) error {
	size, err := xsk.CheckMemfd(fd)
	if err != nil {
		return refuse(wire.CodeBadRequest, "%v", err)
	}
	if size > lim.MaxUMEM {
		return refuse(wire.CodeLimit, "umem memfd of %d bytes; this allocation allows at most %d", size, lim.MaxUMEM)
	}
	if err := cfg.Validate(size); err != nil {
		return refuse(wire.CodeBadRequest, "umem: %v", err)
	}
	return nil
}

var errClosed = errors.New("connection closed")

func jsonMarshal(m wire.Message) ([]byte, error) { return json.Marshal(m) }

func xskRings(r wire.Rings) xsk.Rings {
	return xsk.Rings{Fill: r.Fill, Completion: r.Completion, RX: r.RX, TX: r.TX}
}
