package atomicfile

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/xdpq/xdpq/internal/testing/testnet"
)

// killWriterEnv, set to a path, makes the test binary write versions of
// a file there without end (TestWriteFileKilledMidWrite's writer).
const killWriterEnv = "ATOMICFILE_KILL_WRITER"

func TestMain(m *testing.M) {
	if path := os.Getenv(killWriterEnv); path != "" && len(os.Args) == 2 && os.Args[1] == "writer" {
		for i := 0; ; i++ {
			if err := WriteFile(path, version(i), 0o600); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			if i == 10 {
				fmt.Println("writing") // the parent kills from here on
			}
		}
	}
	os.Exit(m.Run())
}

// version is the content of the i-th write: 64 KiB, so that a write is
// several system calls and a kill lands inside one now and then.
func version(i int) []byte {
	return bytes.Repeat([]byte(fmt.Sprintf("%08d\n", i)), 64<<10/9)
}

// TestWriteFileKilledMidWrite: a writer killed (SIGKILL) at any instant
// leaves the file whole, some version's content, and at most a temporary
// file that IsTemp names.
func TestWriteFileKilledMidWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "record.json")
	for round := range 20 {
		cmd := exec.Command(os.Args[0], "writer")
		cmd.Env = append(os.Environ(), killWriterEnv+"="+path)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if !bufio.NewScanner(out).Scan() {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("round %d: the writer did not start", round)
		}
		cmd.Process.Kill()
		cmd.Wait()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		var i int
		if _, err := fmt.Sscanf(string(b), "%08d\n", &i); err != nil || !bytes.Equal(b, version(i)) {
			t.Fatalf("round %d: the file is not one whole version (%d bytes, starts %q)", round, len(b), b[:min(len(b), 20)])
		}
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if e.Name() != "record.json" && !IsTemp(e.Name()) {
				t.Fatalf("round %d: %s left in the directory, which IsTemp does not name", round, e.Name())
			}
			if IsTemp(e.Name()) {
				os.Remove(filepath.Join(dir, e.Name())) // as a reader does
			}
		}
	}
}

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
			path := filepath.Join(testnet.BenchDir(b, "atomicfile-"), "big-0123456789ab.json")
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
