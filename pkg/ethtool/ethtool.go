package ethtool

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// ErrNotSupported is returned when the driver does not implement a
// command (EOPNOTSUPP): no ntuple filters, no RSS contexts, fixed channels.
var ErrNotSupported = errors.New("not supported by the driver")

// ethtool commands (linux/ethtool.h).
const (
	cmdGRXRINGS     = 0x2d
	cmdGRXCLSRLCNT  = 0x2e
	cmdGRXCLSRULE   = 0x2f
	cmdGRXCLSRLALL  = 0x30
	cmdSRXCLSRLDEL  = 0x31
	cmdSRXCLSRLINS  = 0x32
	cmdGRXFHINDIR   = 0x38
	cmdSRXFHINDIR   = 0x39
	cmdGCHANNELS    = 0x3c
	cmdSCHANNELS    = 0x3d
	cmdGRSSH        = 0x46
	cmdSRSSH        = 0x47
	rxClsLocSpecial = 0x80000000 // data of GRXCLSRLCNT: the driver picks locations
)

// Handle sends ethtool commands to netdevs of one network namespace.
type Handle struct {
	fd int
}

// Open returns a Handle for the network namespace at path ("" for the
// caller's).
func Open(path string) (*Handle, error) {
	var fd int
	open := func(ns.NetNS) (err error) {
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		return err
	}
	var err error
	if path == "" {
		err = open(nil)
	} else {
		err = ns.WithNetNSPath(path, open)
	}
	if err != nil {
		return nil, fmt.Errorf("open ethtool socket: %w", err)
	}
	return &Handle{fd: fd}, nil
}

// Close closes the handle's socket.
func (h *Handle) Close() error { return unix.Close(h.fd) }

type ifreq struct {
	name [unix.IFNAMSIZ]byte
	data uintptr
	_    [16]byte // the rest of the ifreq union
}

// do sends the command at data, a struct that starts with its u32 cmd.
func (h *Handle) do(ifname string, data unsafe.Pointer, what string) error {
	var ifr ifreq
	if len(ifname) >= unix.IFNAMSIZ || ifname == "" {
		return fmt.Errorf("ethtool %s: bad interface name %q", what, ifname)
	}
	copy(ifr.name[:], ifname)
	ifr.data = uintptr(data)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(h.fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	switch errno {
	case 0:
		return nil
	case unix.EOPNOTSUPP:
		return fmt.Errorf("ethtool %s on %s: %w", what, ifname, ErrNotSupported)
	}
	return fmt.Errorf("ethtool %s on %s: %w", what, ifname, errno)
}

// Channels are a netdev's queue counts (struct ethtool_channels).
type Channels struct {
	MaxRX, MaxTX, MaxOther, MaxCombined uint32
	RX, TX, Other, Combined             uint32
}

// Channels reads the channel counts.
func (h *Handle) Channels(ifname string) (Channels, error) {
	var c struct {
		cmd uint32
		Channels
	}
	c.cmd = cmdGCHANNELS
	err := h.do(ifname, unsafe.Pointer(&c), "get channels")
	return c.Channels, err
}

// SetChannels sets the channel counts (RX, TX, Other, Combined of c).
func (h *Handle) SetChannels(ifname string, c Channels) error {
	v := struct {
		cmd uint32
		Channels
	}{cmdSCHANNELS, c}
	return h.do(ifname, unsafe.Pointer(&v), "set channels")
}

// RXRings returns the number of rx rings the classifier can steer to.
func (h *Handle) RXRings(ifname string) (uint32, error) {
	n := rxnfc{cmd: cmdGRXRINGS}
	err := h.do(ifname, unsafe.Pointer(&n), "get rx rings")
	return uint32(n.data), err
}

// Indirection returns the RSS indirection table: entry i is the queue that
// hash bucket i goes to.
func (h *Handle) Indirection(ifname string) ([]uint32, error) {
	hdr := struct{ cmd, size uint32 }{cmdGRXFHINDIR, 0}
	if err := h.do(ifname, unsafe.Pointer(&hdr), "get rss indirection size"); err != nil {
		return nil, err
	}
	buf := make([]uint32, 2+hdr.size)
	buf[0], buf[1] = cmdGRXFHINDIR, hdr.size
	if err := h.do(ifname, unsafe.Pointer(&buf[0]), "get rss indirection"); err != nil {
		return nil, err
	}
	return buf[2:], nil
}

// SetIndirection sets the RSS indirection table; its length must be the
// driver's table size. An empty table restores the driver's default.
func (h *Handle) SetIndirection(ifname string, table []uint32) error {
	buf := make([]uint32, 2+len(table))
	buf[0], buf[1] = cmdSRXFHINDIR, uint32(len(table))
	copy(buf[2:], table)
	return h.do(ifname, unsafe.Pointer(&buf[0]), "set rss indirection")
}
