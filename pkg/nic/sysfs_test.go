package nic

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/testing/testnet"
)

// TestNAPISettingsInNetNS: a sysfs mounted detached from inside a veth's
// namespace reads and writes the veth's NAPI settings; a sysfs mounted
// the classic way in that namespace reads back what was written, and the
// mount leaves nothing in the mount table.
func TestNAPISettingsInNetNS(t *testing.T) {
	p := testnet.NewPair(t, 2)
	s, err := MountSysfs(p.NSPath())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// The mount's id (fdinfo's mnt_id) is in no line of the mount table.
	info, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", s.fd))
	if err != nil {
		t.Fatal(err)
	}
	var mnt string
	for _, l := range strings.Split(string(info), "\n") {
		if v, ok := strings.CutPrefix(l, "mnt_id:"); ok {
			mnt = strings.TrimSpace(v)
		}
	}
	table, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil || mnt == "" {
		t.Fatalf("mount id %q, %v", mnt, err)
	}
	for _, l := range strings.Split(string(table), "\n") {
		if strings.HasPrefix(l, mnt+" ") {
			t.Errorf("MountSysfs's mount is in the mount table: %s", l)
		}
	}
	orig, err := s.NAPI("xa")
	if err != nil {
		t.Fatal(err)
	}
	want := NAPIConfig{DeferHardIRQs: 2, GROFlushTimeout: 200000}
	if orig == want {
		t.Fatalf("xa starts with %+v already", orig)
	}
	if err := s.SetNAPI("xa", want); err != nil {
		t.Fatal(err)
	}
	if got, err := s.NAPI("xa"); err != nil || got != want {
		t.Fatalf("read back %+v, %v; want %+v", got, err, want)
	}
	// An independent view: a sysfs mounted in the namespace at a path.
	dir := t.TempDir()
	if err := p.NS.Do(func(ns.NetNS) error { return unix.Mount("sysfs", dir, "sysfs", 0, "") }); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	for attr, v := range map[string]string{"napi_defer_hard_irqs": "2", "gro_flush_timeout": "200000"} {
		b, err := os.ReadFile(filepath.Join(dir, "class/net/xa", attr))
		if err != nil || strings.TrimSpace(string(b)) != v {
			t.Errorf("%s: %q, %v; want %s", attr, b, err, v)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "class/net/xb/napi_defer_hard_irqs")); strings.TrimSpace(string(got)) != "0" {
		t.Errorf("xb touched: napi_defer_hard_irqs %q", got)
	}
	o, err := OpenSysfs(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if err := o.SetNAPI("xa", orig); err != nil {
		t.Fatal(err)
	}
	if got, err := s.NAPI("xa"); err != nil || got != orig {
		t.Errorf("restored through the other view: %+v, %v; want %+v", got, err, orig)
	}
	if _, err := s.NAPI("nosuch"); err == nil {
		t.Error("a netdev that is not there has NAPI settings")
	}
	if _, err := s.NAPI("../xa"); err == nil {
		t.Error("a path for a netdev name was accepted")
	}
	// The caller's own namespace has no xa: the handle shows the pair's.
	host, err := MountSysfs("")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	if _, err := host.NAPI("xa"); err == nil {
		t.Error("the caller's namespace shows the pair's xa")
	}
}
