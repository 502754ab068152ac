// Package bpf holds xdpq's BPF programs and their compiled objects.
//
// xdpq_direct.c is the "direct receive" program: every frame goes to the
// AF_XDP socket of the queue it arrived on, or to the kernel when the queue
// has none. xdpq_filter.c is the software-steering program for netdevs
// without ntuple rules: only frames of flows listed in its flows map go to
// a socket.
//
// The objects and their Go bindings (*_bpfel.go, *_bpfel.o) are generated
// by bpf2go and committed, so building xdpq needs no clang. Regenerate them
// with `make generate` (clang-14 from Debian 12). Load and attach them with
// package github.com/xdpq/xdpq/pkg/xdp rather than through these bindings.
//
// direct_v0_bpfel.o is the direct program of earlier versions, before it
// counted frames; it is not generated. pkg/xdp loads it only to learn its
// instruction tag, so that a daemon recognises the program an earlier one
// left attached as xdpq's and replaces it.
package bpf
