package release

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPrevious: PREVIOUS_RELEASE names a commit of this history whose
// own VERSION is the version it gives, and that version is not this
// tree's: an upgrade from it is an upgrade.
func TestPrevious(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	version, commit, err := Previous(root)
	if err != nil {
		t.Fatal(err)
	}
	then, err := Git(context.Background(), root, "show", commit+":VERSION")
	if err != nil {
		t.Fatalf("%v (is the clone shallow? the tests build that release from history)", err)
	}
	if then != version {
		t.Errorf("%s says %s at %s; that commit's VERSION is %s", PreviousFile, version, commit[:12], then)
	}
	now, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(now)) == version {
		t.Errorf("this tree's VERSION is the previous release's, %s: a tree between releases says the next one with -dev", version)
	}
}

func TestPreviousParse(t *testing.T) {
	for _, tc := range []struct{ file, version, err string }{
		{"# c\n\n0.1.0 b697327c31c5a3907b7170ca0f3cd0a64790be3a\n", "0.1.0", ""},
		{"1.20.3-rc.1 b697327c31c5a3907b7170ca0f3cd0a64790be3a\n", "1.20.3-rc.1", ""},
		{"0.1.0 b697327\n", "", "40-digit"},
		{"0.1.0 B697327C31C5A3907B7170CA0F3CD0A64790BE3A\n", "", "40-digit"},
		{"0.1.0\n", "", "40-digit"},
		{"# nothing\n", "", "names no release"},
		{"0.1.0+x b697327c31c5a3907b7170ca0f3cd0a64790be3a\n", "", "x.y.z"},
		{"v0.1.0 b697327c31c5a3907b7170ca0f3cd0a64790be3a\n", "", "x.y.z"},
		{"0.01.0 b697327c31c5a3907b7170ca0f3cd0a64790be3a\n", "", "x.y.z"},
		{"0.1.0- b697327c31c5a3907b7170ca0f3cd0a64790be3a\n", "", "x.y.z"},
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, PreviousFile), []byte(tc.file), 0o644); err != nil {
			t.Fatal(err)
		}
		v, c, err := Previous(dir)
		if tc.err == "" && (err != nil || v != tc.version || len(c) != 40) || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%q: %q %q %v, want %q or error %q", tc.file, v, c, err, tc.version, tc.err)
		}
	}
}

// TestExport: a commit's files under a path, as they were; a commit the
// clone does not have is refused naming the way out.
func TestExport(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	_, commit, err := Previous(root)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dir := t.TempDir()
	if err := Export(ctx, root, commit, dir, "VERSION", "clients/c"); err != nil {
		t.Fatal(err)
	}
	want, err := Git(ctx, root, "show", commit+":clients/c/xdpq.h")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "clients/c/xdpq.h"))
	if err != nil || strings.TrimSpace(string(got)) != want {
		t.Errorf("exported clients/c/xdpq.h differs from the commit's (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); !os.IsNotExist(err) {
		t.Errorf("exported go.mod, not asked for: %v", err)
	}
	err = Export(ctx, root, strings.Repeat("0", 40), t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "unshallow") {
		t.Errorf("a commit not in the clone: %v", err)
	}
}
