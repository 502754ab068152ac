package daemon

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/mover"
	"github.com/xdpq/xdpq/pkg/nic"
	"github.com/xdpq/xdpq/pkg/xdp"
)

// movedRecord is what the daemon records of a netdev in a pod, in its
// attachment, before it moves it: the mover's record (enough to find it
// wherever a crash left it and put it back as it was), and what the
// daemon needs of it while it is away. Its JSON, which the ledger keeps
// opaquely in the attachment's Moved, is that of a movedV1: see
// MarshalJSON.
type movedRecord struct {
	Mover  mover.Record
	Netns  string
	Device nic.Netdev   // as discovered on the node
	Policy agent.Policy // its pod agent's
}

// The format of a movedRecord. A restarted daemon reads what an older one
// wrote, so a field here is renamed or retyped only in a new version;
// nic.Netdev and agent.Policy are converted to it field by field
// (TestMovedCarriesEveryField names a field they gain and the format
// lacks). Version 1 has the keys and encodings json gave those types
// before the format was (their Go field names, xdp.Mode as its number, a
// duration in nanoseconds), so what older daemons wrote reads unchanged.
// A new version gets types of its own (movedV2 ...) and becomes
// movedVersion; the reader of each older version converts what it read
// to the new one (movedReaders). Testdata keeps a golden file of each
// version, read by every later daemon.

// movedVersion is the version of the record this daemon writes.
const movedVersion = 1

// movedV1 is a movedRecord, version 1. The records written before the
// version was have none, and are read as version 1.
type movedV1 struct {
	Version int `json:"version"`
	// Mover is the mover's record, in the format pkg/mover owns and
	// versions (mover.Record's MarshalJSON).
	Mover  mover.Record `json:"mover"`
	Netns  string       `json:"netns"`
	Device netdevV1     `json:"device"`
	Policy policyV1     `json:"policy"`
}

// netdevV1 is a nic.Netdev as discovered on the node.
type netdevV1 struct {
	Name     string `json:"Name"`
	Ifindex  int    `json:"Ifindex"`
	Driver   string `json:"Driver"`
	Virtual  bool   `json:"Virtual"`
	PCI      string `json:"PCI"`
	Vendor   string `json:"Vendor"`
	Device   string `json:"Device"`
	NUMANode int    `json:"NUMANode"`
	RXQueues int    `json:"RXQueues"`
	TXQueues int    `json:"TXQueues"`
	MAC      string `json:"MAC"`
	OperUp   bool   `json:"OperUp"`
	// XDP is nic.Features: the bits of the kernel's enum netdev_xdp_act,
	// and the top bit set when the kernel answered.
	XDP uint64 `json:"XDP"`
}

// policyV1 is an agent.Policy.
type policyV1 struct {
	Steering string      `json:"Steering"` // "auto", "hardware", "software" or ""
	Rules    ruleRangeV1 `json:"Rules"`
	// Reserved is null for none (nil), [] for an empty list.
	Reserved     []uint32 `json:"Reserved"`
	Mode         int      `json:"Mode"` // an index of modesV1
	AttachAlways bool     `json:"AttachAlways"`
	Exclusive    bool     `json:"Exclusive"`
	Linger       int64    `json:"Linger"` // nanoseconds
	BusyPoll     bool     `json:"BusyPoll"`
}

type ruleRangeV1 struct {
	First uint32 `json:"First"`
	Count uint32 `json:"Count"`
}

// modesV1 are the xdp.Modes by their number in version 1: the order of
// xdp's constants when the format was made, kept here whatever becomes
// of that order.
var modesV1 = []xdp.Mode{xdp.ModeNone, xdp.ModeAuto, xdp.ModeNative, xdp.ModeGeneric, xdp.ModeOffload}

// movedReader reads a record of one version and converts it to the
// current version.
type movedReader func([]byte) (movedV1, error)

// movedReaders are the versions this daemon reads; 0 is a record written
// before records had a version.
func movedReaders() map[int]movedReader {
	return map[int]movedReader{0: readMovedV1, 1: readMovedV1}
}

func readMovedV1(b []byte) (movedV1, error) {
	var r movedV1
	err := json.Unmarshal(b, &r)
	return r, err
}

// MarshalJSON writes the record in the current version of its format.
func (m movedRecord) MarshalJSON() ([]byte, error) {
	r, err := toMovedV1(m)
	if err != nil {
		return nil, err
	}
	return json.Marshal(r)
}

// UnmarshalJSON reads a record of any version this daemon knows; a newer
// one is refused.
func (m *movedRecord) UnmarshalJSON(b []byte) error {
	r, err := decodeMovedRecord(b, movedReaders())
	if err != nil {
		return err
	}
	rec, err := r.record()
	if err != nil {
		return fmt.Errorf("moved netdev record version %d: %w", r.Version, err)
	}
	*m = rec
	return nil
}

func decodeMovedRecord(b []byte, readers map[int]movedReader) (movedV1, error) {
	var v struct {
		Version int `json:"version"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return movedV1{}, err
	}
	read := readers[v.Version]
	switch {
	case v.Version > movedVersion:
		return movedV1{}, fmt.Errorf("moved netdev record version %d is newer than the %d this daemon reads: a newer xdpq wrote it; run that one on this node", v.Version, movedVersion)
	case read == nil:
		return movedV1{}, fmt.Errorf("moved netdev record version %d is not read by this daemon (it reads %d)", v.Version, movedVersion)
	}
	r, err := read(b)
	if err != nil {
		return movedV1{}, fmt.Errorf("moved netdev record version %d: %w", v.Version, err)
	}
	return r, nil
}

// toMovedV1 converts a record to its format; a mode version 1 has no
// number for is an error.
func toMovedV1(m movedRecord) (movedV1, error) {
	d, p := m.Device, m.Policy
	mode := slices.Index(modesV1, p.Mode)
	if mode < 0 {
		return movedV1{}, fmt.Errorf("moved netdev record: XDP mode %v has no number in version %d", p.Mode, movedVersion)
	}
	return movedV1{
		Version: movedVersion,
		Mover:   m.Mover,
		Netns:   m.Netns,
		Device: netdevV1{
			Name:     d.Name,
			Ifindex:  d.Ifindex,
			Driver:   d.Driver,
			Virtual:  d.Virtual,
			PCI:      d.PCI,
			Vendor:   d.Vendor,
			Device:   d.Device,
			NUMANode: d.NUMANode,
			RXQueues: d.RXQueues,
			TXQueues: d.TXQueues,
			MAC:      d.MAC,
			OperUp:   d.OperUp,
			XDP:      uint64(d.XDP),
		},
		Policy: policyV1{
			Steering:     string(p.Steering),
			Rules:        ruleRangeV1{First: p.Rules.First, Count: p.Rules.Count},
			Reserved:     slices.Clone(p.Reserved),
			Mode:         mode,
			AttachAlways: p.AttachAlways,
			Exclusive:    p.Exclusive,
			Linger:       int64(p.Linger),
			BusyPoll:     p.BusyPoll,
		},
	}, nil
}

// record is the movedRecord r describes.
func (r movedV1) record() (movedRecord, error) {
	d, p := r.Device, r.Policy
	if p.Mode < 0 || p.Mode >= len(modesV1) {
		return movedRecord{}, fmt.Errorf("policy: XDP mode %d unknown", p.Mode)
	}
	return movedRecord{
		Mover: r.Mover,
		Netns: r.Netns,
		Device: nic.Netdev{
			Name:     d.Name,
			Ifindex:  d.Ifindex,
			Driver:   d.Driver,
			Virtual:  d.Virtual,
			PCI:      d.PCI,
			Vendor:   d.Vendor,
			Device:   d.Device,
			NUMANode: d.NUMANode,
			RXQueues: d.RXQueues,
			TXQueues: d.TXQueues,
			MAC:      d.MAC,
			OperUp:   d.OperUp,
			XDP:      nic.Features(d.XDP),
		},
		Policy: agent.Policy{
			Steering:     agent.Steering(p.Steering),
			Rules:        agent.RuleRange{First: p.Rules.First, Count: p.Rules.Count},
			Reserved:     slices.Clone(p.Reserved),
			Mode:         modesV1[p.Mode],
			AttachAlways: p.AttachAlways,
			Exclusive:    p.Exclusive,
			Linger:       time.Duration(p.Linger),
			BusyPoll:     p.BusyPoll,
		},
	}, nil
}
