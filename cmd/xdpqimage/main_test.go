package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBuildIntoNewDirectory: `make image` on a fresh clone, where bin/ is
// not there yet, writes its archive (it once failed: no such file or
// directory). The go command is a stand-in that writes each binary's
// file: what is tested is the archive's path, not the compiler
// (internal/tools/image compiles the image for real).
func TestBuildIntoNewDirectory(t *testing.T) {
	fakeGo := filepath.Join(t.TempDir(), "go")
	// go build [flags] -o OUT PKG: write OUT.
	script := "#!/bin/sh\nwhile [ $# -gt 0 ]; do if [ \"$1\" = -o ]; then echo binary > \"$2\"; exit 0; fi; shift; done; exit 1\n"
	if err := os.WriteFile(fakeGo, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "bin", "xdpq-image-arm64.tar")
	if err := build(t.Context(), fakeGo, "arm64", "v0.0.0-test", "test", "", out); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(out); err != nil || st.Size() == 0 {
		t.Fatalf("the archive: %v, %v", st, err)
	}
	left, err := filepath.Glob(filepath.Join(filepath.Dir(out), ".*tmp*"))
	if err != nil || len(left) > 0 {
		t.Errorf("left beside the archive: %s %v", strings.Join(left, " "), err)
	}
}
