package main

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// TestBuildIntoNewDirectory: `make image` on a fresh clone, where bin/ is
// not there yet, writes its archive (it once failed: no such file or
// directory).
func TestBuildIntoNewDirectory(t *testing.T) {
	ctx := t.Context()
	if d, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d.Add(-15*time.Second))
		defer cancel()
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	// build runs from the module's root, as make image does.
	t.Chdir(filepath.Join(wd, "..", ".."))
	out := filepath.Join(t.TempDir(), "bin", "xdpq-image-"+runtime.GOARCH+".tar")
	if err := build(ctx, "go", runtime.GOARCH, "v0.0.0-test", "test", "", out); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(out); err != nil || st.Size() == 0 {
		t.Fatalf("the archive: %v, %v", st, err)
	}
}
