package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	for _, content := range []string{`{"a":1}`, `{"a":2,"b":"longer than before"}`, `{}`} {
		if err := WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil || string(b) != content {
			t.Fatalf("read back %q, %v; want %q", b, err, content)
		}
		st, _ := os.Stat(path)
		if st.Mode().Perm() != 0o600 {
			t.Errorf("mode %v", st.Mode())
		}
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("temporary files left: %v", ents)
	}
	if err := WriteFile(filepath.Join(dir, "missing", "x"), nil, 0o600); err == nil {
		t.Error("a write into a missing directory succeeded")
	}
	if err := Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := Remove(path); err != nil {
		t.Errorf("removing a gone file: %v", err)
	}
}

func TestIsTemp(t *testing.T) {
	dir := t.TempDir()
	f, err := os.CreateTemp(dir, ".a.json.tmp-*")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	for name, want := range map[string]bool{filepath.Base(f.Name()): true, "a.json": false, ".hidden": false, "x.tmp-1": false} {
		if IsTemp(name) != want {
			t.Errorf("IsTemp(%q) = %v", name, !want)
		}
	}
}

// TestWriteFilePermUmask: the file gets perm whatever the umask, as
// os.WriteFile would not.
func TestWriteFilePermUmask(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	path := filepath.Join(t.TempDir(), "devinfo.json")
	if err := WriteFile(path, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v, %v; want 0644 under umask 077", st.Mode(), err)
	}
}

// TestWriteFileFailureLeavesNothing: a write that fails (here the rename,
// over a directory) leaves what was at path and no temporary file, and
// its error names path.
func TestWriteFileFailureLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	if err := os.MkdirAll(filepath.Join(path, "inside"), 0o700); err != nil {
		t.Fatal(err)
	}
	err := WriteFile(path, []byte("new"), 0o600)
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("write over a directory: %v; want an error naming %s", err, path)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || !ents[0].IsDir() {
		t.Errorf("left in the directory: %v", ents)
	}
	err = WriteFile(filepath.Join(dir, "missing", "x"), nil, 0o600)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a write into a missing directory: %v; want ErrNotExist", err)
	}
}

// BenchmarkWriteFile: WriteFile against the same steps through os.File
// (as WriteFile was written before), side by side, in the directory of
// $XDPQ_BENCH_DIR (a tmpfs, as /run is on a node, shows the system
// calls' cost; on a disk, fsync is all there is) or a test directory.
func BenchmarkWriteFile(b *testing.B) {
	data := make([]byte, 1500) // about a ledger record with an attachment
	for _, impl := range []struct {
		name  string
		write func(string, []byte, os.FileMode) error
	}{{"os.File", writeFileOS}, {"fd", WriteFile}} {
		b.Run(impl.name, func(b *testing.B) {
			dir := b.TempDir()
			if d := os.Getenv("XDPQ_BENCH_DIR"); d != "" {
				var err error
				if dir, err = os.MkdirTemp(d, "atomicfile-"); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { os.RemoveAll(dir) })
			}
			path := filepath.Join(dir, "big-0123456789ab.json")
			for b.Loop() {
				if err := impl.write(path, data, 0o600); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// writeFileOS is WriteFile's steps through os.File, for the benchmark.
func writeFileOS(path string, data []byte, perm os.FileMode) error {
	dir, base := filepath.Split(path)
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return err
	}
	if err := f.Chmod(perm); err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
