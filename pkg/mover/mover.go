package mover

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

var (
	// ErrGone is a virtual netdev destroyed with the pod's network
	// namespace: it does not come back, and its Record can be dropped.
	ErrGone = errors.New("destroyed with the pod's network namespace (virtual netdevs do not return)")
	// ErrNotFound is a netdev in none of the pod's, the node's and the
	// initial namespaces: one with a driver of its own not back within
	// Config.ReturnWait, or one the pod deleted or stripped of its marks
	// (renamed and alias cleared). Keep the Record: it may show up later.
	ErrNotFound = errors.New("not found in the pod's, the node's or the initial network namespace")
	// ErrNameTaken is a name the netdev needs held by another link.
	ErrNameTaken = errors.New("name taken")
)

// DefaultReturnWait is how long MoveOut waits, by default, for a netdev
// the kernel is returning to the initial namespace.
const DefaultReturnWait = 5 * time.Second

// Config says where a Mover works.
type Config struct {
	// Node is the path of the node's network namespace, where netdevs live
	// when no pod has them. Empty: this process's.
	Node string
	// Init is the path of the namespace where the kernel returns a netdev
	// with a driver of its own when its namespace is destroyed: the
	// initial one. Empty: PID 1's, or the node's when PID 1's cannot be
	// opened (a sandbox that hides PID 1; InitErr says why). Tests point
	// it elsewhere.
	Init string
	// ReturnWait bounds how long MoveOut waits for such a netdev on its
	// way back. 0: DefaultReturnWait.
	ReturnWait time.Duration
}

// Mover moves netdevs between the node's network namespace and pods'. It
// holds no state of its own besides the namespaces it was given: every
// call works from a Record, and calls for different netdevs may run
// concurrently. Calls for the same netdev must not.
type Mover struct {
	node netns.NsHandle
	init netns.NsHandle // netns.None() when the node's namespace is the initial one
	// initErr is why PID 1's namespace could not be opened, if it could not.
	initErr error
	wait    time.Duration
	// waiting, if set, is called when MoveOut starts waiting for a netdev
	// on its way back (tests hand it back then).
	waiting func()
}

// New opens the namespaces of cfg. Close releases them.
func New(cfg Config) (*Mover, error) {
	if cfg.Node == "" {
		cfg.Node = "/proc/self/ns/net"
	}
	defaultInit := cfg.Init == ""
	if defaultInit {
		cfg.Init = "/proc/1/ns/net"
	}
	if cfg.ReturnWait == 0 {
		cfg.ReturnWait = DefaultReturnWait
	}
	node, err := netns.GetFromPath(cfg.Node)
	if err != nil {
		return nil, fmt.Errorf("node netns %s: %w", cfg.Node, err)
	}
	if defaultInit && isInitNetns(node) {
		// The node's namespace is the initial one (a DaemonSet with host
		// network): nothing to open in pid 1, which needs CAP_SYS_PTRACE.
		return &Mover{node: node, init: netns.None(), wait: cfg.ReturnWait}, nil
	}
	init, err := netns.GetFromPath(cfg.Init)
	var initErr error
	if err != nil && defaultInit {
		init, initErr = netns.None(), fmt.Errorf("initial netns %s: %w; netdevs returned there are not looked for", cfg.Init, err)
	} else if err != nil {
		_ = node.Close() // a namespace handle only read: closing it loses nothing
		return nil, fmt.Errorf("initial netns %s: %w", cfg.Init, err)
	}
	if init.IsOpen() && init.Equal(node) {
		_ = init.Close() // a duplicate handle on the node's namespace, only read
		init = netns.None()
	}
	return &Mover{node: node, init: init, initErr: initErr, wait: cfg.ReturnWait}, nil
}

// initNetnsInode is the inode of the initial network namespace: a fixed
// number (the kernel's PROC_NET_INIT_INO, NET_NS_INIT_INO in its uapi
// nsfs.h) on the kernels that give init_net one; others number it like
// any namespace, from 0xF0000000 up, so it never matches there.
const initNetnsInode = 0xEFFFFFF9

// isInitNetns says whether h is the initial network namespace, as far as
// its inode tells (false on a kernel that numbers it like any other).
func isInitNetns(h netns.NsHandle) bool {
	var st unix.Stat_t
	return unix.Fstat(int(h), &st) == nil && st.Ino == initNetnsInode
}

// InitErr says why the initial namespace could not be opened (New then
// takes the node's for it), nil when it could.
func (m *Mover) InitErr() error { return m.initErr }

// Close releases the namespaces New opened.
func (m *Mover) Close() error {
	err := m.node.Close()
	if m.init.IsOpen() {
		err = errors.Join(err, m.init.Close())
	}
	return err
}

// open makes the handles of one operation: the pod's (if pod is open and
// not the node's namespace), the node's, and the initial namespace's.
func (m *Mover) open(pod netns.NsHandle) (*handles, error) {
	hs := &handles{ns: [3]netns.NsHandle{netns.None(), m.node, m.init}}
	var err error
	if pod.IsOpen() && !pod.Equal(m.node) {
		hs.ns[spacePod] = pod
		if hs.h[spacePod], err = netlink.NewHandleAt(pod, unix.NETLINK_ROUTE); err != nil {
			return nil, fmt.Errorf("netlink in the pod's netns: %w", err)
		}
	}
	if hs.h[spaceNode], err = netlink.NewHandleAt(m.node, unix.NETLINK_ROUTE); err != nil {
		hs.close()
		return nil, fmt.Errorf("netlink in the node's netns: %w", err)
	}
	if m.init.IsOpen() {
		if hs.h[spaceInit], err = netlink.NewHandleAt(m.init, unix.NETLINK_ROUTE); err != nil {
			hs.close()
			return nil, fmt.Errorf("netlink in the initial netns: %w", err)
		}
	}
	return hs, nil
}

// Prepare reads the node-side state of netdev into a Record for moving it
// into a pod as ifname with mtu (0: the node's). It changes nothing: persist
// the Record, then call MoveIn.
func (m *Mover) Prepare(netdev, ifname string, mtu int) (Record, error) {
	if err := validName(ifname); err != nil {
		return Record{}, fmt.Errorf("prepare %s: pod %w", netdev, err)
	}
	if mtu < 0 {
		return Record{}, fmt.Errorf("prepare %s: mtu %d: negative", netdev, mtu)
	}
	h, err := netlink.NewHandleAt(m.node, unix.NETLINK_ROUTE)
	if err != nil {
		return Record{}, fmt.Errorf("prepare %s: netlink in the node's netns: %w", netdev, err)
	}
	defer h.Close()
	l, err := h.LinkByName(netdev)
	if err != nil {
		return Record{}, fmt.Errorf("prepare %s: %w", netdev, err)
	}
	a := l.Attrs()
	if a.MasterIndex != 0 {
		return Record{}, fmt.Errorf("prepare %s: it is a port of ifindex %d; take it out first", netdev, a.MasterIndex)
	}
	r := Record{
		Name: a.Name, Index: a.Index, Temp: tempName(a.Index), Kind: l.Type(),
		Parent: parentOf(a), Node: stateOf(a), IfName: ifname, MTU: mtu,
	}
	if len(a.PermHWAddr) > 0 {
		r.PermAddr = a.PermHWAddr.String()
	}
	if t, err := h.LinkByName(r.Temp); err == nil && t.Attrs().Index != a.Index {
		return Record{}, fmt.Errorf("prepare %s: its temporary name %s is held by ifindex %d: %w", netdev, r.Temp, t.Attrs().Index, ErrNameTaken)
	}
	if err := r.Validate(); err != nil {
		return Record{}, fmt.Errorf("prepare %s: %w", netdev, err)
	}
	return r, nil
}

// MoveIn moves the netdev of r into the pod's network namespace under
// r.IfName, with r.MTU, up, and returns it as it is there. The netdev must
// be on the node as Prepare found it. On failure it puts everything back
// (or says what it could not); a name the pod already has is ErrNameTaken,
// and changes nothing.
func (m *Mover) MoveIn(r Record, pod netns.NsHandle) (Link, error) {
	l, _, err := m.moveIn(r, pod, 0)
	return l, err
}

func (m *Mover) moveIn(r Record, pod netns.NsHandle, limit int) (Link, []string, error) {
	fail := func(err error) (Link, []string, error) {
		return Link{}, nil, fmt.Errorf("move %s into the pod as %s: %w", r.Name, r.IfName, err)
	}
	if err := r.Validate(); err != nil {
		return fail(err)
	}
	if !pod.IsOpen() {
		return fail(errors.New("no pod network namespace"))
	}
	if pod.Equal(m.node) {
		return fail(errors.New("the pod shares the node's network namespace (host network?): it cannot be given a netdev"))
	}
	hs, err := m.open(pod)
	if err != nil {
		return fail(err)
	}
	defer hs.close()
	f, err := hs.find(&r)
	switch {
	case err != nil:
		return fail(err)
	case f == nil:
		return fail(errors.New("not on the node"))
	case f.space != spaceNode || f.attrs().Name != r.Name:
		return fail(fmt.Errorf("not on the node as prepared but as %s in the %s namespace: bring it back with MoveOut first",
			f.attrs().Name, f.space))
	}
	if have := stateOf(f.attrs()); !have.equal(r.Node, true) {
		return fail(fmt.Errorf("changed since prepared (now %s; prepared %s): prepare again", have, r.Node))
	}
	other, err := hs.h[spacePod].LinkByName(r.IfName)
	if err == nil {
		return fail(fmt.Errorf("the pod has a %s already (ifindex %d, %s): %w", r.IfName, other.Attrs().Index, other.Type(), ErrNameTaken))
	}
	if !errors.As(err, new(netlink.LinkNotFoundError)) {
		return fail(fmt.Errorf("look for %s in the pod: %w", r.IfName, err))
	}
	f, did, err := hs.run(&r, inStep, limit)
	if err == nil {
		return linkOf(f.attrs()), did, nil
	}
	if errors.Is(err, errStopped) {
		return Link{}, did, err
	}
	if errors.Is(err, errMissing) {
		return fail(fmt.Errorf("vanished on its way (after: %s)", strings.Join(did, "; ")))
	}
	if _, _, back := hs.run(&r, outStep, 0); back != nil {
		err = fmt.Errorf("%w; and it is not back on the node: %w", err, m.missing(&r, hs, back))
	}
	return fail(err)
}

// MoveOut brings the netdev of r back to the node under its own name, with
// the node state r recorded, wherever it is: in the pod (pod may be
// netns.None() when the pod's namespace is gone), half moved by a process
// that died, or returned by the kernel to the initial namespace. A netdev
// with a driver of its own not found anywhere is waited for (the kernel
// may be returning it) until ctx is done or Config.ReturnWait has passed;
// then it is ErrNotFound. A virtual one not found when pod is
// netns.None() is ErrGone; in a pod that lives, ErrNotFound. A name the
// node has given another link in the meantime is ErrNameTaken: the netdev
// waits under its temporary name, restored and down, for a later MoveOut.
// MoveOut returns nil only when everything is back.
func (m *Mover) MoveOut(ctx context.Context, r Record, pod netns.NsHandle) error {
	_, err := m.moveOut(ctx, r, pod, 0)
	return err
}

func (m *Mover) moveOut(ctx context.Context, r Record, pod netns.NsHandle, limit int) ([]string, error) {
	fail := func(err error) ([]string, error) {
		return nil, fmt.Errorf("bring %s back to the node: %w", r.Name, err)
	}
	if err := r.Validate(); err != nil {
		return fail(err)
	}
	hs, err := m.open(pod)
	if err != nil {
		return fail(err)
	}
	defer hs.close()
	_, did, err := hs.run(&r, outStep, limit)
	if errors.Is(err, errMissing) && r.returns() {
		if err = m.awaitReturn(ctx, hs, &r); err == nil {
			var more []string
			_, more, err = hs.run(&r, outStep, limit)
			did = append(did, more...)
		}
	}
	switch {
	case err == nil:
		return did, nil
	case errors.Is(err, errStopped):
		return did, err
	}
	return fail(m.missing(&r, hs, err))
}

// missing turns errMissing into what it means for r: a virtual netdev
// not found when the pod's namespace is gone was destroyed with it; one
// not found in a pod's namespace that lives was deleted or disguised.
func (m *Mover) missing(r *Record, hs *handles, err error) error {
	if !errors.Is(err, errMissing) {
		return err
	}
	if r.returns() || hs.h[spacePod] != nil {
		return ErrNotFound
	}
	return fmt.Errorf("%s %w", r.Kind, ErrGone)
}

// awaitReturn waits for the record's netdev to appear in the node's or the
// initial namespace, where the kernel returns a netdev whose namespace is
// destroyed (asynchronously: cleanup_net runs in a workqueue).
func (m *Mover) awaitReturn(ctx context.Context, hs *handles, r *Record) error {
	ctx, cancel := context.WithTimeout(ctx, m.wait)
	defer cancel()
	// A subscription per namespace; each forwards the updates that carry
	// the netdev's marks, until its socket closes with done.
	updates := make(chan struct{}, 1)
	done := make(chan struct{})
	var wg sync.WaitGroup
	defer func() {
		close(done)
		wg.Wait()
	}()
	for _, s := range []space{spaceNode, spaceInit} {
		if hs.h[s] == nil {
			continue
		}
		h := m.node
		if s == spaceInit {
			h = m.init
		}
		ch := make(chan netlink.LinkUpdate, 64)
		if err := netlink.LinkSubscribeWithOptions(ch, done, netlink.LinkSubscribeOptions{Namespace: &h}); err != nil {
			return fmt.Errorf("watch links in the %s namespace: %w", s, err)
		}
		wg.Go(func() {
			for u := range ch {
				if r.ours(u.Attrs(), s) {
					select {
					case updates <- struct{}{}:
					default:
					}
				}
			}
		})
	}
	// Subscribed: look again, lest it came back in between.
	if f, err := hs.find(r); err != nil || f != nil {
		return err
	}
	if m.waiting != nil {
		m.waiting()
	}
	select {
	case <-updates:
		return nil
	case <-ctx.Done():
		return errMissing
	}
}

// Locate tells where the netdev of r is now; pod may be netns.None(). It
// changes nothing.
func (m *Mover) Locate(r Record, pod netns.NsHandle) (Location, error) {
	if err := r.Validate(); err != nil {
		return Location{}, fmt.Errorf("locate %s: %w", r.Name, err)
	}
	hs, err := m.open(pod)
	if err != nil {
		return Location{}, fmt.Errorf("locate %s: %w", r.Name, err)
	}
	defer hs.close()
	f, err := hs.find(&r)
	if err != nil || f == nil {
		return Location{Place: Nowhere}, err
	}
	a := f.attrs()
	loc := Location{Place: Between, Netns: f.space.String(), Link: linkOf(a), State: stateOf(a)}
	switch {
	case f.space == spaceNode && a.Name == r.Name:
		loc.Place = OnNode
		s, err := outStep(hs, &r, f)
		loc.Settled = err == nil && s == nil
	case f.space == spacePod && a.Name == r.IfName:
		loc.Place = InPod
		s, err := inStep(hs, &r, f)
		loc.Settled = err == nil && s == nil
	}
	return loc, nil
}

// Recover is for a restarted caller that had the netdev in the pod: a
// netdev in the pod under its pod name stays there (the pod's own changes
// to it are the pod's business); anywhere else it is brought back, as by
// MoveOut. It returns where the netdev is then. A caller that died inside
// MoveIn or MoveOut calls MoveOut instead: only it knows that a move was
// under way.
func (m *Mover) Recover(ctx context.Context, r Record, pod netns.NsHandle) (Location, error) {
	loc, err := m.Locate(r, pod)
	if err != nil {
		return loc, fmt.Errorf("recover %s: %w", r.Name, err)
	}
	if loc.Place == InPod || (loc.Place == OnNode && loc.Settled) {
		return loc, nil
	}
	if err := m.MoveOut(ctx, r, pod); err != nil {
		loc, _ = m.Locate(r, pod)
		return loc, err
	}
	return m.Locate(r, pod)
}

// HoldNetNS opens the network namespace at path through procfs, from a
// thread inside it (locked, and restored after). A descriptor of the path
// itself would keep the runtime's bind mount busy, and runtimes that
// unmount without MNT_DETACH would then fail to remove the pod's netns.
// While the handle is open the namespace lives, so a netdev in it stays
// there until MoveOut; a process that reaches it by path uses
// /proc/<pid>/fd/<handle>.
func HoldNetNS(path string) (netns.NsHandle, error) {
	h := netns.None()
	err := ns.WithNetNSPath(path, func(ns.NetNS) error {
		var err error
		h, err = netns.GetFromPath("/proc/thread-self/ns/net")
		return err
	})
	if err != nil {
		return netns.None(), fmt.Errorf("hold netns %s: %w", path, err)
	}
	return h, nil
}
