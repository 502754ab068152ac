// Package wire is the native protocol of xdpq's socket broker as both
// sides speak it: the messages and their limits, the refusal codes and
// the strict decoding. The broker (pkg/broker) and the Go client
// (pkg/client) import it; docs/protocol.md describes it for every client
// (clients/c follows it too).
package wire

import (
	"bytes"
	"encoding/json"
	"fmt"
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
	// MultiBuffer (request, sockets): the sockets are bound with
	// XDP_USE_SG, so a packet larger than a UMEM frame comes (and may be
	// sent) in several descriptors, each but the last with XDP_PKT_CONTD.
	// The client asks; the server says it did.
	MultiBuffer bool `json:"multi_buffer,omitempty"`
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
	if b.TimeoutMicros <= 0 || b.TimeoutMicros > MaxBusyPollTimeout {
		return fmt.Errorf("busy poll timeout %d µs: want 1..%d", b.TimeoutMicros, MaxBusyPollTimeout)
	}
	if b.Budget <= 0 || b.Budget > MaxBusyPollBudget {
		return fmt.Errorf("busy poll budget %d: want 1..%d", b.Budget, MaxBusyPollBudget)
	}
	return nil
}

// The bounds of BusyPoll.
const (
	MaxBusyPollTimeout = 1_000_000 // µs; the kernel takes any int, a second is plenty
	MaxBusyPollBudget  = 65535     // SO_BUSY_POLL_BUDGET is a u16
)

// Error codes of TypeError.
const (
	CodeBadMessage = "bad-message" // not valid JSON or not the expected type
	CodeVersion    = "version"     // protocol version not spoken
	CodeForbidden  = "forbidden"   // the peer is not the allocation's pod
	CodeLimit      = "limit"       // the request breaks the allocation's limits
	CodeBadRequest = "bad-request" // the request is inconsistent
	CodeBusy       = "busy"        // the allocation has an active lease, or a queue's previous holder has not let it go yet: try again
	CodeTimeout    = "timeout"     // the client took too long
	CodeInternal   = "internal"    // the daemon failed
)

// ProtocolError is a refusal sent to the client.
type ProtocolError struct {
	Code   string
	Reason string
}

// Error says the code and the reason.
func (e *ProtocolError) Error() string { return e.Code + ": " + e.Reason }

// ParseMessage decodes one native message and checks that it is of type
// want. Unknown fields, trailing data and oversized messages are refused.
func ParseMessage(b []byte, want string) (*Message, error) {
	m, err := Decode(b)
	if err != nil {
		return nil, err
	}
	if m.Type != want {
		return nil, badMessage("got a %q message, want %q", m.Type, want)
	}
	return m, nil
}

// Decode decodes one native message of any type, strictly: unknown
// fields, trailing data and oversized messages are refused.
func Decode(b []byte) (*Message, error) {
	if len(b) == 0 || len(b) > MaxMessage {
		return nil, badMessage("message of %d bytes; want 1 to %d", len(b), MaxMessage)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var m Message
	if err := dec.Decode(&m); err != nil {
		return nil, badMessage("not a protocol message: %v", err)
	}
	if dec.More() {
		return nil, badMessage("trailing data after the message")
	}
	return &m, nil
}

func badMessage(format string, args ...any) *ProtocolError {
	return &ProtocolError{Code: CodeBadMessage, Reason: fmt.Sprintf(format, args...)}
}
