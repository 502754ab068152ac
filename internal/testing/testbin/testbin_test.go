package testbin_test

import (
	"bytes"
	"debug/elf"
	"os"
	"path/filepath"
	"testing"

	"github.com/xdpq/xdpq/internal/testing/testbin"
)

// TestBuildIsStaticAndTrimmed: a test's binary is built as the image's
// are, static (no program interpreter: the dynamic loader a cgo build
// names) and -trimpath (no path of this machine's source tree in it), so
// its packages are the image's, from the same build cache.
func TestBuildIsStaticAndTrimmed(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "xdpqctl")
	testbin.Build(t, bin, "github.com/xdpq/xdpq/cmd/xdpqctl")
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatalf("%s has a program interpreter: built with cgo, not as the image's binaries", bin)
		}
	}
	src, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte(src+"/cmd/xdpqctl")) {
		t.Fatalf("%s names the source tree %s: not built -trimpath", bin, src)
	}
}

// TestBuildFails: a package that does not build fails the build, with
// the go command's words.
func TestBuildFails(t *testing.T) {
	err := testbin.Run(filepath.Join(t.TempDir(), "x"), "github.com/xdpq/xdpq/no/such/package")
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("no/such/package")) {
		t.Fatalf("build of a package that does not exist: %v", err)
	}
}
