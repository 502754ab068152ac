package daemon

import (
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// moveLink moves the link named from in src into dst, renamed to and with
// the alias and MTU (if not zero) given, and sets it up there. It goes
// through a temporary name so that a namesake in dst cannot stop it.
func moveLink(src, dst netns.NsHandle, from, to, alias string, mtu int) (netlink.Link, error) {
	hs, err := netlink.NewHandleAt(src)
	if err != nil {
		return nil, err
	}
	defer hs.Close()
	hd, err := netlink.NewHandleAt(dst)
	if err != nil {
		return nil, err
	}
	defer hd.Close()
	l, err := hs.LinkByName(from)
	if err != nil {
		return nil, fmt.Errorf("netdev %s: %w", from, err)
	}
	tmp := fmt.Sprintf("xdpq%d", l.Attrs().Index)
	if err := hs.LinkSetDown(l); err != nil {
		return nil, fmt.Errorf("set %s down: %w", from, err)
	}
	if err := hs.LinkSetName(l, tmp); err != nil {
		return nil, fmt.Errorf("rename %s: %w", from, err)
	}
	if err := hs.LinkSetNsFd(l, int(dst)); err != nil {
		hs.LinkSetName(l, from)
		return nil, fmt.Errorf("move %s: %w", from, err)
	}
	back := func(err error) (netlink.Link, error) {
		if l, e := hd.LinkByName(tmp); e == nil {
			hd.LinkSetNsFd(l, int(src))
			if l, e := hs.LinkByName(tmp); e == nil {
				hs.LinkSetName(l, from)
			}
		}
		return nil, err
	}
	if l, err = hd.LinkByName(tmp); err != nil {
		return back(fmt.Errorf("find %s after the move: %w", from, err))
	}
	if err := hd.LinkSetName(l, to); err != nil {
		return back(fmt.Errorf("rename %s to %s: %w", from, to, err))
	}
	if err := hd.LinkSetAlias(l, alias); err != nil {
		return back(fmt.Errorf("alias of %s: %w", to, err))
	}
	if mtu != 0 && mtu != l.Attrs().MTU {
		if err := hd.LinkSetMTU(l, mtu); err != nil {
			return back(fmt.Errorf("mtu %d on %s: %w", mtu, to, err))
		}
	}
	if err := hd.LinkSetUp(l); err != nil {
		return back(fmt.Errorf("set %s up: %w", to, err))
	}
	return hd.LinkByName(to)
}

// renameReturned finds a netdev the kernel gave back to the node (its
// alias is its node name) and renames it.
func renameReturned(host netns.NsHandle, name string, mtu int) error {
	h, err := netlink.NewHandleAt(host)
	if err != nil {
		return err
	}
	defer h.Close()
	if _, err := h.LinkByName(name); err == nil {
		return nil
	}
	links, err := h.LinkList()
	if err != nil {
		return err
	}
	for _, l := range links {
		if l.Attrs().Alias != name {
			continue
		}
		h.LinkSetDown(l)
		if err := h.LinkSetName(l, name); err != nil {
			return err
		}
		if mtu != 0 {
			h.LinkSetMTU(l, mtu)
		}
		return h.LinkSetUp(l)
	}
	return fmt.Errorf("no netdev %s (or aliased %s) on the node", name, name)
}

func clearAlias(host netns.NsHandle, name string) error {
	h, err := netlink.NewHandleAt(host)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		return nil // gone: nothing to clear
	}
	if l.Attrs().Alias != "" {
		return h.LinkSetAlias(l, "")
	}
	return nil
}
