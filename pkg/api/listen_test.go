package api

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// umask reads the process's umask without changing it.
func umask(t *testing.T) fs.FileMode {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "Umask:"); ok {
			m, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32)
			if err != nil {
				t.Fatal(err)
			}
			return fs.FileMode(m)
		}
	}
	t.Fatal("no Umask in /proc/self/status")
	return 0
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// staleSocket leaves a socket at path that nobody listens on, as a daemon
// killed with SIGKILL does.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
}

// TestListen: a socket, mode 0600, where nothing or a stale socket was,
// its directory made 0755.
func TestListen(t *testing.T) {
	for _, tt := range []struct {
		name   string
		before func(t *testing.T, path string)
	}{
		{"nothing there", func(*testing.T, string) {}},
		{"stale socket", staleSocket},
		{"directory missing", func(t *testing.T, path string) { os.Remove(filepath.Dir(path)) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "run", "api.sock")
			if err := os.Mkdir(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			tt.before(t, path)
			ln, err := Listen(path)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			fi, err := os.Lstat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 {
				t.Errorf("socket mode %v, want a socket of 0600", fi.Mode())
			}
			if tt.name == "directory missing" {
				di, err := os.Stat(filepath.Dir(path))
				if err != nil || di.Mode().Perm() != 0o755&^umask(t) {
					t.Errorf("directory: %v, %v; want 0755 less the umask %o", di.Mode(), err, umask(t))
				}
			}
			stillAccepts(t, ln, path) // a stale socket would refuse
			if ln.Addr().String() != path {
				t.Errorf("Addr %s", ln.Addr())
			}
		})
	}
}

// TestListenRefuses: whatever is at the path that is not a stale socket
// is refused, named in the error, and left as it was.
func TestListenRefuses(t *testing.T) {
	dir := t.TempDir()
	long := filepath.Join(dir, strings.Repeat("x", 108-len(dir)-1))
	if len(long) != 108 {
		t.Fatal(len(long))
	}
	for _, tt := range []struct {
		name   string
		path   string
		before func(t *testing.T, path string) (check func())
		says   string
	}{
		{"file", "api.sock", func(t *testing.T, path string) func() {
			if err := os.WriteFile(path, []byte("keep"), 0o644); err != nil {
				t.Fatal(err)
			}
			return func() {
				if b, err := os.ReadFile(path); string(b) != "keep" {
					t.Errorf("file now %q, %v", b, err)
				}
			}
		}, "a regular file (4 bytes) is there"},
		{"empty directory", "api.sock", func(t *testing.T, path string) func() {
			if err := os.Mkdir(path, 0o755); err != nil {
				t.Fatal(err)
			}
			return func() {
				if fi, err := os.Stat(path); err != nil || !fi.IsDir() {
					t.Errorf("directory gone: %v", err)
				}
			}
		}, "an empty directory is there"},
		{"directory", "api.sock", func(t *testing.T, path string) func() {
			if err := os.MkdirAll(filepath.Join(path, "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(path, "f"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			return func() {
				if ents, err := os.ReadDir(path); len(ents) != 2 {
					t.Errorf("directory now %v, %v", ents, err)
				}
			}
		}, "a directory of 2 entries is there"},
		{"symlink", "api.sock", func(t *testing.T, path string) func() {
			if err := os.Symlink("/run/elsewhere.sock", path); err != nil {
				t.Fatal(err)
			}
			return func() {
				if to, err := os.Readlink(path); to != "/run/elsewhere.sock" {
					t.Errorf("symlink now %q, %v", to, err)
				}
			}
		}, "a symbolic link to /run/elsewhere.sock is there"},
		{"fifo", "api.sock", func(t *testing.T, path string) func() {
			if err := unix.Mkfifo(path, 0o600); err != nil {
				t.Fatal(err)
			}
			return func() {
				if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != fs.ModeNamedPipe {
					t.Errorf("fifo gone: %v", err)
				}
			}
		}, "a named pipe is there"},
		{"live socket", "api.sock", func(t *testing.T, path string) func() {
			ln, err := net.Listen("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			return func() { stillAccepts(t, ln, path) }
		}, "another xdpq daemon (or another process) serves"},
		{"live socket of Listen", "api.sock", func(t *testing.T, path string) func() {
			ln, err := Listen(path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			return func() { stillAccepts(t, ln, path) }
		}, "another xdpq daemon (or another process) serves"},
		{"live datagram socket", "api.sock", func(t *testing.T, path string) func() {
			c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return func() {
				if _, err := os.Lstat(path); err != nil {
					t.Errorf("datagram socket gone: %v", err)
				}
			}
		}, "a socket is there and probing it failed (connect: protocol wrong type for socket)"},
		{"parent is a file", "file/api.sock", func(t *testing.T, path string) func() {
			if err := os.WriteFile(filepath.Dir(path), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			return func() {}
		}, "its directory BASE/file is a regular file (1 bytes)"},
		{"grandparent is a file", "file/sub/api.sock", func(t *testing.T, path string) func() {
			if err := os.WriteFile(filepath.Dir(filepath.Dir(path)), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			return func() {}
		}, "its directory BASE/file/sub cannot be made: BASE/file is a regular file (1 bytes)"},
		{"path too long", long, func(*testing.T, string) func() { return func() {} },
			"the path is 108 bytes, longer than the 107 a Unix socket can have"},
		{"no path", "", func(*testing.T, string) func() { return func() {} }, "api socket: no path"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			base := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "-"))
			if err := os.Mkdir(base, 0o755); err != nil {
				t.Fatal(err)
			}
			path := tt.path
			if path != "" && !filepath.IsAbs(path) {
				path = filepath.Join(base, path)
			}
			says := strings.ReplaceAll(tt.says, "BASE", base)
			check := tt.before(t, path)
			ln, err := Listen(path)
			if err == nil {
				ln.Close()
				t.Fatalf("Listen(%s) took it", path)
			}
			if !strings.Contains(err.Error(), says) || (path != "" && !strings.Contains(err.Error(), path)) {
				t.Errorf("error %q\nwant it to name %s and say %q", err, path, says)
			}
			check()
		})
	}
	// 107 bytes is the longest path that fits.
	fits := long[:107]
	ln, err := Listen(fits)
	if err != nil {
		t.Fatalf("a path of 107 bytes: %v", err)
	}
	ln.Close()
}

// stillAccepts checks that ln still takes connections at path.
func stillAccepts(t *testing.T, ln net.Listener, path string) {
	t.Helper()
	accepted := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Close()
		}
		accepted <- err
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("the first listener's socket is gone: %v", err)
	}
	c.Close()
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
}

// server is Serve of a backend on a Listen socket, for a test; stop ends
// it and returns Serve's error.
type server struct {
	path string
	stop func() error
}

func startServer(t *testing.T, path string, b Backend) *server {
	t.Helper()
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, NewHandler(b, nil), nil) }()
	var err2 error
	stopped := false
	s := &server{path: path, stop: func() error {
		if !stopped {
			stopped = true
			cancel()
			err2 = <-done
		}
		return err2
	}}
	t.Cleanup(func() { s.stop() })
	return s
}

// named is a backend whose status names it, to tell two servers apart.
func named(name string) *fakeBackend {
	return &fakeBackend{fn: func(context.Context, string, any) (any, error) {
		return &Status{ConfigError: name}, nil
	}}
}

func whoAnswers(t *testing.T, path string) string {
	t.Helper()
	s, err := NewClient(path).Status()
	if err != nil {
		t.Fatal(err)
	}
	return s.ConfigError
}

// TestSecondDaemonRefused: a second daemon on the path of a running one
// is refused and the first one keeps serving, its socket in place.
func TestSecondDaemonRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api.sock")
	a := startServer(t, path, named("a"))
	ino := inode(t, path)
	if _, err := Listen(path); err == nil || !strings.Contains(err.Error(), "serves "+path) {
		t.Fatalf("second Listen: %v", err)
	}
	if inode(t, path) != ino {
		t.Fatal("the first daemon's socket was replaced")
	}
	if who := whoAnswers(t, path); who != "a" {
		t.Fatalf("%q answers", who)
	}
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a stopped daemon left its socket: %v", err)
	}
}

// TestStopUnlinksOnlyOwnSocket: when the first daemon's socket was
// removed and a second daemon serves the path, the first one stopping
// leaves the second one's socket alone.
func TestStopUnlinksOnlyOwnSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api.sock")
	a := startServer(t, path, named("a"))
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	b := startServer(t, path, named("b"))
	ino := inode(t, path)
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); err != nil || inode(t, path) != ino {
		t.Fatalf("the second daemon's socket was unlinked or replaced: %v", err)
	}
	if who := whoAnswers(t, path); who != "b" {
		t.Fatalf("%q answers", who)
	}
	if err := b.stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the second daemon left its socket: %v", err)
	}
}

// TestListenersRace: daemons started at once on one path: exactly one
// serves it, and each other is refused.
func TestListenersRace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api.sock")
	staleSocket(t, path)
	const n = 8
	type result struct {
		ln  net.Listener
		err error
	}
	results := make(chan result, n)
	start := make(chan struct{})
	for range n {
		go func() {
			<-start
			ln, err := Listen(path)
			results <- result{ln, err}
		}()
	}
	close(start)
	var won []net.Listener
	for range n {
		r := <-results
		if r.err == nil {
			won = append(won, r.ln)
		} else if !strings.Contains(r.err.Error(), "serves "+path) {
			t.Errorf("refused with %v", r.err)
		}
	}
	if len(won) != 1 {
		t.Fatalf("%d listeners took %s", len(won), path)
	}
	stillAccepts(t, won[0], path)
	won[0].Close()
}

// TestServeStopsInFlight: when its context ends, Serve cancels the
// requests in flight, each still gets its answer (503, the daemon
// stopping), and no backend call runs after Serve returns.
func TestServeStopsInFlight(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api.sock")
	entered := make(chan struct{})
	returned := make(chan struct{})
	b := &fakeBackend{fn: func(ctx context.Context, op string, _ any) (any, error) {
		close(entered)
		<-ctx.Done()
		defer close(returned)
		return nil, fmt.Errorf("cni add: move eth1 into the pod: %w", ctx.Err())
	}}
	s := startServer(t, path, b)
	got := make(chan error, 1)
	go func() {
		_, err := NewClient(path).CNIAdd(CNIAddRequest{ContainerID: "c", IfName: "i"})
		got <- err
	}()
	<-entered
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-returned:
	default:
		t.Fatal("Serve returned while the backend call ran")
	}
	err := <-got
	var se *StatusError
	if !errors.As(err, &se) || se.StatusCode != 503 || !errors.Is(err, ErrUnavailable) ||
		err.Error() != "the xdpq daemon is stopping: cni add: move eth1 into the pod: context canceled" {
		t.Fatalf("in-flight request: %v", err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket left: %v", err)
	}
}

// TestServeReadHeaderTimeout: a client that connects and never finishes
// its request is disconnected (takes readHeaderTimeout, 5 s).
func TestServeReadHeaderTimeout(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "api.sock")
	startServer(t, path, named("a"))
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /v1/status HTTP/1.1\r\nHost: x\r\n"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c.SetReadDeadline(start.Add(readHeaderTimeout + 10*time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("the server kept the connection open: %v (read %q)", err, b)
	}
	if took := time.Since(start); took < readHeaderTimeout-time.Second {
		t.Fatalf("closed after %v: %q", took, b)
	}
}

// TestServeListenerFails: Serve on a listener that fails returns the
// error at once.
func TestServeListenerFails(t *testing.T) {
	ln, err := Listen(filepath.Join(t.TempDir(), "api.sock"))
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	if err := Serve(context.Background(), ln, NewHandler(named("a"), nil), nil); err == nil || !strings.Contains(err.Error(), "serve the local api on") {
		t.Fatalf("Serve: %v", err)
	}
}
