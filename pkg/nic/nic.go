package nic

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Netdev is what discovery reports of one network device.
type Netdev struct {
	Name     string
	Ifindex  int
	Driver   string // "" for a virtual device without a bus driver
	Virtual  bool   // no device behind it (veth, bridge, ...)
	PCI      string // PCI address, e.g. 0000:3b:00.0; "" if not PCI
	Vendor   string // PCI vendor id, e.g. 8086
	Device   string // PCI device id, e.g. 1592
	NUMANode int    // -1 when unknown
	RXQueues int    // rx queues the netdev has now
	TXQueues int
	MAC      string
	OperUp   bool
	XDP      Features // zero when the kernel does not report them
}

// Discoverer reads netdevs from a sysfs tree.
type Discoverer struct {
	// SysRoot is where sysfs is mounted; "" means /sys. A sysfs mounted by
	// a thread inside a network namespace shows that namespace's netdevs.
	SysRoot string
	// NetNS is the network namespace for the XDP feature query ("" for
	// the caller's); it must be the one SysRoot shows.
	NetNS string
}

func (d Discoverer) root() string {
	if d.SysRoot == "" {
		return "/sys"
	}
	return d.SysRoot
}

// List returns every netdev, sorted by name.
func (d Discoverer) List() ([]Netdev, error) {
	ents, err := os.ReadDir(filepath.Join(d.root(), "class/net"))
	if err != nil {
		return nil, fmt.Errorf("list netdevs: %w", err)
	}
	var out []Netdev
	for _, e := range ents {
		n, err := d.Get(e.Name())
		if errors.Is(err, os.ErrNotExist) {
			continue // gone since the listing
		}
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b Netdev) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Get returns one netdev.
func (d Discoverer) Get(name string) (Netdev, error) {
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return Netdev{}, fmt.Errorf("netdev name %q is not valid", name)
	}
	dir := filepath.Join(d.root(), "class/net", name)
	n := Netdev{Name: name, NUMANode: -1}
	idx, err := readString(filepath.Join(dir, "ifindex"))
	if err != nil {
		return n, fmt.Errorf("netdev %s: %w", name, err)
	}
	if n.Ifindex, err = strconv.Atoi(idx); err != nil {
		return n, fmt.Errorf("netdev %s: ifindex %q: %w", name, idx, err)
	}
	n.MAC, _ = readString(filepath.Join(dir, "address"))
	state, _ := readString(filepath.Join(dir, "operstate"))
	n.OperUp = state == "up"
	n.RXQueues, n.TXQueues = countQueues(filepath.Join(dir, "queues"))

	dev := filepath.Join(dir, "device")
	target, err := os.Readlink(dev)
	if errors.Is(err, os.ErrNotExist) {
		n.Virtual = true
	} else if err != nil {
		return n, fmt.Errorf("netdev %s: %w", name, err)
	} else {
		if drv, err := os.Readlink(filepath.Join(dev, "driver")); err == nil {
			n.Driver = filepath.Base(drv)
		}
		if sub, err := os.Readlink(filepath.Join(dev, "subsystem")); err == nil && filepath.Base(sub) == "pci" {
			n.PCI = filepath.Base(target)
			n.Vendor, _ = readHexID(filepath.Join(dev, "vendor"))
			n.Device, _ = readHexID(filepath.Join(dev, "device"))
		}
		if s, err := readString(filepath.Join(dev, "numa_node")); err == nil {
			if v, err := strconv.Atoi(s); err == nil && v >= 0 {
				n.NUMANode = v
			}
		}
	}
	if f, err := XDPFeatures(d.NetNS, n.Ifindex); err == nil {
		n.XDP = f
	}
	return n, nil
}

func readString(path string) (string, error) {
	b, err := os.ReadFile(path)
	return strings.TrimSpace(string(b)), err
}

func readHexID(path string) (string, error) {
	s, err := readString(path)
	return strings.TrimPrefix(s, "0x"), err
}

func countQueues(dir string) (rx, tx int) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		switch {
		case strings.HasPrefix(e.Name(), "rx-"):
			rx++
		case strings.HasPrefix(e.Name(), "tx-"):
			tx++
		}
	}
	return rx, tx
}
