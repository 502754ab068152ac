package xdp

// LoadWithoutFrags loads as Load does on a kernel that does not take
// BPF_F_XDP_HAS_FRAGS (before Linux 5.18).
func LoadWithoutFrags(kind Kind, opts LoadOptions) (*Program, error) {
	opts.noFrags = true
	return load(kind, opts, nil)
}

// HaveFrags is haveFrags.
func HaveFrags() bool { return haveFrags() }
