package ledger

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/xdpq/xdpq/pkg/api"
)

// The record file's types. They are the format on disk, not the ledger's
// memory nor the API: a restarted daemon reads what an older one wrote,
// so a field here is renamed or retyped only in a new version. Allocation
// and the api types it holds are converted to them, field by field; a
// field added to those is lost on a restart until it is added here too
// (TestRecordCarriesEveryField says which).
//
// A new version gets types of its own (recordV2 ...) and becomes
// recordVersion; the reader of each older version converts what it read
// to the new one (recordReaders). Testdata keeps a golden file of each
// version, read by every later daemon.

// recordVersion is the version of the record this daemon writes.
const recordVersion = 1

// recordV1 is an allocation's file, version 1: the allocation, its owner,
// its lease's sockets and its CNI attachments.
type recordV1 struct {
	Version     int             `json:"version"`
	ID          string          `json:"id"`
	Pool        string          `json:"pool"`
	Resource    string          `json:"resource,omitempty"`
	Netdev      string          `json:"netdev"`
	Queues      []uint32        `json:"queues"`
	Devices     []string        `json:"devices"`
	Owner       ownerV1         `json:"owner"`
	Created     time.Time       `json:"created"`
	State       string          `json:"state"`
	Replaces    []string        `json:"replaces,omitempty"`
	Attachments []attachmentV1  `json:"attachments,omitempty"`
	Lease       []leaseSocketV1 `json:"lease,omitempty"`
	// Claim was added in version 1 without a new version: a daemon
	// without it reads a claim's allocation as one of the device
	// plugin's (and frees it when kubelet says no container holds its
	// devices, which is then the case).
	Claim *claimV1 `json:"claim,omitempty"`
}

// claimV1 is the DRA ResourceClaim an allocation serves.
type claimV1 struct {
	UID       string          `json:"uid"`
	Namespace string          `json:"namespace"`
	Name      string          `json:"name"`
	Flows     json.RawMessage `json:"flows,omitempty"`
	// Interface is the claim's interface configuration (a netdev-mode
	// pool's netdev in the pod), nil when it gives none.
	Interface json.RawMessage `json:"interface,omitempty"`
}

type ownerV1 struct {
	UID    *uint32 `json:"uid,omitempty"`
	PodUID string  `json:"podUID,omitempty"`
	AnyPod bool    `json:"anyPod,omitempty"`
}

type leaseSocketV1 struct {
	Queue uint32 `json:"queue"`
	Inode uint64 `json:"inode"`
}

// attachmentV1 is a CNI attachment: the plugin's request, what the daemon
// made of it, and where it is in its life.
type attachmentV1 struct {
	ContainerID  string   `json:"containerID"`
	IfName       string   `json:"ifName"`
	Allocation   string   `json:"allocation,omitempty"`
	Resource     string   `json:"resource,omitempty"`
	DeviceID     string   `json:"deviceID,omitempty"`
	PodUID       string   `json:"podUID,omitempty"`
	PodNamespace string   `json:"podNamespace,omitempty"`
	PodName      string   `json:"podName,omitempty"`
	Flows        []flowV1 `json:"flows,omitempty"`
	// Addresses are the pod's, as the plugin said at ADD.
	Addresses    []netip.Addr `json:"addresses,omitempty"`
	Netns        string       `json:"netns,omitempty"`
	MTU          int          `json:"mtu,omitempty"`
	Chained      bool         `json:"chained,omitempty"`
	AllocationID string       `json:"allocationID"`
	Netdev       string       `json:"netdev"`
	Queues       []uint32     `json:"queues"`
	Mode         string       `json:"mode"`
	Mac          string       `json:"mac,omitempty"`
	NetnsInode   uint64       `json:"netnsInode,omitempty"`
	State        string       `json:"state"`
	Moved        []byte       `json:"moved,omitempty"` // the netdev mover's, opaque here
	MapOut       bool         `json:"mapOut,omitempty"`
}

// flowV1 is a flow steered to an attachment. A prefix is written as
// netip writes it ("10.0.0.0/24", "" when none).
type flowV1 struct {
	Protocol string       `json:"protocol"`
	Dst      netip.Prefix `json:"dst"`
	DstPort  uint16       `json:"dstPort,omitempty"`
	Src      netip.Prefix `json:"src,omitzero"`
	SrcPort  uint16       `json:"srcPort,omitempty"`
	VLAN     uint16       `json:"vlan,omitempty"`
}

// recordReader reads a record file of one version and converts it to the
// current version.
type recordReader func([]byte) (recordV1, error)

// recordReaders are the versions this daemon reads. A version no longer
// read is left out: its files are refused, and kept, like any record that
// cannot be read.
func recordReaders() map[int]recordReader {
	return map[int]recordReader{1: readV1}
}

func readV1(b []byte) (recordV1, error) {
	var r recordV1
	err := json.Unmarshal(b, &r)
	return r, err
}

// encodeRecord is the file of allocation a.
func encodeRecord(a *Allocation) ([]byte, error) {
	b, err := json.Marshal(toRecord(a))
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// decodeRecord reads a record file of any version readers know, and
// checks that it describes allocation id.
func decodeRecord(b []byte, id string, readers map[int]recordReader) (*Allocation, error) {
	var v struct {
		Version int `json:"version"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, err
	}
	read := readers[v.Version]
	switch {
	case v.Version > recordVersion:
		return nil, fmt.Errorf("record version %d is newer than the %d this daemon reads: a newer xdpq wrote it; run that one on this node", v.Version, recordVersion)
	case read == nil:
		return nil, fmt.Errorf("record version %d is not read by this daemon (it reads %d)", v.Version, recordVersion)
	}
	r, err := read(b)
	if err != nil {
		return nil, fmt.Errorf("record version %d: %w", v.Version, err)
	}
	a := r.allocation()
	if err := checkRecord(a, id); err != nil {
		return nil, err
	}
	return a, nil
}

// toRecord converts an allocation to its record, to be written at once:
// they share their slices. A nil slice stays nil, since the file tells an
// empty list from none where json does.
func toRecord(a *Allocation) recordV1 {
	r := recordV1{
		Version:  recordVersion,
		ID:       a.ID,
		Pool:     a.Pool,
		Resource: a.Resource,
		Netdev:   a.Netdev,
		Queues:   a.Queues,
		Devices:  a.Devices,
		Owner:    ownerV1{UID: a.Owner.UID, PodUID: a.Owner.PodUID, AnyPod: a.Owner.AnyPod},
		Created:  a.Created,
		State:    string(a.State),
		Replaces: a.Replaces,
	}
	if a.Claim != nil {
		r.Claim = &claimV1{UID: a.Claim.UID, Namespace: a.Claim.Namespace, Name: a.Claim.Name, Flows: a.Claim.Flows, Interface: a.Claim.Interface}
	}
	if a.Attachments != nil {
		r.Attachments = make([]attachmentV1, len(a.Attachments))
		for i, att := range a.Attachments {
			r.Attachments[i] = toAttachmentV1(att)
		}
	}
	if a.Lease != nil {
		r.Lease = make([]leaseSocketV1, len(a.Lease))
		for i, s := range a.Lease {
			r.Lease[i] = leaseSocketV1(s)
		}
	}
	return r
}

func toAttachmentV1(a Attachment) attachmentV1 {
	r := attachmentV1{
		ContainerID:  a.ContainerID,
		IfName:       a.IfName,
		Allocation:   a.Allocation,
		Resource:     a.Resource,
		DeviceID:     a.DeviceID,
		PodUID:       a.PodUID,
		PodNamespace: a.PodNamespace,
		PodName:      a.PodName,
		Addresses:    slices.Clone(a.Addresses),
		Netns:        a.Netns,
		MTU:          a.MTU,
		Chained:      a.Chained,
		AllocationID: a.AllocationID,
		Netdev:       a.Netdev,
		Queues:       a.Queues,
		Mode:         a.Mode,
		Mac:          a.Mac,
		NetnsInode:   a.NetnsInode,
		State:        string(a.State),
		Moved:        a.Moved,
		MapOut:       a.MapOut,
	}
	if a.Flows != nil {
		r.Flows = make([]flowV1, len(a.Flows))
		for i, f := range a.Flows {
			r.Flows[i] = flowV1{Protocol: f.Protocol, Dst: f.Dst, DstPort: f.DstPort, Src: f.Src, SrcPort: f.SrcPort, VLAN: f.VLAN}
		}
	}
	return r
}

// allocation converts a record just read to the allocation it describes;
// they share their slices.
func (r recordV1) allocation() *Allocation {
	a := &Allocation{
		ID:       r.ID,
		Pool:     r.Pool,
		Resource: r.Resource,
		Netdev:   r.Netdev,
		Queues:   r.Queues,
		Devices:  r.Devices,
		Owner:    Owner{UID: r.Owner.UID, PodUID: r.Owner.PodUID, AnyPod: r.Owner.AnyPod},
		Created:  r.Created,
		State:    State(r.State),
		Replaces: r.Replaces,
	}
	if r.Claim != nil {
		a.Claim = &Claim{UID: r.Claim.UID, Namespace: r.Claim.Namespace, Name: r.Claim.Name, Flows: slices.Clone(r.Claim.Flows),
			Interface: slices.Clone(r.Claim.Interface)}
	}
	if r.Attachments != nil {
		a.Attachments = make([]Attachment, len(r.Attachments))
		for i, att := range r.Attachments {
			a.Attachments[i] = att.attachment()
		}
	}
	if r.Lease != nil {
		a.Lease = make([]LeaseSocket, len(r.Lease))
		for i, s := range r.Lease {
			a.Lease[i] = LeaseSocket(s)
		}
	}
	return a
}

func (r attachmentV1) attachment() Attachment {
	a := Attachment{
		Attachment: api.Attachment{
			CNIAddRequest: api.CNIAddRequest{
				ContainerID:  r.ContainerID,
				IfName:       r.IfName,
				Allocation:   r.Allocation,
				Resource:     r.Resource,
				DeviceID:     r.DeviceID,
				PodUID:       r.PodUID,
				PodNamespace: r.PodNamespace,
				PodName:      r.PodName,
				Addresses:    slices.Clone(r.Addresses),
				Netns:        r.Netns,
				MTU:          r.MTU,
				Chained:      r.Chained,
			},
			AllocationID: r.AllocationID,
			Netdev:       r.Netdev,
			Queues:       r.Queues,
			Mode:         r.Mode,
			Mac:          r.Mac,
			NetnsInode:   r.NetnsInode,
		},
		State:  State(r.State),
		Moved:  r.Moved,
		MapOut: r.MapOut,
	}
	if r.Flows != nil {
		a.Flows = make([]api.CNIFlow, len(r.Flows))
		for i, f := range r.Flows {
			a.Flows[i] = api.CNIFlow{Protocol: f.Protocol, Dst: f.Dst, DstPort: f.DstPort, Src: f.Src, SrcPort: f.SrcPort, VLAN: f.VLAN}
		}
	}
	return a
}
