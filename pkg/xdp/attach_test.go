package xdp_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/xdp"
)

// foreign loads an XDP program that is not xdpq's, as an operator would.
func foreign(t *testing.T) *ebpf.Program {
	t.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "operator_pass", Type: ebpf.XDP, License: "MIT",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func TestAttachQueryDetach(t *testing.T) {
	for _, mode := range []xdp.Mode{xdp.ModeNative, xdp.ModeGeneric} {
		t.Run(mode.String(), func(t *testing.T) {
			p := testnet.NewPair(t, queues)
			nsPath := p.NSPath()
			if a, err := xdp.Query(nsPath, p.A.Index); err != nil || a != nil {
				t.Fatalf("fresh netdev: %+v, %v", a, err)
			}
			for _, kind := range []xdp.Kind{xdp.Direct, xdp.Filter} {
				prog, err := xdp.Load(kind, xdp.LoadOptions{Queues: queues})
				if err != nil {
					t.Fatal(err)
				}
				defer prog.Close()
				if _, err := xdp.Attach(nsPath, p.A.Index, prog.Prog(), mode); err != nil {
					t.Fatal(err)
				}
				a, err := xdp.Query(nsPath, p.A.Index)
				if err != nil || a == nil {
					t.Fatalf("query: %+v, %v", a, err)
				}
				info, _ := prog.Prog().Info()
				id, _ := info.ID()
				if !a.Ours || a.Kind != kind || a.Mode != mode || a.ID != id {
					t.Errorf("query %v: %+v, want ours, id %d", kind, a, id)
				}
				if err := xdp.Detach(nsPath, p.A.Index, mode, prog.Prog()); err != nil {
					t.Fatal(err)
				}
				if a, err := xdp.Query(nsPath, p.A.Index); err != nil || a != nil {
					t.Fatalf("after detach: %+v, %v", a, err)
				}
			}
		})
	}
}

// TestForeignProgramHasPrecedence: xdpq never replaces or removes a
// program that is not its own.
func TestForeignProgramHasPrecedence(t *testing.T) {
	p := testnet.NewPair(t, queues)
	nsPath := p.NSPath()
	op := foreign(t)
	ours, err := xdp.Load(xdp.Direct, xdp.LoadOptions{Queues: queues})
	if err != nil {
		t.Fatal(err)
	}
	defer ours.Close()

	if _, err := xdp.Attach(nsPath, p.A.Index, op, xdp.ModeNative); err != nil {
		t.Fatal(err)
	}
	a, err := xdp.Query(nsPath, p.A.Index)
	if err != nil || a == nil || a.Ours || a.Name != "operator_pass" {
		t.Fatalf("query foreign: %+v, %v", a, err)
	}
	// Neither mode may displace it: a generic program cannot coexist with
	// a native one, and a native one would replace it.
	for _, mode := range []xdp.Mode{xdp.ModeAuto, xdp.ModeNative, xdp.ModeGeneric} {
		if _, err := xdp.Attach(nsPath, p.A.Index, ours.Prog(), mode); !errors.Is(err, xdp.ErrOccupied) {
			t.Errorf("attach %v over a foreign program: %v, want ErrOccupied", mode, err)
		}
	}
	// Detach of "ours" must leave the foreign program alone.
	if err := xdp.Detach(nsPath, p.A.Index, xdp.ModeNative, ours.Prog()); !errors.Is(err, xdp.ErrOccupied) {
		t.Errorf("detach ours over a foreign program: %v, want ErrOccupied", err)
	}
	if a, err := xdp.Query(nsPath, p.A.Index); err != nil || a == nil || a.Name != "operator_pass" {
		t.Fatalf("foreign program gone: %+v, %v", a, err)
	}
	if err := xdp.Detach(nsPath, p.A.Index, xdp.ModeNative, nil); err != nil {
		t.Fatal(err)
	}
	if mode, err := xdp.Attach(nsPath, p.A.Index, ours.Prog(), xdp.ModeAuto); err != nil || mode != xdp.ModeNative {
		t.Fatalf("attach after the foreign program left: %v, %v", mode, err)
	}
	xdp.Detach(nsPath, p.A.Index, xdp.ModeNative, ours.Prog())
}

func TestPin(t *testing.T) {
	testnet.RequireRoot(t)
	if err := xdp.MountBPFFS(xdp.DefaultBPFFS); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(xdp.DefaultBPFFS, "xdpq-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	prog, err := xdp.Load(xdp.Filter, xdp.LoadOptions{Queues: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	pins := filepath.Join(dir, "xa")
	if err := prog.Pin(pins); err != nil {
		t.Fatal(err)
	}
	m, err := ebpf.LoadPinnedMap(filepath.Join(pins, "xsks"), nil)
	if err != nil {
		t.Fatal(err)
	}
	info, _ := m.Info()
	m.Close()
	if info.Type != ebpf.XSKMap || info.MaxEntries != 2 {
		t.Errorf("pinned xsks: %v with %d entries", info.Type, info.MaxEntries)
	}
	for _, name := range []string{"flows", "counters"} {
		if _, err := os.Stat(filepath.Join(pins, name)); err != nil {
			t.Error(err)
		}
	}
	if err := prog.Unpin(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(pins, "xsks")); !os.IsNotExist(err) {
		t.Errorf("xsks still pinned: %v", err)
	}
}
