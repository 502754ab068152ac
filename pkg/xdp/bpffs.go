package xdp

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// DefaultBPFFS is where bpffs is mounted on most systems.
const DefaultBPFFS = "/sys/fs/bpf"

// MountBPFFS mounts a bpffs at path unless one is there already.
func MountBPFFS(path string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := os.MkdirAll(path, 0o700); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w", path, err)
	}
	if err := unix.Mount("bpf", path, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w", path, err)
	}
	return nil
}
