package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// lockName is the file in the state directory that one daemon holds
// locked while it runs.
const lockName = "daemon.lock"

// lockStateDir makes this daemon the only one on dir: a second one would
// manage the same netdevs, pins and allocations behind the first one's
// back. The lock is the kernel's (flock), so it goes with the process,
// however it ends; the file says the holder's pid for the error.
func lockStateDir(dir string) (release func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	path := filepath.Join(dir, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state directory lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b := make([]byte, 32)
		n, _ := f.ReadAt(b, 0) // the holder's pid, if it wrote one: only for the message
		_ = f.Close()          // not locked by us: nothing to release
		if errors.Is(err, unix.EWOULDBLOCK) {
			holder := "another process"
			if pid, perr := strconv.Atoi(string(bytes.TrimSpace(b[:n]))); perr == nil {
				holder = fmt.Sprintf("pid %d", pid)
			}
			return nil, fmt.Errorf("another xdpq daemon (%s) runs on the state directory %s: stop it first, or give this one another --state-dir", holder, dir)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	// The pid is for a second daemon's message only: the lock is the
	// flock, whatever the file says.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() { _ = f.Close() }, nil // closing releases the flock; the process's end would too
}

// lockPinDir makes this daemon the only one on the pin directory, where
// the netdevs' XSKMAPs and flow maps are pinned: a second daemon with
// state of its own but the same pins would adopt the first's programs
// and strip its live pods' flows. (The netdevs themselves are locked by
// the node agent, whatever the directories: agent.ErrNetdevHeld.)
func lockPinDir(dir string) (release func(), err error) {
	return lockDir(dir, "pin directory", "the netdevs' programs and flows", "--pin-dir")
}

// lockAllocDir makes this daemon the only one on the allocation
// directory: a second daemon with state of its own would take the
// first's allocations' sockets there for stale and remove them.
func lockAllocDir(dir string) (release func(), err error) {
	return lockDir(dir, "allocation directory", "the pods' sockets", "--alloc-dir")
}

// lockDir takes an exclusive flock of the directory dir itself: bpffs
// holds no regular file, and flock works on any file system's directory.
// The holder is found in /proc/locks for the error, which says what the
// directory holds and which flag gives this daemon another.
func lockDir(dir, what, holds, flag string) (release func(), err error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%s lock: %w", what, err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		defer func() { _ = unix.Close(fd) }() // not locked by us
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("another xdpq daemon (%s) manages the %s %s, and with it %s: "+
				"stop it first, or give this one another %s", lockHolder(fd), what, dir, holds, flag)
		}
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return func() { _ = unix.Close(fd) }, nil // closing releases the flock; the process's end would too
}

// lockHolder says which process holds the flock of the file fd is open
// on, by its pid and command line, from /proc/locks ("another process"
// when it cannot tell).
func lockHolder(fd int) string {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return "another process"
	}
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		return "another process"
	}
	// "1: FLOCK  ADVISORY  WRITE 4242 00:1f:12345 0 EOF": the device's
	// major and minor in hex, the inode in decimal.
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	for line := range bytes.Lines(b) {
		f := bytes.Fields(line)
		if len(f) < 6 || string(f[1]) != "FLOCK" || string(f[5]) != want {
			continue
		}
		pid, err := strconv.Atoi(string(f[4]))
		if err != nil {
			continue
		}
		holder := fmt.Sprintf("pid %d", pid)
		if cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && len(cmd) > 0 {
			holder += ": " + string(bytes.TrimSpace(bytes.ReplaceAll(cmd, []byte{0}, []byte{' '})))
		}
		return holder
	}
	return "another process"
}
