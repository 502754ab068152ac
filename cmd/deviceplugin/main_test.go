package main

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/xdpq/xdpq"
	"github.com/xdpq/xdpq/internal/testing/testbin"
)

// TestVersionFlag: deviceplugin -version prints the release the binary
// was built at (the file VERSION) and exits, touching nothing.
func TestVersionFlag(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "deviceplugin")
	testbin.Build(t, bin, ".")
	out, err := exec.Command(bin, "-version").CombinedOutput()
	if want := "deviceplugin " + xdpq.Version() + "\n"; err != nil || string(out) != want {
		t.Errorf("deviceplugin -version: %q %v, want %q", out, err, want)
	}
}
