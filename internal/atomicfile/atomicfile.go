// Package atomicfile writes files so that a reader, or a process started
// after a crash at any instant, sees either the old content or the new,
// never a mix or a truncated file.
//
// It works on file descriptors, not os.File: the daemon writes a record
// twice for every CNI ADD and DEL, and an os.File costs a write three
// more system calls (fstat and two fcntl when it is opened, the poller's
// bookkeeping when it is closed) and a path lookup for each of the
// temporary file, the rename and the directory's sync; a write here takes
// half the time (BenchmarkWriteFile).
package atomicfile

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// WriteFile writes data to path atomically with the permission bits of
// perm (whatever the umask; setuid, setgid and sticky are not set): a
// temporary file in the same directory is written and synced, renamed
// over path, and the directory synced so that the rename survives a power
// loss. The directory must exist. No temporary file is left on an error;
// path is as it was unless the error is the directory's sync, after the
// rename.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	dfd, err := openDir(dir)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer closeDir(dfd)
	tmp, err := writeTemp(dfd, dir, base, data, perm)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := ignoringEINTR(func() error { return unix.Renameat(dfd, tmp, dfd, base) }); err != nil {
		err = removeTemp(dfd, dir, tmp, &os.LinkError{Op: "rename", Old: filepath.Join(dir, tmp), New: path, Err: err})
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := ignoringEINTR(func() error { return unix.Fsync(dfd) }); err != nil {
		return fmt.Errorf("write %s: written, but not its directory's sync: %w", path, &os.PathError{Op: "sync", Path: dir, Err: err})
	}
	return nil
}

// writeTemp writes data to a new temporary file for base in the directory
// dfd (dir) and syncs it; it returns the file's name in the directory.
func writeTemp(dfd int, dir, base string, data []byte, perm os.FileMode) (string, error) {
	var (
		tmp string
		fd  int
		err error
	)
	for range 100 {
		tmp = "." + base + ".tmp-" + strconv.FormatUint(rand.Uint64(), 36)
		fd, err = unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, uint32(perm.Perm()))
		if err != unix.EINTR && err != unix.EEXIST {
			break
		}
	}
	if err != nil {
		return "", &os.PathError{Op: "open", Path: filepath.Join(dir, tmp), Err: err}
	}
	fail := func(op string, err error) (string, error) {
		_ = unix.Close(fd) // the file is removed next; its data no longer matters
		return "", removeTemp(dfd, dir, tmp, &os.PathError{Op: op, Path: filepath.Join(dir, tmp), Err: err})
	}
	// Open's mode went through the umask.
	if err := ignoringEINTR(func() error { return unix.Fchmod(fd, uint32(perm.Perm())) }); err != nil {
		return fail("chmod", err)
	}
	for rest := data; len(rest) > 0; {
		n, err := unix.Write(fd, rest)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return fail("write", err)
		case n == 0:
			return fail("write", unix.EIO)
		}
		rest = rest[n:]
	}
	if err := ignoringEINTR(func() error { return unix.Fsync(fd) }); err != nil {
		return fail("sync", err)
	}
	if err := unix.Close(fd); err != nil {
		return "", removeTemp(dfd, dir, tmp, &os.PathError{Op: "close", Path: filepath.Join(dir, tmp), Err: err})
	}
	return tmp, nil
}

// Remove removes path (no error when it is gone) and syncs its directory,
// so that the removal survives a power loss.
func Remove(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir syncs a directory, making the entries created, renamed or
// removed in it durable.
func SyncDir(dir string) error {
	fd, err := openDir(dir)
	if err == nil {
		err = ignoringEINTR(func() error { return unix.Fsync(fd) })
		closeDir(fd)
	}
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// removeTemp removes the temporary file tmp after err; a failure to
// remove it is added to err, since it leaves the file behind.
func removeTemp(dfd int, dir, tmp string, err error) error {
	if rerr := unix.Unlinkat(dfd, tmp, 0); rerr != nil {
		return errors.Join(err, &os.PathError{Op: "remove", Path: filepath.Join(dir, tmp), Err: rerr})
	}
	return err
}

// closeDir closes a directory opened read-only by openDir: its sync, the
// one thing that matters, has been checked, and a failed close loses
// nothing.
func closeDir(fd int) {
	_ = unix.Close(fd)
}

func openDir(dir string) (int, error) {
	var fd int
	err := ignoringEINTR(func() (err error) {
		fd, err = unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	return fd, nil
}

// ignoringEINTR calls fn again while it is interrupted: Go's signal
// handlers restart system calls, but a FUSE or NFS directory may still
// answer EINTR.
func ignoringEINTR(fn func() error) error {
	for {
		if err := fn(); err != unix.EINTR {
			return err
		}
	}
}

// IsTemp reports whether name (a base name) is one of WriteFile's
// temporary files, which a crash may leave behind: readers skip them and
// may remove them.
func IsTemp(name string) bool {
	return strings.HasPrefix(name, ".") && strings.Contains(name, ".tmp-")
}
