package mover

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Record is what a caller persists before anything moves: enough to find
// the netdev wherever a crash left it and to put it back as it was.
// Prepare fills it, and it never changes afterwards. Its JSON is that of
// a recordV1, the format a restarted daemon reads: see MarshalJSON.
type Record struct {
	// Name is the netdev's name on the node, and its alias while away.
	Name string
	// Index is its ifindex on the node when prepared.
	Index int
	// Temp is the name it carries between namespaces: xdpq<Index>.
	Temp string
	// Kind is its rtnetlink kind: "device" for a netdev with a driver of its
	// own, which the kernel returns to the initial namespace when the pod's
	// namespace goes; "veth" and other virtual kinds are destroyed with it.
	Kind string
	// Parent ("pci/0000:3b:02.1") and PermAddr (its permanent MAC) are its
	// hardware identity, where the kernel knows them: they find it whatever
	// it is called.
	Parent   string
	PermAddr string
	// Node is its node-side state, which MoveOut puts back.
	Node State
	// IfName is its name in the pod.
	IfName string
	// MTU is its MTU in the pod; 0 keeps the node's.
	MTU int
}

// State is the node-side state of a netdev that MoveOut restores.
type State struct {
	MTU      int
	MAC      string
	Alias    string
	AltNames []string
	TxQLen   int
	// The flags a user (or DPDK) may change.
	Up        bool
	Promisc   bool
	AllMulti  bool
	NoARP     bool
	Multicast bool
}

// stateOf reads the restorable state of a link.
func stateOf(a *netlink.LinkAttrs) State {
	f := a.RawFlags
	s := State{
		MTU:       a.MTU,
		Alias:     a.Alias,
		AltNames:  slices.Clone(a.AltNames),
		TxQLen:    a.TxQLen,
		Up:        f&unix.IFF_UP != 0,
		Promisc:   f&unix.IFF_PROMISC != 0,
		AllMulti:  f&unix.IFF_ALLMULTI != 0,
		NoARP:     f&unix.IFF_NOARP != 0,
		Multicast: f&unix.IFF_MULTICAST != 0,
	}
	if len(a.HardwareAddr) > 0 {
		s.MAC = a.HardwareAddr.String()
	}
	slices.Sort(s.AltNames)
	return s
}

// equal reports whether two states are the same, up aside when withUp is
// false.
func (s State) equal(o State, withUp bool) bool {
	if !withUp {
		s.Up, o.Up = false, false
	}
	return s.MTU == o.MTU && s.MAC == o.MAC && s.Alias == o.Alias && slices.Equal(s.AltNames, o.AltNames) &&
		s.TxQLen == o.TxQLen && s.Up == o.Up && s.Promisc == o.Promisc && s.AllMulti == o.AllMulti &&
		s.NoARP == o.NoARP && s.Multicast == o.Multicast
}

// String is the state as ip-link would print its parts.
func (s State) String() string {
	var flags []string
	for _, f := range []struct {
		on   bool
		name string
	}{{s.Up, "up"}, {s.Promisc, "promisc"}, {s.AllMulti, "allmulti"}, {s.NoARP, "noarp"}, {s.Multicast, "multicast"}} {
		if f.on {
			flags = append(flags, f.name)
		}
	}
	return fmt.Sprintf("mtu %d, mac %s, alias %q, altnames %v, txqlen %d, flags %s",
		s.MTU, s.MAC, s.Alias, s.AltNames, s.TxQLen, strings.Join(flags, "|"))
}

// tempName is the name a netdev of node ifindex index carries between
// namespaces.
func tempName(index int) string { return "xdpq" + strconv.Itoa(index) }

// returns reports whether the kernel gives the netdev back to the initial
// namespace when the namespace holding it is destroyed: those with a
// driver of their own do (and dsa ports); virtual ones are destroyed.
func (r *Record) returns() bool { return r.Kind == "device" || r.Kind == "dsa" }

// hardware reports whether the record knows the netdev's hardware identity.
func (r *Record) hardware() bool { return r.Parent != "" || r.PermAddr != "" }

// parentOf is a link's parent device as Record.Parent spells it.
func parentOf(a *netlink.LinkAttrs) string {
	if a.ParentDev == "" {
		return ""
	}
	return a.ParentDevBus + "/" + a.ParentDev
}

// Validate reports what makes a record (read back from disk, say) unusable.
func (r *Record) Validate() error {
	var errs []error
	for _, n := range []struct{ what, name string }{{"name", r.Name}, {"ifName", r.IfName}, {"temp", r.Temp}} {
		if err := validName(n.name); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n.what, err))
		}
	}
	for _, n := range r.Node.AltNames {
		if err := validAltName(n); err != nil {
			errs = append(errs, fmt.Errorf("altName: %w", err))
		}
	}
	if r.Index <= 0 {
		errs = append(errs, fmt.Errorf("index %d: not an ifindex", r.Index))
	} else if r.Temp != tempName(r.Index) {
		errs = append(errs, fmt.Errorf("temp %q: want %q for ifindex %d", r.Temp, tempName(r.Index), r.Index))
	}
	if r.Kind == "" {
		errs = append(errs, errors.New("kind: empty"))
	}
	if r.MTU < 0 || r.Node.MTU < 0 {
		errs = append(errs, fmt.Errorf("mtu %d (node %d): negative", r.MTU, r.Node.MTU))
	}
	if r.Node.TxQLen < 0 {
		errs = append(errs, fmt.Errorf("txQLen %d: negative", r.Node.TxQLen))
	}
	for _, a := range []struct{ what, mac string }{{"mac", r.Node.MAC}, {"permAddr", r.PermAddr}} {
		if a.mac == "" {
			continue
		}
		if _, err := net.ParseMAC(a.mac); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", a.what, err))
		}
	}
	if len(r.Node.Alias) >= 256 {
		errs = append(errs, fmt.Errorf("alias: %d bytes, the kernel keeps 255", len(r.Node.Alias)))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("netdev record %q: %w", r.Name, err)
	}
	return nil
}

// validName applies the kernel's rules for an interface name
// (dev_valid_name).
func validName(n string) error { return validIfName(n, unix.IFNAMSIZ) }

// validAltName applies them to an alternative name, which may be longer.
func validAltName(n string) error { return validIfName(n, 128) }

func validIfName(n string, size int) error {
	switch {
	case n == "":
		return errors.New("empty interface name")
	case len(n) >= size:
		return fmt.Errorf("interface name %q: longer than %d bytes", n, size-1)
	case n == "." || n == "..":
		return fmt.Errorf("interface name %q: not allowed", n)
	case strings.ContainsAny(n, "/: \t\n\v\f\r\x00"):
		return fmt.Errorf("interface name %q: has '/', ':', a NUL or white space", n)
	}
	return nil
}

// Link is a netdev where MoveIn left it.
type Link struct {
	Name  string
	Index int
	MAC   net.HardwareAddr
}

func linkOf(a *netlink.LinkAttrs) Link {
	return Link{Name: a.Name, Index: a.Index, MAC: slices.Clone(a.HardwareAddr)}
}

// Place is where a netdev is, as Locate finds it.
type Place int

const (
	// Nowhere: in none of the pod's, the node's and the initial
	// namespaces. A virtual netdev whose pod's namespace went is
	// destroyed; one with a driver of its own may be on its way back to
	// the initial namespace (MoveOut waits for it).
	Nowhere Place = iota
	// OnNode: on the node under its own name.
	OnNode
	// InPod: in the pod under its pod name.
	InPod
	// Between: anywhere else, half moved: MoveOut brings it back.
	Between
)

func (p Place) String() string {
	switch p {
	case Nowhere:
		return "nowhere"
	case OnNode:
		return "on the node"
	case InPod:
		return "in the pod"
	case Between:
		return "half moved"
	}
	return "place(" + strconv.Itoa(int(p)) + ")"
}

// Location is where Locate found a netdev.
type Location struct {
	Place Place
	// Netns is the namespace it is in: "pod", "node" or "initial".
	Netns string
	// Link is its name, ifindex and MAC there.
	Link Link
	// State is its state there.
	State State
	// Settled says the move that leads to Place is complete: OnNode with
	// all of the node state recorded, InPod with the MTU asked for and up
	// (as MoveIn left it: the pod may since have changed either).
	Settled bool
}

func (l Location) String() string {
	if l.Place == Nowhere {
		return l.Place.String()
	}
	s := fmt.Sprintf("%s as %s (ifindex %d) in the %s namespace", l.Place, l.Link.Name, l.Link.Index, l.Netns)
	if !l.Settled && l.Place != Between {
		s += ", not settled"
	}
	return s
}

// The format of a Record, as its caller persists it. A restarted daemon
// reads what an older one wrote, so a field here is renamed or retyped
// only in a new version; Record and State are converted to it field by
// field (TestRecordCarriesEveryField names a field they gain and the
// format lacks). A new version gets types of its own (recordV2 ...) and
// becomes recordVersion; the reader of each older version converts what
// it read to the new one (recordReaders). Testdata keeps a golden file of
// each version, read by every later mover.

// recordVersion is the version of the record this mover writes.
const recordVersion = 1

// recordV1 is a Record, version 1. The records written before the
// version was have none, and are read as version 1.
type recordV1 struct {
	Version  int     `json:"version"`
	Name     string  `json:"name"`
	Index    int     `json:"index"`
	Temp     string  `json:"temp"`
	Kind     string  `json:"kind"`
	Parent   string  `json:"parent,omitempty"`
	PermAddr string  `json:"permAddr,omitempty"`
	Node     stateV1 `json:"node"`
	IfName   string  `json:"ifName"`
	MTU      int     `json:"mtu,omitempty"`
}

type stateV1 struct {
	MTU       int      `json:"mtu"`
	MAC       string   `json:"mac,omitempty"`
	Alias     string   `json:"alias,omitempty"`
	AltNames  []string `json:"altNames,omitempty"`
	TxQLen    int      `json:"txQLen"`
	Up        bool     `json:"up"`
	Promisc   bool     `json:"promisc"`
	AllMulti  bool     `json:"allMulti"`
	NoARP     bool     `json:"noARP"`
	Multicast bool     `json:"multicast"`
}

// recordReader reads a record of one version and converts it to the
// current version.
type recordReader func([]byte) (recordV1, error)

// recordReaders are the versions this mover reads; 0 is a record written
// before records had a version.
func recordReaders() map[int]recordReader {
	return map[int]recordReader{0: readV1, 1: readV1}
}

func readV1(b []byte) (recordV1, error) {
	var r recordV1
	err := json.Unmarshal(b, &r)
	return r, err
}

// MarshalJSON writes the record in the current version of its format.
func (r Record) MarshalJSON() ([]byte, error) {
	return json.Marshal(recordV1{
		Version:  recordVersion,
		Name:     r.Name,
		Index:    r.Index,
		Temp:     r.Temp,
		Kind:     r.Kind,
		Parent:   r.Parent,
		PermAddr: r.PermAddr,
		Node:     stateV1(r.Node),
		IfName:   r.IfName,
		MTU:      r.MTU,
	})
}

// UnmarshalJSON reads a record of any version this mover knows; a newer
// one is refused. It does not validate the record: see Validate.
func (r *Record) UnmarshalJSON(b []byte) error {
	rec, err := decodeRecord(b, recordReaders())
	if err != nil {
		return err
	}
	*r = rec.record()
	return nil
}

func decodeRecord(b []byte, readers map[int]recordReader) (recordV1, error) {
	var v struct {
		Version int `json:"version"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return recordV1{}, err
	}
	read := readers[v.Version]
	switch {
	case v.Version > recordVersion:
		return recordV1{}, fmt.Errorf("netdev record version %d is newer than the %d this daemon reads: a newer xdpq wrote it; run that one on this node", v.Version, recordVersion)
	case read == nil:
		return recordV1{}, fmt.Errorf("netdev record version %d is not read by this daemon (it reads %d)", v.Version, recordVersion)
	}
	rec, err := read(b)
	if err != nil {
		return recordV1{}, fmt.Errorf("netdev record version %d: %w", v.Version, err)
	}
	return rec, nil
}

// record is the Record r describes.
func (r recordV1) record() Record {
	return Record{
		Name:     r.Name,
		Index:    r.Index,
		Temp:     r.Temp,
		Kind:     r.Kind,
		Parent:   r.Parent,
		PermAddr: r.PermAddr,
		Node:     State(r.Node),
		IfName:   r.IfName,
		MTU:      r.MTU,
	}
}
