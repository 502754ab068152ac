package cni

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ip"
	"github.com/containernetworking/plugins/pkg/ipam"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/xdpq/xdpq/internal/atomicfile"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/flow"
)

// DefaultCacheDir is where the plugin keeps what DEL needs, written at
// the start of ADD.
const DefaultCacheDir = "/var/lib/cni/xdpq"

// Plugin is the xdpq CNI plugin; cmd/cni runs its verbs through skel.
type Plugin struct {
	// CacheDir keeps what DEL needs; "" means DefaultCacheDir.
	CacheDir string
}

// Funcs are the plugin's verbs for skel.PluginMainFuncs.
func (p Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.Add, Del: p.Del, Check: p.Check, GC: p.GC, Status: p.Status}
}

func (p Plugin) cacheDir() string {
	if p.CacheDir == "" {
		return DefaultCacheDir
	}
	return p.CacheDir
}

// Error codes of the plugin (≥ 100; 50 is the spec's "not available").
const (
	ErrDaemon = 101 // the daemon refused or failed
	ErrIPAM   = 102 // the IPAM plugin failed
)

// k8sArgs are the CNI_ARGS xdpq reads.
type k8sArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE          types.UnmarshallableString //nolint:revive // CNI_ARGS names
	K8S_POD_NAME               types.UnmarshallableString //nolint:revive
	K8S_POD_UID                types.UnmarshallableString //nolint:revive
	K8S_POD_INFRA_CONTAINER_ID types.UnmarshallableString //nolint:revive
	// XDPQ_ALLOCATION names a standalone allocation (xdpqctl alloc).
	XDPQ_ALLOCATION types.UnmarshallableString //nolint:revive
}

func client(c *NetConf) *api.Client { return api.NewClient(c.DaemonSocket) }

func (p Plugin) cachePath(args *skel.CmdArgs) string {
	return filepath.Join(p.cacheDir(), args.ContainerID+"-"+args.IfName+".json")
}

// Add attaches the pod: IPAM first, then the daemon steers the flows
// (their "ipam" destinations the addresses IPAM gave) to the pod's queues.
//
// In a chain, after the primary plugin (prevResult set), the addresses are
// prevResult's and xdpq has no IPAM of its own; it passes prevResult on
// as it is (a queue pool adds no interface), and for a pod that holds no
// xdpq device (every pod on the node passes through the chain) it does
// nothing else.
func (p Plugin) Add(args *skel.CmdArgs) (err error) {
	c, flows, err := ParseNetConf(args.StdinData)
	if err != nil {
		return err
	}
	var ka k8sArgs
	if err := types.LoadArgs(args.Args, &ka); err != nil {
		return fieldError("CNI_ARGS", "%v", err)
	}
	var prev *current.Result
	if c.RawPrevResult != nil {
		if c.IPAM.Type != "" {
			return fieldError("ipam", "in a chain the pod's addresses are the previous plugin's (prevResult): leave out ipam")
		}
		if err := version.ParsePrevResult(&c.NetConf); err != nil {
			return fieldError("prevResult", "%v", err)
		}
		if prev, err = current.NewResultFromResult(c.PrevResult); err != nil {
			return fieldError("prevResult", "%v", err)
		}
	}
	// The pod's namespace must be one: a path that is not (gone, a
	// typo) would be recorded, its flows steered, and nothing would ever
	// find the pod gone.
	if args.Netns != "" {
		n, err := ns.GetNS(args.Netns)
		if err != nil {
			return &types.Error{Code: types.ErrInvalidEnvironmentVariables,
				Msg: "CNI_NETNS " + args.Netns + " is not a network namespace (the pod's sandbox gone, or a wrong path)", Details: err.Error()}
		}
		_ = n.Close() // only looked at
	}
	// What DEL needs, before anything else happens; gone again if ADD
	// fails or has nothing to do. Best effort: without it DEL works from
	// the configuration the runtime gives it, as it did before the cache.
	// An ADD of a container and interface that has one already (a
	// runtime's retry) leaves it: it is the one that succeeded's, which
	// DEL needs, whatever this ADD comes to.
	cache := p.cachePath(args)
	_, statErr := os.Lstat(cache)
	ours := errors.Is(statErr, fs.ErrNotExist)
	if ours {
		if err := os.MkdirAll(p.cacheDir(), 0o700); err == nil {
			_ = atomicfile.WriteFile(cache, args.StdinData, 0o600)
		}
	}
	defer func() {
		if err != nil && ours {
			// The runtime's DEL after a failed ADD removes it again.
			_ = atomicfile.Remove(cache)
		}
	}()
	result := &current.Result{CNIVersion: current.ImplementedSpecVersion}
	switch {
	case prev != nil:
		result = prev
	case c.IPAM.Type != "":
		r, err := ipam.ExecAdd(c.IPAM.Type, args.StdinData)
		if err != nil {
			return &types.Error{Code: ErrIPAM, Msg: "ipam " + c.IPAM.Type, Details: err.Error()}
		}
		if result, err = current.NewResultFromResult(r); err != nil {
			return undone(&types.Error{Code: ErrIPAM, Msg: "ipam result", Details: err.Error()}, undoIPAM(c, args))
		}
	}
	req := api.CNIAddRequest{ContainerID: args.ContainerID, IfName: args.IfName,
		Allocation: string(ka.XDPQ_ALLOCATION), Resource: c.ResourceName, DeviceID: c.DeviceID,
		PodUID: string(ka.K8S_POD_UID), PodNamespace: string(ka.K8S_POD_NAMESPACE), PodName: string(ka.K8S_POD_NAME),
		Netns: args.Netns, MTU: c.MTU, Chained: prev != nil}
	var ips []netip.Addr
	for _, ip := range result.IPs {
		if a, ok := netip.AddrFromSlice(ip.Address.IP); ok {
			ips = append(ips, a.Unmap())
		}
	}
	req.Addresses = ips
	if req.Flows, err = resolveFlows(flows, ips); err != nil {
		return undone(err, undoIPAM(c, args))
	}
	att, err := client(c).CNIAdd(req)
	if prev != nil && errors.Is(err, api.ErrNoDevices) {
		// Nothing for DEL to undo; a cache left behind only repeats the
		// configuration DEL is given.
		if ours {
			_ = atomicfile.Remove(cache)
		}
		return types.PrintResult(prev, c.CNIVersion)
	}
	if err != nil {
		return undone(&types.Error{Code: ErrDaemon, Msg: "xdpq daemon", Details: err.Error()}, undoIPAM(c, args))
	}
	if att.Mode == api.ModeNetdev {
		// The daemon moved the netdev in as IfName: it carries the
		// addresses, like host-device's.
		result.Interfaces = []*current.Interface{{Name: args.IfName, Mac: att.Mac, Sandbox: args.Netns}}
		for _, ip := range result.IPs {
			ip.Interface = current.Int(0)
		}
		if err := ns.WithNetNSPath(args.Netns, func(ns.NetNS) error { return ipam.ConfigureIface(args.IfName, result) }); err != nil {
			var undo error
			if derr := client(c).CNIDel(args.ContainerID, args.IfName); derr != nil {
				undo = fmt.Errorf("xdpq daemon DEL: %w", derr)
			}
			undo = errors.Join(undo, undoIPAM(c, args))
			return undone(&types.Error{Code: ErrIPAM, Msg: "configure " + args.IfName, Details: err.Error()}, undo)
		}
	}
	return types.PrintResult(result, c.CNIVersion)
}

// resolveFlows is flow.Resolve with its error a CNI error.
func resolveFlows(flows []ParsedFlow, ips []netip.Addr) ([]api.CNIFlow, error) {
	out, err := flow.Resolve(flows, ips)
	return out, cniError(err)
}

// undoIPAM releases what IPAM gave a failed ADD.
func undoIPAM(c *NetConf, args *skel.CmdArgs) error {
	if c.IPAM.Type == "" {
		return nil
	}
	if err := ipam.ExecDel(c.IPAM.Type, args.StdinData); err != nil {
		return fmt.Errorf("ipam %s DEL: %w", c.IPAM.Type, err)
	}
	return nil
}

// undone adds to the error of a failed ADD what undoing it left behind,
// for the runtime's log: the runtime's DEL after a failed ADD retries it.
func undone(err, undo error) error {
	if undo == nil {
		return err
	}
	if te, ok := errors.AsType[*types.Error](err); ok {
		te.Details += "; undoing the ADD failed too: " + undo.Error()
		return err
	}
	return errors.Join(err, undo)
}

// Del detaches: idempotent, and fine when the netns is gone or the
// daemon has no record.
//
// A daemon that does not answer is one of two cases, told apart by what
// is at its socket's path:
//
//   - Restarting (or crashed): DEL fails, keeping the IPAM lease and the
//     cache file, and the runtime retries until the next daemon undoes the
//     attachment. A crashed daemon leaves its socket (the connection is
//     refused); one that stopped removed it but left its state beside it
//     (the chart's /run/xdpq holds the socket, agent/ and alloc/), so the
//     socket's directory is not empty. The next daemon's collector would
//     end the attachment of a pod whose netns went, but only a collection
//     period after it is ready: until then its flows would still steer
//     while its address could already be another pod's.
//   - Uninstalled: the socket is absent and its directory empty or gone.
//     A daemon removes its state only once uninstall undid every
//     allocation and attachment (one that failed keeps it, and DEL keeps
//     failing so that nothing is forgotten); after a reboot /run is empty
//     and the kernel holds nothing of xdpq either. Nothing steers, so DEL
//     releases the IPAM lease, removes the cache file and succeeds:
//     pods left running through `helm uninstall` can still be deleted.
//
// A daemon whose state is not beside its socket (--state-dir, --alloc-dir
// elsewhere) must keep its socket in a directory of its own that holds
// something else too, or a DEL while it restarts would count as one after
// an uninstall.
func (p Plugin) Del(args *skel.CmdArgs) error {
	data := args.StdinData
	if cached, err := os.ReadFile(p.cachePath(args)); err == nil {
		data = cached // the configuration ADD saw
	}
	c, _, err := ParseNetConf(data)
	if err != nil {
		return err
	}
	cl := client(c)
	if err := cl.CNIDel(args.ContainerID, args.IfName); err != nil {
		if gone, why := daemonUninstalled(cl.Socket(), err); !gone {
			return &types.Error{Code: ErrDaemon, Msg: "xdpq daemon", Details: err.Error() + why}
		}
	}
	if c.IPAM.Type != "" {
		if err := ipam.ExecDel(c.IPAM.Type, data); err != nil {
			return &types.Error{Code: ErrIPAM, Msg: "ipam " + c.IPAM.Type, Details: err.Error()}
		}
	}
	if err := os.Remove(p.cachePath(args)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// daemonUninstalled tells, after the daemon at socket did not answer a
// DEL with err, whether xdpq was uninstalled from the node (see
// [Plugin.Del]): the socket is absent and its directory empty or gone.
// If not, why says, for the error's details, what the runtime waits for.
func daemonUninstalled(socket string, err error) (gone bool, why string) {
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "dial" || !errors.Is(oe, fs.ErrNotExist) {
		return false, "" // an answer, a refusal, a timeout: a daemon is or was there
	}
	dir := filepath.Dir(socket)
	ents, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist), err == nil && len(ents) == 0:
		return true, ""
	case err != nil:
		return false, fmt.Sprintf("; cannot tell whether xdpq was uninstalled: %v", err)
	}
	return false, fmt.Sprintf("; %s still holds its state (%s), so it is restarting, or its uninstall left something: "+
		"DEL succeeds once a daemon answers, or once that directory is empty", dir, ents[0].Name())
}

// Check verifies the attachment with the daemon and the addresses with IPAM.
func (p Plugin) Check(args *skel.CmdArgs) error {
	c, flows, err := ParseNetConf(args.StdinData)
	if err != nil {
		return err
	}
	if c.RawPrevResult == nil {
		return fieldError("prevResult", "CHECK needs the result of ADD")
	}
	if err := version.ParsePrevResult(&c.NetConf); err != nil {
		return fieldError("prevResult", "%v", err)
	}
	prev, err := current.NewResultFromResult(c.PrevResult)
	if err != nil {
		return fieldError("prevResult", "%v", err)
	}
	att, err := client(c).CNICheck(args.ContainerID, args.IfName)
	if errors.Is(err, api.ErrNotFound) && c.IPAM.Type == "" {
		// In a chain, ADD did nothing for a pod without xdpq devices and
		// kept no cache file; with one, the attachment is missing.
		if _, e := os.Stat(p.cachePath(args)); errors.Is(e, os.ErrNotExist) {
			return nil
		}
	}
	if err != nil {
		return &types.Error{Code: ErrDaemon, Msg: "xdpq check", Details: err.Error()}
	}
	// The flows this configuration and prevResult's addresses give must be
	// the ones the daemon steers for the attachment.
	var ips []netip.Addr
	for _, ip := range prev.IPs {
		if a, ok := netip.AddrFromSlice(ip.Address.IP); ok {
			ips = append(ips, a.Unmap())
		}
	}
	want, err := resolveFlows(flows, ips)
	if err != nil {
		return err
	}
	if !sameFlows(want, att.Flows) {
		return &types.Error{Code: ErrDaemon, Msg: "xdpq check: flows differ",
			Details: fmt.Sprintf("configuration and prevResult give %v, the daemon steers %v", want, att.Flows)}
	}
	if att.Mode == api.ModeNetdev {
		if err := checkInterface(args, c, prev, att); err != nil {
			return &types.Error{Code: ErrDaemon, Msg: "xdpq check: interface " + args.IfName, Details: err.Error()}
		}
	}
	if c.IPAM.Type != "" {
		if err := ipam.ExecCheck(c.IPAM.Type, args.StdinData); err != nil {
			return &types.Error{Code: ErrIPAM, Msg: "ipam check", Details: err.Error()}
		}
	}
	return nil
}

// checkInterface checks a netdev-mode pool's netdev in the pod: there as
// IfName, up, with the MAC prevResult reported, the MTU asked for, and
// prevResult's addresses and routes.
func checkInterface(args *skel.CmdArgs, c *NetConf, prev *current.Result, att *api.Attachment) error {
	var found bool
	for _, i := range prev.Interfaces {
		if i.Name == args.IfName && i.Sandbox != "" {
			found = true
			if i.Mac != att.Mac {
				return fmt.Errorf("prevResult gives MAC %s, the netdev has %s", i.Mac, att.Mac)
			}
		}
	}
	if !found {
		return fmt.Errorf("prevResult has no interface %s in a sandbox", args.IfName)
	}
	return ns.WithNetNSPath(args.Netns, func(ns.NetNS) error {
		l, err := netlink.LinkByName(args.IfName)
		if err != nil {
			return err
		}
		if l.Attrs().HardwareAddr.String() != att.Mac {
			return fmt.Errorf("MAC %s, the daemon moved in %s", l.Attrs().HardwareAddr, att.Mac)
		}
		if l.Attrs().Flags&net.FlagUp == 0 {
			return fmt.Errorf("down")
		}
		if c.MTU != 0 && l.Attrs().MTU != c.MTU {
			return fmt.Errorf("mtu %d, configured %d", l.Attrs().MTU, c.MTU)
		}
		if err := ip.ValidateExpectedInterfaceIPs(args.IfName, prev.IPs); err != nil {
			return err
		}
		return ip.ValidateExpectedRoute(prev.Routes)
	})
}

func sameFlows(a, b []api.CNIFlow) bool {
	key := func(fs []api.CNIFlow) []string {
		var k []string
		for _, f := range fs {
			k = append(k, fmt.Sprintf("%+v", f))
		}
		slices.Sort(k)
		return k
	}
	return slices.Equal(key(a), key(b))
}

// Status says whether the plugin can take ADDs: the daemon answers, in
// the API version the plugin speaks. It asks for the version alone: the
// runtime calls STATUS often, and needs nothing of the daemon's status.
func (p Plugin) Status(args *skel.CmdArgs) error {
	c, _, err := ParseNetConf(args.StdinData)
	if err != nil {
		return err
	}
	v, err := client(c).Version()
	if err != nil {
		return &types.Error{Code: types.ErrPluginNotAvailable, Msg: "xdpq daemon not reachable", Details: err.Error()}
	}
	if v != api.Version {
		return &types.Error{Code: types.ErrPluginNotAvailable, Msg: "xdpq daemon of another version",
			Details: fmt.Sprintf("the daemon speaks API version %d, this plugin %d: install the plugin of the daemon's release", v, api.Version)}
	}
	return nil
}

// GC removes the attachments not in cni.dev/valid-attachments; with no
// such list it collects nothing.
func (p Plugin) GC(args *skel.CmdArgs) error {
	c, _, err := ParseNetConf(args.StdinData)
	if err != nil {
		return err
	}
	if c.ValidAttachments == nil {
		return nil
	}
	var valid []string
	for _, a := range c.ValidAttachments {
		valid = append(valid, a.ContainerID+"/"+a.IfName)
	}
	if _, err := client(c).CNIGC(valid); err != nil {
		return &types.Error{Code: ErrDaemon, Msg: "xdpq gc", Details: err.Error()}
	}
	// IPAM collects by the same list (only with one: host-local would
	// release every lease given none).
	if c.IPAM.Type != "" {
		if err := invoke.DelegateGC(context.Background(), c.IPAM.Type, args.StdinData, nil); err != nil {
			return &types.Error{Code: ErrIPAM, Msg: "ipam gc", Details: err.Error()}
		}
	}
	return nil
}
