package deviceplugin

import (
	"os"
	"path/filepath"
	"testing"
)

func TestDeviceInfo(t *testing.T) {
	dir := t.TempDir()
	if err := WriteDeviceInfo(dir, "xdpq.io/upf", "ens1f0-q8", "0000:3b:00.0"); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "xdpq.io-upf-ens1f0-q8-device.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:3b:00.0"}}` {
		t.Errorf("content %s", b)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o444 {
		t.Errorf("mode %v, want read-only", st.Mode())
	}
	// Written again for the next allocation of the device, then removed.
	if err := WriteDeviceInfo(dir, "xdpq.io/upf", "ens1f0-q8", "0000:3b:00.1"); err != nil {
		t.Fatal(err)
	}
	if err := RemoveDeviceInfo(dir, "xdpq.io/upf", "ens1f0-q8"); err != nil {
		t.Fatal(err)
	}
	if err := RemoveDeviceInfo(dir, "xdpq.io/upf", "ens1f0-q8"); err != nil {
		t.Errorf("removing twice: %v", err)
	}
	if err := WriteDeviceInfo(dir, "xdpq.io/upf", "veth0-q0", ""); err == nil {
		t.Error("a device without PCI address got a file")
	}
}
