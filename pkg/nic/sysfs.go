package nic

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// Sysfs is a sysfs tree held open, for the netdev settings only sysfs
// has. A sysfs shows the netdevs of the network namespace its mounter was
// in, whatever namespace reads it later.
type Sysfs struct {
	fd int // the tree's root directory
}

// OpenSysfs opens the sysfs mounted at root ("" for /sys).
func OpenSysfs(root string) (*Sysfs, error) {
	if root == "" {
		root = "/sys"
	}
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open sysfs at %s: %w", root, err)
	}
	return &Sysfs{fd: fd}, nil
}

// MountSysfs mounts a sysfs from inside the network namespace at netns
// ("" for the caller's) without attaching it to any directory (fsopen,
// fsmount): the mount lives only in the returned handle and goes when
// it is closed, so a crash leaves nothing in the mount table. It needs
// CAP_SYS_ADMIN over the namespace.
func MountSysfs(netns string) (*Sysfs, error) {
	mount := func() (int, error) {
		fs, err := unix.Fsopen("sysfs", unix.FSOPEN_CLOEXEC)
		if err != nil {
			return -1, fmt.Errorf("fsopen: %w", err)
		}
		defer func() { _ = unix.Close(fs) }() // the fs context; the mount holds what it made
		if err := unix.FsconfigCreate(fs); err != nil {
			return -1, fmt.Errorf("fsconfig: %w", err)
		}
		fd, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
		if err != nil {
			return -1, fmt.Errorf("fsmount: %w", err)
		}
		return fd, nil
	}
	var fd int
	var err error
	if netns == "" {
		fd, err = mount()
	} else {
		err = ns.WithNetNSPath(netns, func(ns.NetNS) error {
			fd, err = mount()
			return err
		})
	}
	if err != nil {
		return nil, fmt.Errorf("mount a sysfs of netns %q: %w", netns, err)
	}
	return &Sysfs{fd: fd}, nil
}

// Path is a path of the tree's root for as long as it is open, for code
// that takes a sysfs root by path (Discoverer.SysRoot): the magic link of
// its descriptor in /proc/self/fd, which reaches a mount that MountSysfs
// attached nowhere.
func (s *Sysfs) Path() string { return "/proc/self/fd/" + strconv.Itoa(s.fd) }

// Close releases the tree (and a mount MountSysfs made).
func (s *Sysfs) Close() error {
	if s.fd < 0 {
		return nil
	}
	err := unix.Close(s.fd)
	s.fd = -1
	return err
}

func (s *Sysfs) netdevFile(ifname, attr string, flags int) (*os.File, error) {
	if ifname == "" || strings.ContainsAny(ifname, "/\x00") || ifname == "." || ifname == ".." {
		return nil, fmt.Errorf("netdev name %q is not valid", ifname)
	}
	rel := filepath.Join("class/net", ifname, attr)
	fd, err := unix.Openat(s.fd, rel, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: rel, Err: err}
	}
	return os.NewFile(uintptr(fd), rel), nil
}

func (s *Sysfs) readUint(ifname, attr string) (uint64, error) {
	f, err := s.netdevFile(ifname, attr, unix.O_RDONLY)
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }() // read-only
	b := make([]byte, 64)
	n, err := f.Read(b)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", f.Name(), err)
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b[:n])), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", f.Name(), err)
	}
	return v, nil
}

func (s *Sysfs) writeUint(ifname, attr string, v uint64) error {
	f, err := s.netdevFile(ifname, attr, unix.O_WRONLY)
	if err != nil {
		return err
	}
	_, err = f.WriteString(strconv.FormatUint(v, 10))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %d to %s: %w", v, f.Name(), err)
	}
	return nil
}

// NAPIConfig is a netdev's software interrupt coalescing, which preferred
// busy polling (SO_PREFER_BUSY_POLL) relies on: see "Software IRQ
// coalescing" and "IRQ mitigation" in the kernel's
// Documentation/networking/napi.rst.
type NAPIConfig struct {
	// DeferHardIRQs is napi_defer_hard_irqs: how many empty polls NAPI
	// makes, on its timer, before it turns the device's interrupt back on.
	DeferHardIRQs uint32 `json:"napi_defer_hard_irqs"`
	// GROFlushTimeout is gro_flush_timeout in nanoseconds: the delay of
	// that timer; with busy polling preferred, how long an application
	// may go without polling before the kernel takes the queue back.
	GROFlushTimeout uint64 `json:"gro_flush_timeout"`
}

// NAPI reads the netdev's NAPI settings.
func (s *Sysfs) NAPI(ifname string) (NAPIConfig, error) {
	d, err := s.readUint(ifname, "napi_defer_hard_irqs")
	if err != nil {
		return NAPIConfig{}, fmt.Errorf("napi settings of %s: %w", ifname, err)
	}
	if d > 1<<32-1 {
		return NAPIConfig{}, fmt.Errorf("napi settings of %s: napi_defer_hard_irqs %d out of range", ifname, d)
	}
	g, err := s.readUint(ifname, "gro_flush_timeout")
	if err != nil {
		return NAPIConfig{}, fmt.Errorf("napi settings of %s: %w", ifname, err)
	}
	return NAPIConfig{DeferHardIRQs: uint32(d), GROFlushTimeout: g}, nil
}

// SetNAPI writes the netdev's NAPI settings. The sysfs value is the
// netdev's own: the kernel applies it to every NAPI instance the netdev
// has and gives it to those it creates later (a veth creates its NAPI
// instances when an XDP program is attached, a driver when its channels
// change). netdev-genl's napi-set reaches only instances that exist.
func (s *Sysfs) SetNAPI(ifname string, c NAPIConfig) error {
	err := errors.Join(s.writeUint(ifname, "gro_flush_timeout", c.GROFlushTimeout),
		s.writeUint(ifname, "napi_defer_hard_irqs", uint64(c.DeferHardIRQs)))
	if err != nil {
		return fmt.Errorf("napi settings of %s: %w", ifname, err)
	}
	return nil
}
