package api

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// maxSocketPath is the longest path a Unix socket can have: sun_path is
// 108 bytes with its terminating NUL (Linux would take 108 without it,
// but C clients copying the path into sun_path would cut it).
const maxSocketPath = 107

// The server's timeouts. A request's headers and body (at most 1 MiB, on
// a local socket) arrive in well under readTimeout; writeTimeout, counted
// from the end of the headers, covers the body, the Backend call and the
// answer; the client waits clientTimeout, longer, so that it gets the
// daemon's answer rather than its own timeout.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	writeTimeout      = readTimeout + RequestTimeout + 5*time.Second
	idleTimeout       = 60 * time.Second
	clientTimeout     = writeTimeout + 5*time.Second
)

// Listen makes the API's Unix socket at path, mode 0600, creating its
// directory (0755) if missing. It refuses whatever is at path that is not
// a socket (a file, a directory, empty or not, a symbolic link), naming
// it, and removes nothing of it. A socket at path is someone's: if a
// process answers on it, Listen refuses; if a connection is refused, the
// socket is stale (its daemon died) and Listen replaces it.
//
// Closing the listener unlinks the socket only if path is still the one
// Listen made: a second daemon that bound path after this one's socket
// was removed keeps its socket. Listen and Close serialize on a lock of
// the directory, so two daemons starting at once cannot both take path.
func Listen(path string) (net.Listener, error) {
	if path == "" {
		return nil, errors.New("api socket: no path")
	}
	if len(path) > maxSocketPath {
		return nil, fmt.Errorf("api socket %s: the path is %d bytes, longer than the %d a Unix socket can have; choose a shorter one",
			path, len(path), maxSocketPath)
	}
	dir := filepath.Dir(path)
	if err := mkdirAll(dir); err != nil {
		return nil, fmt.Errorf("api socket %s: %w", path, err)
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return nil, fmt.Errorf("api socket %s: %w", path, err)
	}
	defer unlock()
	if err := removeStale(path); err != nil {
		return nil, err
	}
	return bind(path)
}

// mkdirAll creates dir as MkdirAll does, with a clear error where a part
// of it is not a directory.
func mkdirAll(dir string) error {
	err := os.MkdirAll(dir, 0o755)
	if err == nil {
		return nil
	}
	if errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.EEXIST) {
		for d := dir; ; d = filepath.Dir(d) {
			if fi, serr := os.Stat(d); serr == nil {
				switch {
				case fi.IsDir():
				case d == dir:
					return fmt.Errorf("its directory %s is %s", dir, describe(d, fi))
				default:
					return fmt.Errorf("its directory %s cannot be made: %s is %s", dir, d, describe(d, fi))
				}
				break
			}
			if d == filepath.Dir(d) {
				break
			}
		}
	}
	return fmt.Errorf("create its directory: %w", err)
}

// lockDir takes an exclusive flock of dir, which Listen and the
// listener's Close hold while they look at the socket and act on it.
func lockDir(dir string) (unlock func(), err error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s to lock it: %w", dir, err)
	}
	for {
		err = unix.Flock(fd, unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		_ = unix.Close(fd) // a read-only directory, not locked
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	// Closing the last descriptor releases the lock; Linux frees the
	// descriptor even when close reports an error, so there is nothing to
	// retry.
	return func() { _ = unix.Close(fd) }, nil
}

// removeStale removes a stale socket at path and refuses anything else
// there. The caller holds the directory's lock.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("api socket %s: %w", path, err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("api socket %s: %s is there; xdpq removes only a stale socket: move it away, or choose another --api-socket",
			path, describe(path, fi))
	}
	d := net.Dialer{Timeout: time.Second}
	conn, err := d.Dial("unix", path)
	switch {
	case err == nil:
		_ = conn.Close() // a probe that sent nothing
		return fmt.Errorf("api socket %s: another xdpq daemon (or another process) serves %s: stop it first, or give this daemon another --api-socket", path, path)
	case errors.Is(err, syscall.ECONNREFUSED):
		// Nobody listens: the socket of a daemon that died.
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("api socket %s: remove the stale socket: %w", path, err)
		}
		return nil
	}
	var ue *net.OpError
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return fmt.Errorf("api socket %s: a socket is there and probing it failed (%w), so something may use it: remove it if nothing does, or choose another --api-socket", path, err)
}

// describe names what fi, at path, is.
func describe(path string, fi fs.FileInfo) string {
	switch t := fi.Mode().Type(); {
	case t == 0:
		return fmt.Sprintf("a regular file (%d bytes)", fi.Size())
	case t == fs.ModeDir:
		ents, err := os.ReadDir(path)
		switch {
		case err != nil:
			return "a directory"
		case len(ents) == 0:
			return "an empty directory"
		}
		return fmt.Sprintf("a directory of %d entries", len(ents))
	case t == fs.ModeSymlink:
		if to, err := os.Readlink(path); err == nil {
			return "a symbolic link to " + to
		}
		return "a symbolic link"
	case t == fs.ModeNamedPipe:
		return "a named pipe"
	case t&fs.ModeDevice != 0:
		return "a device node"
	}
	return "a file of mode " + fi.Mode().String()
}

// bind makes the listening socket at path. The mode of the socket's file
// is the socket's own mode less the umask, so setting the socket's mode
// before bind makes the file 0600 from its first instant: no process can
// connect in a window before a chmod.
func bind(path string) (net.Listener, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("api socket %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer func() { _ = f.Close() }() // the listener holds a duplicate; this one is only a handle
	if err := unix.Fchmod(fd, 0o600); err != nil {
		return nil, fmt.Errorf("api socket %s: chmod: %w", path, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		return nil, fmt.Errorf("api socket %s: bind: %w", path, err)
	}
	var st unix.Stat_t
	err = unix.Lstat(path, &st)
	if err == nil {
		err = os.Chmod(path, 0o600) // exactly 0600, whatever the umask took away
	}
	if err == nil {
		err = unix.Listen(fd, 1024)
	}
	var ln net.Listener
	if err == nil {
		ln, err = net.FileListener(f)
	}
	if err != nil {
		// Ours: bound under the directory's lock a moment ago. Left behind,
		// it is a stale socket that the next start removes; say so.
		if rerr := os.Remove(path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			err = errors.Join(err, rerr)
		}
		return nil, fmt.Errorf("api socket %s: %w", path, err)
	}
	return &listener{Listener: ln, path: path, dev: st.Dev, ino: st.Ino}, nil
}

// listener is the API's socket; its Close unlinks path only if path is
// still the socket it bound. Device and inode numbers tell: while the
// listener is open its socket holds its inode, so no other file can have
// that number, even after the socket was unlinked.
type listener struct {
	net.Listener
	path     string
	dev, ino uint64
	once     sync.Once
	err      error
}

// Close unlinks the socket if it is still the listener's, then closes it.
// It unlinks first, while the socket still accepts: a daemon starting now
// finds a live socket and refuses, rather than binding path in the moment
// before the unlink.
func (l *listener) Close() error {
	l.once.Do(func() {
		var rmErr error
		if unlock, err := lockDir(filepath.Dir(l.path)); err == nil {
			defer unlock()
		}
		var st unix.Stat_t
		if err := unix.Lstat(l.path, &st); err == nil && st.Dev == l.dev && st.Ino == l.ino {
			if err := os.Remove(l.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				rmErr = fmt.Errorf("api socket %s: %w", l.path, err)
			}
		}
		l.err = errors.Join(rmErr, l.Listener.Close())
	})
	return l.err
}

// Serve serves h on ln until ctx ends, with read, write and idle timeouts.
// When ctx ends it closes ln (a listener of [Listen] unlinks its socket
// if it is still its own), cancels the contexts of the requests in
// flight, waits until their handlers have answered, and returns nil: no
// handler runs after Serve returns. It returns an error if serving fails
// before. The server's own complaints (a handler that panicked past
// [NewHandler]'s recovery, an accept error) go to log at warning level.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// The requests' contexts end when Serve stops, not with ctx itself,
	// which a request context would also carry values of.
	reqCtx, cancelReqs := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelReqs()
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		BaseContext:       func(net.Listener) context.Context { return reqCtx },
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		cancelReqs()
		_ = srv.Close() // Serve has failed: its error, returned, is the one to tell
		return fmt.Errorf("serve the local api on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	// Requests in flight end (a Backend honouring its context returns at
	// once; the client gets a 503 saying the daemon is stopping), and
	// Shutdown closes the listener and waits until each has answered.
	cancelReqs()
	err := srv.Shutdown(context.Background())
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) { // what Serve returns after Shutdown
		err = errors.Join(err, serr)
	}
	if err != nil {
		return fmt.Errorf("stop the local api on %s: %w", ln.Addr(), err)
	}
	return nil
}
