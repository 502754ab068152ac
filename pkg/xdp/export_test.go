package xdp

import (
	"github.com/cilium/ebpf"

	"github.com/xdpq/xdpq/bpf"
)

// LoadWithoutFrags loads as Load does on a kernel that does not take
// BPF_F_XDP_HAS_FRAGS (before Linux 5.18).
func LoadWithoutFrags(kind Kind, opts LoadOptions) (*Program, error) {
	opts.noFrags = true
	return load(kind, opts, nil)
}

// HaveFrags is haveFrags.
func HaveFrags() bool { return haveFrags() }

// LoadDirectV0 loads the direct program of earlier versions as they
// did, on xsks (nil: a new XSKMAP of queues entries).
func LoadDirectV0(queues int, xsks *ebpf.Map) (*ebpf.Program, error) {
	cs, err := bpf.LoadDirectV0()
	if err != nil {
		return nil, err
	}
	cs.Maps["xsks"].MaxEntries = uint32(queues)
	cs.Maps["xsks"].Key, cs.Maps["xsks"].Value = nil, nil
	opts := ebpf.CollectionOptions{}
	if xsks != nil {
		opts.MapReplacements = map[string]*ebpf.Map{"xsks": xsks}
	}
	coll, err := ebpf.NewCollectionWithOptions(cs, opts)
	if err != nil {
		return nil, err
	}
	defer coll.Close()
	return coll.DetachProgram(DirectName), nil
}

// FlowKey is f as the filter program's flow map key has it (family, the
// address's 16 bytes), and the flow read back from that key.
func FlowKey(f Flow) (family uint8, addr [16]byte, back Flow, err error) {
	k, err := f.key()
	if err != nil {
		return 0, addr, Flow{}, err
	}
	return k.Family, k.Addr, flowOfKey(k), nil
}
