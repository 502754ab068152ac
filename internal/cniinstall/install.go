// Package cniinstall puts xdpq's CNI plugin into a node's CNI bin
// directory and takes it away again: what the chart's init container and
// its sidecar run (cmd/xdpq-install-cni), in an image that has no shell
// and no cp.
//
// A container runtime may start the plugin at any instant, and an older
// copy may be running when a new one is installed: the file at the
// plugin's name is only ever replaced whole (a new file renamed over it),
// never truncated or written in place.
package cniinstall

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/xdpq/xdpq/internal/atomicfile"
	"github.com/xdpq/xdpq/internal/dsowner"
)

// Install copies the executable src into dir as name: the new content is
// written to a temporary file in dir, synced, made mode 0755 and renamed
// over dir/name, and dir is synced. A runtime starting dir/name at any
// instant runs the old plugin or the new one, and a running old one is
// left alone (its file is replaced, never written: no ETXTBSY). When
// dir/name already holds src's content with mode 0755 nothing is written
// and changed is false. Temporary files an interrupted Install left are
// removed.
func Install(src, dir, name string) (changed bool, err error) {
	if err := checkName(name); err != nil {
		return false, err
	}
	if err := checkDir(dir); err != nil {
		return false, err
	}
	dst := filepath.Join(dir, name)
	removeTemps(dir, name)
	in, err := os.Open(src)
	if err != nil {
		return false, fmt.Errorf("install CNI plugin: %w", err)
	}
	defer func() { _ = in.Close() }() // read-only
	if st, err := in.Stat(); err != nil {
		return false, fmt.Errorf("install CNI plugin: %w", err)
	} else if !st.Mode().IsRegular() {
		return false, fmt.Errorf("install CNI plugin: %s is not a regular file", src)
	}
	if same, err := sameContent(in, dst); err != nil {
		return false, fmt.Errorf("install CNI plugin: %w", err)
	} else if same {
		return false, nil
	}
	if _, err := in.Seek(0, io.SeekStart); err != nil {
		return false, fmt.Errorf("install CNI plugin: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return false, fmt.Errorf("install CNI plugin into %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			// err is the one to tell; a temporary file left is harmless,
			// and the next Install's removeTemps removes it.
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err = io.Copy(tmp, in); err != nil {
		return false, fmt.Errorf("install CNI plugin into %s: %w", dir, err)
	}
	// CreateTemp made it 0600; the runtime runs the plugin as root, and
	// 0755 is what every plugin in a CNI bin directory has.
	if err = tmp.Chmod(0o755); err != nil {
		return false, fmt.Errorf("install CNI plugin into %s: %w", dir, err)
	}
	if err = tmp.Sync(); err != nil {
		return false, fmt.Errorf("install CNI plugin into %s: sync: %w", dir, err)
	}
	if err = tmp.Close(); err != nil {
		return false, fmt.Errorf("install CNI plugin into %s: %w", dir, err)
	}
	if err = os.Rename(tmp.Name(), dst); err != nil {
		return false, fmt.Errorf("install CNI plugin into %s: %w", dir, err)
	}
	if err = atomicfile.SyncDir(dir); err != nil {
		return true, fmt.Errorf("install CNI plugin: %w", err)
	}
	return true, nil
}

// Remove removes dir/name and the temporary files an interrupted Install
// left, and syncs dir. A plugin already gone is no error; a missing dir
// is (the host's directory is not mounted where it was said to be).
func Remove(dir, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := checkDir(dir); err != nil {
		return err
	}
	removeTemps(dir, name)
	if err := atomicfile.Remove(filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("remove CNI plugin: %w", err)
	}
	return nil
}

// checkName refuses a name that is not a plain file name: CNI runtimes
// find a plugin by its type as a file name in their bin directories.
func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') || strings.HasPrefix(name, ".") {
		return fmt.Errorf("CNI plugin name %q: want a file name (the type of the network configurations), not starting with '.'", name)
	}
	return nil
}

// checkDir says clearly what is wrong with a target directory that is
// not one: the usual cause is the host path not being mounted there.
func checkDir(dir string) error {
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("CNI bin directory %s does not exist: mount the host's CNI bin directory there", dir)
	case err != nil:
		return fmt.Errorf("CNI bin directory: %w", err)
	case !st.IsDir():
		return fmt.Errorf("CNI bin directory %s is not a directory", dir)
	}
	return nil
}

// sameContent reports whether the file dst exists, has mode 0755 and
// holds what in holds from its start.
func sameContent(in *os.File, dst string) (bool, error) {
	cur, err := os.Open(dst)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer func() { _ = cur.Close() }() // read-only
	st, err := cur.Stat()
	if err != nil {
		return false, err
	}
	ist, err := in.Stat()
	if err != nil {
		return false, err
	}
	if !st.Mode().IsRegular() || st.Mode().Perm() != 0o755 || st.Size() != ist.Size() {
		return false, nil
	}
	if _, err := in.Seek(0, io.SeekStart); err != nil {
		return false, err
	}
	a, b := make([]byte, 1<<16), make([]byte, 1<<16)
	for {
		n, errA := io.ReadFull(in, a)
		m, errB := io.ReadFull(cur, b[:n])
		if m != n || !bytes.Equal(a[:n], b[:m]) {
			return false, nil
		}
		if errA == io.EOF || errA == io.ErrUnexpectedEOF {
			return true, nil
		}
		if errA != nil {
			return false, errA
		}
		if errB != nil {
			return false, errB
		}
	}
}

// removeTemps removes what an Install killed between its CreateTemp and
// its Rename left in dir. Errors are ignored: a file left is harmless
// (no runtime runs a plugin named ".xdpq.tmp-...").
func removeTemps(dir, name string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "."+name+".tmp-") && atomicfile.IsTemp(e.Name()) {
			_ = os.Remove(filepath.Join(dir, e.Name())) // see above: harmless if left
		}
	}
}

// RemoveOnUninstall follows the DaemonSet o names until ctx is done (the
// container's SIGTERM), then removes dir/name if the DaemonSet went (see
// dsowner.Owner.Uninstalling). final bounds the last question to the API
// server, if one is needed.
func RemoveOnUninstall(ctx context.Context, o *dsowner.Owner, final time.Duration, dir, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := checkDir(dir); err != nil {
		return err
	}
	uninstalling, why := o.Follow(ctx, final)
	if !uninstalling {
		o.Log.Info("keeping the CNI plugin", "plugin", dir+"/"+name, "reason", why)
		return nil
	}
	if err := Remove(dir, name); err != nil {
		return err
	}
	o.Log.Info("removed the CNI plugin", "plugin", dir+"/"+name, "reason", why)
	return nil
}
