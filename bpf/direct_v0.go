//go:build 386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm

package bpf

import (
	"bytes"
	_ "embed"
	"fmt"

	"github.com/cilium/ebpf"
)

// directV0 is the direct program as xdpq built it before it counted
// frames (xdpq_direct.c at commit 839e39b: an XSKMAP and nothing else),
// compiled then. It is not generated and never changes.
//
//go:embed direct_v0_bpfel.o
var directV0 []byte

// LoadDirectV0 returns the CollectionSpec of the direct program of
// earlier xdpq versions, which a daemon of such a version may have left
// attached: loaded once, it gives the instruction tag that tells it is
// xdpq's. It is never attached.
func LoadDirectV0() (*ebpf.CollectionSpec, error) {
	spec, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(directV0))
	if err != nil {
		return nil, fmt.Errorf("can't load DirectV0: %w", err)
	}
	return spec, nil
}
