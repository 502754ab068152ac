package broker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/xdpq/xdpq/pkg/xsk"
)

// Version is the native protocol version this package speaks.
const Version = 1

// MaxMessage is the largest message either side sends.
const MaxMessage = 4096

// Message types of the native protocol.
const (
	TypeHello   = "hello"   // client: version, client name
	TypeWelcome = "welcome" // server: the allocation and its limits
	TypeRequest = "request" // client: UMEM layout, rings, queues; memfd attached
	TypeResume  = "resume"  // client: instead of a request, the sockets of a lease the daemon recorded
	TypeSockets = "sockets" // server: bound sockets attached, in queue order
	TypeReady   = "ready"   // client: fill rings are filled
	TypeActive  = "active"  // server: the sockets are in the XSKMAP
	TypeError   = "error"   // server: refused; the connection closes
)

// Message is every message of the native protocol; Type says which fields
// matter.
type Message struct {
	Type    string `json:"type"`
	Version int    `json:"version,omitempty"`
	// hello
	Client string `json:"client,omitempty"`
	// welcome
	Allocation string    `json:"allocation,omitempty"`
	Netdev     string    `json:"netdev,omitempty"`
	Limits     *Limits   `json:"limits,omitempty"`
	BusyPoll   *BusyPoll `json:"busy_poll,omitempty"`
	// request, sockets and resume
	FrameSize uint32   `json:"frame_size,omitempty"`
	Headroom  uint32   `json:"headroom,omitempty"`
	Rings     *Rings   `json:"rings,omitempty"`
	Queues    []uint32 `json:"queues,omitempty"`
	ZeroCopy  bool     `json:"zero_copy,omitempty"`
	// error
	Code   string `json:"code,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// Rings are the sizes of a socket's rings, in entries; rx or tx may be 0.
type Rings struct {
	Fill       uint32 `json:"fill"`
	Completion uint32 `json:"completion"`
	RX         uint32 `json:"rx"`
	TX         uint32 `json:"tx"`
}

func (r Rings) xsk() xsk.Rings {
	return xsk.Rings{Fill: r.Fill, Completion: r.Completion, RX: r.RX, TX: r.TX}
}

// Limits are what one allocation may ask for; they come from its pool.
type Limits struct {
	MaxUMEM  int64  `json:"max_umem_bytes"` // memfd size
	MaxRing  uint32 `json:"max_ring"`       // entries in any ring
	AllowTX  bool   `json:"tx_allowed"`     // a TX ring lets the pod inject frames on the node's NIC
	MaxQueue int    `json:"max_queues"`     // queues in one request
}

// DefaultLimits are used when a pool sets none.
var DefaultLimits = Limits{MaxUMEM: 256 << 20, MaxRing: 8192, AllowTX: false, MaxQueue: 64}

// BusyPoll is a pool's preferred busy polling: the broker sets
// SO_PREFER_BUSY_POLL, SO_BUSY_POLL (TimeoutMicros) and
// SO_BUSY_POLL_BUDGET (Budget) on the sockets it hands out, which a pod
// cannot do itself without CAP_NET_ADMIN. The application then drives the
// queue from its own loop (recvfrom/sendto on the socket) and the NIC's
// interrupts can stay off (napi_defer_hard_irqs, gro_flush_timeout).
type BusyPoll struct {
	TimeoutMicros int `json:"timeout_us"`
	Budget        int `json:"budget"`
}

// Validate checks the setting against the kernel's bounds.
func (b BusyPoll) Validate() error {
	if b.TimeoutMicros <= 0 || b.TimeoutMicros > maxBusyPollTimeout {
		return fmt.Errorf("busy poll timeout %d µs: want 1..%d", b.TimeoutMicros, maxBusyPollTimeout)
	}
	if b.Budget <= 0 || b.Budget > maxBusyPollBudget {
		return fmt.Errorf("busy poll budget %d: want 1..%d", b.Budget, maxBusyPollBudget)
	}
	return nil
}

const (
	maxBusyPollTimeout = 1_000_000 // µs; the kernel takes any int, a second is plenty
	maxBusyPollBudget  = 65535     // SO_BUSY_POLL_BUDGET is a u16
)

// LeaseSocket is one socket of a lease as the kernel knows it: the queue
// it is bound to and its inode (fstat of its descriptor), which stays the
// same in every process that holds the socket.
type LeaseSocket struct {
	Queue uint32 `json:"queue"`
	Inode uint64 `json:"inode"`
}

// Error codes of TypeError.
const (
	CodeBadMessage = "bad-message" // not valid JSON or not the expected type
	CodeVersion    = "version"     // protocol version not spoken
	CodeForbidden  = "forbidden"   // the peer is not the allocation's pod
	CodeLimit      = "limit"       // the request breaks the allocation's limits
	CodeBadRequest = "bad-request" // the request is inconsistent
	CodeBusy       = "busy"        // the allocation has an active lease
	CodeTimeout    = "timeout"     // the client took too long
	CodeInternal   = "internal"    // the daemon failed
)

// ProtocolError is a refusal sent to the client.
type ProtocolError struct {
	Code   string
	Reason string
}

func (e *ProtocolError) Error() string { return e.Code + ": " + e.Reason }

func refuse(code, format string, args ...any) *ProtocolError {
	return &ProtocolError{Code: code, Reason: fmt.Sprintf(format, args...)}
}

// ParseMessage decodes one native message and checks that it is of type
// want. Unknown fields, trailing data and oversized messages are refused.
func ParseMessage(b []byte, want string) (*Message, error) {
	m, err := decodeMessage(b)
	if err != nil {
		return nil, err
	}
	if m.Type != want {
		return nil, refuse(CodeBadMessage, "got a %q message, want %q", m.Type, want)
	}
	return m, nil
}

// decodeMessage decodes one native message of any type, strictly.
func decodeMessage(b []byte) (*Message, error) {
	if len(b) == 0 || len(b) > MaxMessage {
		return nil, refuse(CodeBadMessage, "message of %d bytes; want 1 to %d", len(b), MaxMessage)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var m Message
	if err := dec.Decode(&m); err != nil {
		return nil, refuse(CodeBadMessage, "not a protocol message: %v", err)
	}
	if dec.More() {
		return nil, refuse(CodeBadMessage, "trailing data after the message")
	}
	return &m, nil
}

// checkRequest validates a request against the allocation.
func checkRequest(m *Message, queues []uint32, lim Limits) (xsk.Config, error) {
	if m.Rings == nil {
		return xsk.Config{}, refuse(CodeBadRequest, "no rings")
	}
	r := m.Rings.xsk()
	cfg := xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: m.FrameSize, Headroom: m.Headroom}, Rings: r}
	if err := r.Validate(); err != nil {
		return cfg, refuse(CodeBadRequest, "%v", err)
	}
	for name, n := range map[string]uint32{"fill": r.Fill, "completion": r.Completion, "rx": r.RX, "tx": r.TX} {
		if n > lim.MaxRing {
			return cfg, refuse(CodeLimit, "%s ring of %d entries; this allocation allows at most %d", name, n, lim.MaxRing)
		}
	}
	if r.TX > 0 && !lim.AllowTX {
		return cfg, refuse(CodeLimit, "a TX ring was asked for; this pool hands out receive-only sockets")
	}
	if len(m.Queues) == 0 {
		return cfg, refuse(CodeBadRequest, "no queues; this allocation has %v", queues)
	}
	if len(m.Queues) > lim.MaxQueue {
		return cfg, refuse(CodeLimit, "%d queues; at most %d per request", len(m.Queues), lim.MaxQueue)
	}
	seen := map[uint32]bool{}
	for _, q := range m.Queues {
		if seen[q] {
			return cfg, refuse(CodeBadRequest, "queue %d asked for twice", q)
		}
		seen[q] = true
		found := false
		for _, a := range queues {
			found = found || a == q
		}
		if !found {
			return cfg, refuse(CodeForbidden, "queue %d was not given to this allocation (it has %v)", q, queues)
		}
	}
	return cfg, nil
}

// checkResume validates a resume message against the allocation's
// recorded lease: it must name every recorded socket's queue once, with as
// many descriptors, in the same order.
func checkResume(m *Message, nfds int, recorded []LeaseSocket) error {
	if len(recorded) == 0 {
		return refuse(CodeForbidden, "this allocation has no lease to resume; connect afresh")
	}
	if len(m.Queues) != nfds {
		return refuse(CodeBadRequest, "a resume carries one socket per queue; got %d sockets for queues %v", nfds, m.Queues)
	}
	if len(m.Queues) != len(recorded) {
		return refuse(CodeBadRequest, "the lease to resume has %d sockets; a resume carries all of them, got %d", len(recorded), len(m.Queues))
	}
	if m.Rings != nil || m.FrameSize != 0 || m.Headroom != 0 {
		return refuse(CodeBadRequest, "a resume carries only queues and their sockets")
	}
	seen := map[uint32]bool{}
	for _, q := range m.Queues {
		if seen[q] {
			return refuse(CodeBadRequest, "queue %d named twice", q)
		}
		seen[q] = true
	}
	return nil
}

// checkMemfd validates the UMEM memfd against the layout and the limits.
func checkMemfd(fd int, cfg xsk.UMEMConfig, lim Limits) error {
	size, err := xsk.CheckMemfd(fd)
	if err != nil {
		return refuse(CodeBadRequest, "%v", err)
	}
	if size > lim.MaxUMEM {
		return refuse(CodeLimit, "umem memfd of %d bytes; this allocation allows at most %d", size, lim.MaxUMEM)
	}
	if err := cfg.Validate(size); err != nil {
		return refuse(CodeBadRequest, "umem: %v", err)
	}
	return nil
}

var errClosed = errors.New("connection closed")

func jsonMarshal(m Message) ([]byte, error) { return json.Marshal(m) }
