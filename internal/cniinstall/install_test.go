package cniinstall

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/dsowner"
	"github.com/xdpq/xdpq/internal/testing/testnet"
)

// helperEnv makes the test binary a stand-in for a running CNI plugin: it
// blocks until its stdin closes.
const helperEnv = "XDPQ_CNIINSTALL_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "block" {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func writeFile(t *testing.T, p string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(p, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}

func inode(t *testing.T, p string) uint64 {
	t.Helper()
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Ino
}

// entries returns the names in dir.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestInstallFresh(t *testing.T) {
	src := filepath.Join(t.TempDir(), "xdpq")
	writeFile(t, src, []byte("plugin v1"), 0o700)
	dir := t.TempDir()
	changed, err := Install(src, dir, "xdpq")
	if err != nil || !changed {
		t.Fatalf("Install = %v, %v; want true, nil", changed, err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "xdpq"))
	if err != nil || string(b) != "plugin v1" {
		t.Fatalf("installed %q, %v", b, err)
	}
	st, _ := os.Stat(filepath.Join(dir, "xdpq"))
	if st.Mode() != 0o755 {
		t.Errorf("installed mode %v, want -rwxr-xr-x", st.Mode())
	}
	if names := entries(t, dir); len(names) != 1 {
		t.Errorf("dir holds %q, want the plugin only", names)
	}
}

// TestInstallReplacesRunningPlugin: a plugin that is running is replaced
// by a new file, never written: the old process runs on, a reader that
// opened the old file reads all of it, and the name holds the new one.
// The control shows that writing the file in place would have failed.
func TestInstallReplacesRunningPlugin(t *testing.T) {
	dir := t.TempDir()
	dst := filepath.Join(dir, "xdpq")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Install(self, dir, "xdpq"); err != nil {
		t.Fatal(err)
	}
	old, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(dst)
	cmd.Env = append(os.Environ(), helperEnv+"=block")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	// The control: the kernel refuses writes to a running executable.
	if f, err := os.OpenFile(dst, os.O_WRONLY, 0); err == nil {
		f.Close()
		t.Fatal("opening the running plugin for writing succeeded: the test shows nothing")
	} else if !errors.Is(err, unix.ETXTBSY) {
		t.Fatalf("opening the running plugin for writing: %v, want ETXTBSY", err)
	}
	reader, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	before := inode(t, dst)

	src := filepath.Join(t.TempDir(), "new")
	writeFile(t, src, []byte("plugin v2"), 0o755)
	changed, err := Install(src, dir, "xdpq")
	if err != nil || !changed {
		t.Fatalf("Install over a running plugin = %v, %v; want true, nil", changed, err)
	}
	if b, _ := os.ReadFile(dst); string(b) != "plugin v2" {
		t.Errorf("the name holds %q, want the new plugin", b)
	}
	if inode(t, dst) == before {
		t.Error("the plugin's inode is unchanged: it was written in place")
	}
	got, err := io.ReadAll(reader)
	if err != nil || !bytes.Equal(got, old) {
		t.Errorf("a reader of the old plugin read %d bytes (%v), want its %d", len(got), err, len(old))
	}
	if cmd.ProcessState != nil {
		t.Error("the running plugin exited")
	}
	if names := entries(t, dir); len(names) != 1 {
		t.Errorf("dir holds %q, want the plugin only", names)
	}
}

func TestInstallUnchangedWritesNothing(t *testing.T) {
	src := filepath.Join(t.TempDir(), "xdpq")
	writeFile(t, src, bytes.Repeat([]byte("x"), 200_000), 0o755) // more than one read buffer
	dir := t.TempDir()
	if _, err := Install(src, dir, "xdpq"); err != nil {
		t.Fatal(err)
	}
	ino := inode(t, filepath.Join(dir, "xdpq"))
	changed, err := Install(src, dir, "xdpq")
	if err != nil || changed {
		t.Fatalf("second Install = %v, %v; want false, nil", changed, err)
	}
	if inode(t, filepath.Join(dir, "xdpq")) != ino {
		t.Error("an unchanged plugin was replaced")
	}
	// Same content, another mode; then another content of the same size.
	if err := os.Chmod(filepath.Join(dir, "xdpq"), 0o700); err != nil {
		t.Fatal(err)
	}
	if changed, err := Install(src, dir, "xdpq"); err != nil || !changed {
		t.Errorf("Install over mode 0700 = %v, %v; want true, nil", changed, err)
	}
	writeFile(t, src, bytes.Repeat([]byte("y"), 200_000), 0o755)
	if changed, err := Install(src, dir, "xdpq"); err != nil || !changed {
		t.Errorf("Install of a new content of the same size = %v, %v; want true, nil", changed, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "xdpq")); !bytes.Equal(b, bytes.Repeat([]byte("y"), 200_000)) {
		t.Error("the new content is not installed")
	}
}

func TestInstallRemovesLeftTemps(t *testing.T) {
	src := filepath.Join(t.TempDir(), "xdpq")
	writeFile(t, src, []byte("plugin"), 0o755)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, ".xdpq.tmp-123"), []byte("half"), 0o600)
	writeFile(t, filepath.Join(dir, ".bridge.tmp-1"), []byte("not ours"), 0o600)
	writeFile(t, filepath.Join(dir, "bridge"), []byte("not ours"), 0o755)
	if _, err := Install(src, dir, "xdpq"); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(entries(t, dir), " ")
	if got != ".bridge.tmp-1 bridge xdpq" {
		t.Errorf("dir holds %s, want .bridge.tmp-1 bridge xdpq", got)
	}
}

func TestInstallRefuses(t *testing.T) {
	tmp := t.TempDir()
	src := filepath.Join(tmp, "xdpq")
	writeFile(t, src, []byte("plugin"), 0o755)
	notDir := filepath.Join(tmp, "file")
	writeFile(t, notDir, nil, 0o644)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "xdpq"), []byte("old plugin"), 0o755)
	for _, tc := range []struct {
		name, src, dir, plugin, want string
	}{
		{"missing dir", src, filepath.Join(tmp, "nope"), "xdpq", "CNI bin directory " + filepath.Join(tmp, "nope") + " does not exist: mount the host's CNI bin directory there"},
		{"dir is a file", src, notDir, "xdpq", "is not a directory"},
		{"missing source", filepath.Join(tmp, "gone"), dir, "xdpq", "install CNI plugin: open " + filepath.Join(tmp, "gone") + ": no such file or directory"},
		{"source is a directory", tmp, dir, "xdpq", "is not a regular file"},
		{"name with a slash", src, dir, "../xdpq", "want a file name"},
		{"hidden name", src, dir, ".xdpq", "want a file name"},
		{"empty name", src, dir, "", "want a file name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Install(tc.src, tc.dir, tc.plugin)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Install = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "xdpq")); string(b) != "old plugin" {
		t.Errorf("a refused Install changed the plugin to %q", b)
	}
	if names := entries(t, dir); len(names) != 1 {
		t.Errorf("dir holds %q after refusals, want the plugin only", names)
	}
}

// TestInstallReadOnlyDir: a bin directory mounted read-only fails with
// the file system's error and keeps the old plugin.
func TestInstallReadOnlyDir(t *testing.T) {
	testnet.RequireRoot(t)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	writeFile(t, filepath.Join(dir, "xdpq"), []byte("old plugin"), 0o755)
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "xdpq")
	writeFile(t, src, []byte("new plugin"), 0o755)
	_, err := Install(src, dir, "xdpq")
	if !errors.Is(err, unix.EROFS) || !strings.Contains(err.Error(), "install CNI plugin into "+dir) {
		t.Errorf("Install into a read-only dir = %v, want EROFS naming the dir", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "xdpq")); string(b) != "old plugin" {
		t.Errorf("the plugin is %q, want the old one", b)
	}
	if err := Remove(dir, "xdpq"); !errors.Is(err, unix.EROFS) {
		t.Errorf("Remove from a read-only dir = %v, want EROFS", err)
	}
}

func TestRemove(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "xdpq"), []byte("plugin"), 0o755)
	writeFile(t, filepath.Join(dir, ".xdpq.tmp-9"), []byte("half"), 0o600)
	writeFile(t, filepath.Join(dir, "bridge"), []byte("not ours"), 0o755)
	for range 2 { // the second finds nothing to remove
		if err := Remove(dir, "xdpq"); err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(entries(t, dir), " "); got != "bridge" {
			t.Errorf("dir holds %s, want bridge", got)
		}
	}
	if err := Remove(filepath.Join(dir, "nope"), "xdpq"); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("Remove from a missing dir = %v", err)
	}
}

func TestRemoveOnUninstallRefusesBadDir(t *testing.T) {
	o := &dsowner.Owner{API: &dsowner.API{Server: "https://127.0.0.1:1"}, Namespace: "xdpq", Name: "xdpq", Log: slog.Default()}
	err := RemoveOnUninstall(context.Background(), o, time.Second, filepath.Join(t.TempDir(), "nope"), "xdpq")
	if err == nil || !strings.Contains(err.Error(), "does not exist: mount the host's CNI bin directory there") {
		t.Errorf("RemoveOnUninstall into a missing dir = %v", err)
	}
}
