package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/xdpq/xdpq/internal/testing/kubelettest"
	"github.com/xdpq/xdpq/internal/testing/syncbuf"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/ledger"
	"github.com/xdpq/xdpq/pkg/xdp"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// netdevInPod allocates a netdev of pool (standalone) and has CNI ADD
// move it into a new pod namespace as net1, closed when the test ends.
func netdevInPod(t *testing.T, d *Daemon, pool string) (*api.Allocation, ns.NetNS, api.AttachmentRef) {
	t.Helper()
	a, err := d.local.Alloc(context.Background(), api.AllocRequest{Pool: pool, Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	pod := newPodNS(t)
	ref := api.AttachmentRef{ContainerID: "c1", IfName: "net1"}
	if _, err := d.local.CNIAdd(context.Background(), api.CNIAddRequest{ContainerID: ref.ContainerID, IfName: ref.IfName, Netns: pod.Path(), Allocation: a.ID}); err != nil {
		t.Fatal(err)
	}
	return a, pod, ref
}

// dpdkClient does what DPDK's af_xdp driver does with use_cni=1 (libxdp
// with program loading inhibited): the device plugin handshake on the
// allocation's socket for the netdev's XSKMAP, a socket of its own bound
// to queue of ifname in the pod's namespace, inserted into the map; then
// /fin and the connection closes, as DPDK's does. It returns a receiver
// on its socket.
func dpdkClient(t *testing.T, socket string, pod ns.NetNS, ifname string, queue uint32) *traffic.Receiver {
	t.Helper()
	rcv, err := tryDPDKClient(t, socket, pod, ifname, queue)
	if err != nil {
		t.Fatal(err)
	}
	return rcv
}

// tryDPDKClient is dpdkClient, returning what fails.
func tryDPDKClient(t *testing.T, socket string, pod ns.NetNS, ifname string, queue uint32) (*traffic.Receiver, error) {
	c, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(c)
	if err := unix.Connect(c, &unix.SockaddrUnix{Name: socket}); err != nil {
		return nil, err
	}
	ask := func(cmd string) (string, int, error) {
		if _, err := unix.Write(c, []byte(cmd)); err != nil {
			return "", -1, err
		}
		buf, oob := make([]byte, 128), make([]byte, unix.CmsgSpace(4))
		n, oobn, _, _, err := unix.Recvmsg(c, buf, oob, 0)
		if err != nil {
			return "", -1, err
		}
		fd := -1
		if msgs, _ := unix.ParseSocketControlMessage(oob[:oobn]); len(msgs) == 1 {
			if fds, _ := unix.ParseUnixRights(&msgs[0]); len(fds) == 1 {
				fd = fds[0]
			}
		}
		return string(buf[:n]), fd, nil
	}
	for _, q := range [][2]string{{"/connect,pod", "/host_ok"}, {"/version", "0.1"}} {
		if r, _, err := ask(q[0]); err != nil || r != q[1] {
			return nil, fmt.Errorf("%s: %q %v, want %q", q[0], r, err, q[1])
		}
	}
	r, mapFD, err := ask("/xsk_map_fd," + ifname)
	if err != nil || r != "/fd_ack" || mapFD < 0 {
		return nil, fmt.Errorf("/xsk_map_fd,%s: %q %v", ifname, r, err)
	}
	m, err := ebpf.NewMapFromFD(mapFD)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	rcv, err := tryOwnSocket(t, pod, ifname, queue, m)
	if err != nil {
		return nil, err
	}
	if r, _, err := ask("/fin"); err != nil || r != "/fin_ack" {
		return nil, fmt.Errorf("/fin: %q %v", r, err)
	}
	return rcv, nil
}

// ownSocket binds a socket of the test's own to queue of ifname in the
// pod's namespace and inserts it into m, as DPDK does with the map it
// got, and returns a receiver on it.
func ownSocket(t *testing.T, pod ns.NetNS, ifname string, queue uint32, m *ebpf.Map) *traffic.Receiver {
	t.Helper()
	rcv, err := tryOwnSocket(t, pod, ifname, queue, m)
	if err != nil {
		t.Fatal(err)
	}
	return rcv
}

// tryOwnSocket is ownSocket, returning what fails; the socket is closed
// when the test ends.
func tryOwnSocket(t *testing.T, pod ns.NetNS, ifname string, queue uint32, m *ebpf.Map) (*traffic.Receiver, error) {
	var ifindex int
	if err := pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(ifname)
		if err == nil {
			ifindex = l.Attrs().Index
		}
		return err
	}); err != nil {
		return nil, err
	}
	umem, socks, err := xsk.Open(xsk.Netdev{Name: ifname, Ifindex: ifindex, NetNS: pod.Path()}, []uint32{queue}, 256,
		xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048}, Rings: xsk.Rings{Fill: 256, Completion: 64, RX: 256}})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { socks[0].Close(); umem.Close() })
	if err := m.Update(queue, uint32(socks[0].FD()), ebpf.UpdateAny); err != nil {
		return nil, err
	}
	addrs := make([]uint64, 256)
	for i := range addrs {
		addrs[i] = umem.FrameAddr(i)
	}
	return traffic.NewReceiver(socks[0], addrs)
}

// TestDPDKNetdevPool: DPDK in a netdev-mode pool with the defaults
// (attach: when-bound). Before the handshake the netdev in the pod has no
// program; once the map is handed out xdpq's program is attached and
// stays so after the handshake's connection closed, so the socket DPDK
// inserted receives, byte for byte, also across a daemon restart. DEL
// brings the netdev back to the node without the program. (Before, the
// program was attached only while an xdpq-bound socket existed, and DPDK
// received nothing.)
func TestDPDKNetdevPool(t *testing.T) {
	pair := testnet.NewPair(t, 2)
	dir := t.TempDir()
	o := standaloneOpts(t, pair, dir, testPins(t), "pools: [{name: vf, mode: netdev, devices: {netdevs: [xa]}}]\n")
	d, stop := runDaemon(t, o)
	ctx := context.Background()
	a, pod, ref := netdevInPod(t, d, "vf")
	if n := netdevOf(t, d, "xa"); n.State != "None" {
		t.Errorf("the netdev in the pod before any handshake: %+v, want no program", n)
	}

	rcv := dpdkClient(t, a.Socket, pod, "net1", 0)
	if n := netdevOf(t, d, "xa"); n.State != "Direct" {
		t.Errorf("the netdev in the pod after the handshake: %+v, want xdpq's program", n)
	}
	if err := rcv.Expect(sendFrames(t, pair, 100)[0], time.Now().Add(5*time.Second)); err != nil {
		t.Fatalf("DPDK's socket: %v", err)
	}

	stop()
	d, _ = runDaemon(t, o)
	if err := rcv.Expect(sendFrames(t, pair, 100)[0], time.Now().Add(5*time.Second)); err != nil {
		t.Fatalf("DPDK's socket after a daemon restart: %v", err)
	}
	if n := netdevOf(t, d, "xa"); n.State != "Direct" {
		t.Errorf("the netdev in the pod after the restart: %+v, want xdpq's program", n)
	}
	// The probe of busy queues would keep the program too, while DPDK's
	// socket exists: the record is what keeps it whatever DPDK does.
	if att, _ := d.core.ledger.Attachment("c1/net1"); !att.MapOut {
		t.Error("the attachment's record lost that its map was handed out")
	}
	if pn := d.core.pods.get("xa"); pn == nil || !pn.policy.AttachAlways {
		t.Error("the restarted daemon's pod agent does not keep the program attached")
	}

	if err := d.local.CNIDel(ctx, ref); err != nil {
		t.Fatal(err)
	}
	att, err := xdp.Query(pair.NSPath(), pair.A.Index)
	if err != nil || att != nil {
		t.Errorf("xa back on the node with a program: %+v %v", att, err)
	}
}

// TestKubernetesDPDKPaths: a netdev-mode pool with dpdk {iface: net1,
// pinnedMap: true}. Allocate mounts the allocation's directory where
// DPDK's af_xdp driver looks without dp_path (its socket also named
// afxdp.sock there), the socket itself at DPDK 23.03's /tmp/afxdp.sock,
// and the netdev's XSKMAP pinned at /tmp/afxdp_dp/net1/xsks_map. Once
// CNI ADD moved the netdev in, the pinned map is the pod netdev's
// XSKMAP and xdpq's program is attached; a socket inserted through the
// pinned map (use_pinned_map) and one through the handshake on
// afxdp.sock (use_cni) both receive byte for byte. DEL takes the pin and
// the program away.
func TestKubernetesDPDKPaths(t *testing.T) {
	p := testnet.NewPair(t, 2)
	dir := t.TempDir()
	plugins := filepath.Join(dir, "device-plugins")
	os.MkdirAll(plugins, 0o755)
	regs := kubelettest.Start(t, plugins).Registrations
	cfgPath := filepath.Join(dir, "config.yaml")
	os.WriteFile(cfgPath, []byte("pools: [{name: vf, mode: netdev, devices: {netdevs: [xa]}, dpdk: {iface: net1, pinnedMap: true}}]\n"), 0o644)
	pins := filepath.Join(testPins(t), "xdpq")
	allocDir := filepath.Join(dir, "alloc")
	opts := Options{ConfigPath: cfgPath, NetNS: p.NSPath(), PinDir: pins,
		StateDir: filepath.Join(dir, "state"), AllocDir: allocDir, PluginDir: plugins,
		APISocket: filepath.Join(dir, "api.sock")}
	d, stop := runDaemon(t, opts)
	var reg *pluginapi.RegisterRequest
	select {
	case reg = <-regs:
	case <-time.After(10 * time.Second):
		t.Fatal("no registration")
	}
	c := kubelettest.Dial(t, filepath.Join(plugins, reg.Endpoint))
	ctx := context.Background()
	resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"xa"}}}})
	if err != nil {
		t.Fatal(err)
	}
	cr := resp.ContainerResponses[0]
	id := cr.Envs["XDPQ_ALLOCATION"]
	pin := filepath.Join(pins, "dpdk", "xa", "xsks_map")
	mounts := map[string]string{}
	for _, m := range cr.Mounts {
		mounts[m.ContainerPath] = m.HostPath
	}
	want := map[string]string{
		"/run/xdpq":                   filepath.Join(allocDir, id),
		"/tmp/afxdp_dp/net1":          filepath.Join(allocDir, id),
		"/tmp/afxdp.sock":             filepath.Join(allocDir, ".dpdk", id+".sock"),
		"/tmp/afxdp_dp/net1/xsks_map": pin,
	}
	if fmt.Sprint(mounts) != fmt.Sprint(want) {
		t.Errorf("mounts %v, want %v", mounts, want)
	}
	sock, err := os.Stat(filepath.Join(allocDir, id, "xdpq.sock"))
	if err != nil || sock.Mode().Type() != os.ModeSocket {
		t.Fatalf("the allocation's socket: %v", err)
	}
	for _, l := range []string{filepath.Join(allocDir, id, "afxdp.sock"), filepath.Join(allocDir, ".dpdk", id+".sock")} {
		if fi, err := os.Stat(l); err != nil || !os.SameFile(fi, sock) {
			t.Errorf("%s is not the allocation's socket: %v", l, err)
		}
	}

	pod, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	defer testutils.UnmountNS(pod)
	defer pod.Close()
	ref := api.AttachmentRef{ContainerID: "c1", IfName: "net1"}
	if _, err := d.local.CNIAdd(ctx, api.CNIAddRequest{ContainerID: ref.ContainerID, IfName: ref.IfName, Netns: pod.Path(), DeviceID: "xa", Resource: "xdpq.io/vf"}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(pin); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the pinned map: %v %v", fi, err)
	}
	m, err := ebpf.LoadPinnedMap(pin, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Type() != ebpf.XSKMap {
		t.Errorf("the pin is a %v", m.Type())
	}
	if n := netdevOf(t, d, "xa"); n.State != "Direct" {
		t.Errorf("the netdev in the pod: %+v, want xdpq's program", n)
	}
	pinned := ownSocket(t, pod, "net1", 0, m)
	// The test's process is in no pod's cgroup: let it in as the pod's.
	root := uint32(0)
	if err := d.core.setOwner(id, ledger.Owner{UID: &root}); err != nil {
		t.Fatal(err)
	}
	handshake := dpdkClient(t, filepath.Join(allocDir, id, "afxdp.sock"), pod, "net1", 1)
	sent := sendFrames(t, p, 100)
	if err := pinned.Expect(sent[0], time.Now().Add(5*time.Second)); err != nil {
		t.Errorf("the socket inserted through the pinned map: %v", err)
	}
	if err := handshake.Expect(sent[1], time.Now().Add(5*time.Second)); err != nil {
		t.Errorf("the socket inserted through the handshake: %v", err)
	}

	// A restarted daemon keeps the pin the container has mounted.
	before, _ := os.Stat(pin)
	stop()
	d, _ = runDaemon(t, opts)
	if after, err := os.Stat(pin); err != nil || !os.SameFile(before, after) {
		t.Errorf("the pin after a restart: %v, not the one mounted", err)
	}
	if err := pinned.Expect(sendFrames(t, p, 100)[0], time.Now().Add(5*time.Second)); err != nil {
		t.Errorf("the socket inserted through the pinned map, after a restart: %v", err)
	}

	if err := d.local.CNIDel(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pin); !os.IsNotExist(err) {
		t.Errorf("the pin after DEL: %v", err)
	}
	if att, err := xdp.Query(p.NSPath(), p.A.Index); err != nil || att != nil {
		t.Errorf("xa back on the node with a program: %+v %v", att, err)
	}
}

var testpmdRX = regexp.MustCompile(`Accumulated forward statistics[^\n]*\n\s*RX-packets:\s*(\d+)`)

// TestTestpmdInPod: Debian's dpdk-testpmd (22.11: a plain net_af_xdp
// vdev, which loads and attaches its own XDP program through libxdp) in
// a netdev-mode pool's pod, as a container would run it: in the pod's
// network namespace with its own sysfs, as root with only the
// capabilities README lists for it. It receives what is sent to its
// queue; without any one of those capabilities its port does not start.
// The netdev comes back to the node without DPDK's program.
func TestTestpmdInPod(t *testing.T) {
	testpmd := testnet.RequireTool(t, "dpdk-dev librte-net-af-xdp23", "dpdk-testpmd")
	pair := testnet.NewPair(t, 2)
	o := standaloneOpts(t, pair, t.TempDir(), testPins(t), "pools: [{name: vf, mode: netdev, devices: {netdevs: [xa]}}]\n")
	d, _ := runDaemon(t, o)
	ctx := context.Background()
	_, pod, ref := netdevInPod(t, d, "vf")
	need := []string{"net_raw", "net_admin", "sys_admin", "ipc_lock"}
	run := func(caps []string, frames int) (uint64, string) {
		t.Helper()
		bounding := "-all"
		for _, c := range caps {
			bounding += ",+" + c
		}
		// A container's own mount namespace, with the sysfs of its
		// network namespace (the PMD looks the netdev up there).
		cmd := exec.Command("nsenter", "--net="+pod.Path(), "unshare", "--mount", "--propagation", "private", "sh", "-c",
			`mount -t sysfs none /sys && exec setpriv --bounding-set=`+bounding+` --inh-caps=-all -- stdbuf -oL "$0" "$@"`,
			testpmd, "-l", "0,1", "--no-huge", "-m", "256", "--no-pci", "--no-shconf",
			"--vdev", "net_af_xdp0,iface=net1,start_queue=0,queue_count=1",
			"--", "--forward-mode=rxonly", "--total-num-mbufs=16384")
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		var out syncbuf.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		// testpmd says nothing but on its output: watch it.
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(out.String(), "Press enter to exit") {
			select {
			case <-exited:
				return 0, out.String()
			default:
			}
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				<-exited
				t.Fatalf("testpmd did not start:\n%s", out.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
		if frames > 0 {
			sendFrames(t, pair, frames)
		}
		stdin.Close()
		if err := <-exited; err != nil {
			t.Fatalf("testpmd: %v\n%s", err, out.String())
		}
		m := testpmdRX.FindStringSubmatch(out.String())
		if m == nil {
			t.Fatalf("testpmd printed no RX-packets:\n%s", out.String())
		}
		n, _ := strconv.ParseUint(m[1], 10, 64)
		return n, out.String()
	}
	const frames = 1000
	// Queue 0 gets the frames sent on it, and perhaps a few the node's
	// stack sends on its own (IPv6 neighbour discovery).
	// Debian's testpmd loads its program through libxdp, which finds no
	// bpffs in the pod and detaches and attaches it again; under a busy
	// machine (make test runs the packages side by side) its PMD now and
	// then receives none or part of the frames while xdpq keeps its hands
	// off the hook (Overridden, then None: the pod agent attaches nothing
	// while no socket of its own is bound). Up to three runs, each told.
	var n uint64
	var out string
	for try := 1; try <= 3; try++ {
		if n, out = run(need, frames); n >= frames && n <= frames+20 {
			break
		}
		t.Logf("run %d: testpmd received %d of %d frames", try, n, frames)
	}
	if n < frames || n > frames+20 {
		t.Errorf("testpmd with %v received %d frames, want %d:\n%s", need, n, frames, out)
	}
	for i, c := range need {
		less := slices.Delete(slices.Clone(need), i, i+1)
		if _, out := run(less, 0); !strings.Contains(out, "Start ports failed") {
			t.Errorf("testpmd without %s started its port:\n%s", c, out)
		}
	}
	if err := d.local.CNIDel(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if att, err := xdp.Query(pair.NSPath(), pair.A.Index); err != nil || att != nil {
		t.Errorf("xa back on the node with a program: %+v %v", att, err)
	}
}

// TestChainedNetdevPoolRefused: a netdev-mode pool's netdev moves into
// the pod under the CNI interface name, which in a chain is the previous
// plugin's: such an ADD is refused with what to do instead, and nothing
// moves.
func TestChainedNetdevPoolRefused(t *testing.T) {
	pair := testnet.NewPair(t, 2)
	d, _ := runDaemon(t, standaloneOpts(t, pair, t.TempDir(), testPins(t), "pools: [{name: vf, mode: netdev, devices: {netdevs: [xa]}}]\n"))
	ctx := context.Background()
	a, err := d.local.Alloc(ctx, api.AllocRequest{Pool: "vf", Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	pod, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	defer testutils.UnmountNS(pod)
	defer pod.Close()
	_, err = d.local.CNIAdd(ctx, api.CNIAddRequest{ContainerID: "c1", IfName: "eth0", Netns: pod.Path(), Allocation: a.ID, Chained: true})
	if !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), "NetworkAttachmentDefinition") {
		t.Errorf("a chained ADD of a netdev pool: %v", err)
	}
	if err := pair.NS.Do(func(ns.NetNS) error { _, err := netlink.LinkByName("xa"); return err }); err != nil {
		t.Errorf("xa left the node: %v", err)
	}
}
