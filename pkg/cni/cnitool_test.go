package cni

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/testing/handover"
	"github.com/xdpq/xdpq/internal/testing/testbin"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// cnitool drives the installed plugin the way a runtime does: cnitool
// (libcni) execs the xdpq binary from CNI_PATH with the network's
// configuration file, and xdpq execs host-local.
type cnitool struct {
	n       *node
	name    string // the network's, unique to this process: libcni caches results under /var/lib/cni by name
	tool    string
	env     []string
	netconf string
}

// build builds the packages into dir under the given names.
func build(t testing.TB, dir string, pkgs map[string]string) {
	t.Helper()
	for name, pkg := range pkgs {
		testbin.Build(t, filepath.Join(dir, name), pkg)
	}
}

func newCNITool(t testing.TB, n *node) *cnitool {
	t.Helper()
	build(t, n.bin, map[string]string{"xdpq": "github.com/xdpq/xdpq/cmd/cni"})
	return newCNIToolOf(t, n)
}

// newCNIToolOf is newCNITool of the plugin already in n.bin as xdpq.
func newCNIToolOf(t testing.TB, n *node) *cnitool {
	t.Helper()
	tools := t.TempDir()
	build(t, tools, map[string]string{"cnitool": "github.com/containernetworking/cni/cnitool"})
	netdir := t.TempDir()
	name := fmt.Sprintf("xdpq-test-%d", os.Getpid())
	t.Cleanup(func() {
		stale, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", name+"-*"))
		for _, f := range stale {
			os.Remove(f)
		}
	})
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"type":"xdpq","daemonSocket":%q,
		"ipam":{"type":"host-local","subnet":"10.77.0.0/24","dataDir":%q},
		"flows":[{"protocol":"udp","destination":"ipam","destinationPort":"2152"}]}`, name, n.socket, n.data)
	if err := os.WriteFile(filepath.Join(netdir, name+".conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return &cnitool{n: n, name: name, tool: filepath.Join(tools, "cnitool"), netconf: netdir,
		env: append(os.Environ(), "CNI_PATH="+n.bin, "NETCONFPATH="+netdir, "CNI_IFNAME=net1",
			"CNI_ARGS=IgnoreUnknown=1;XDPQ_ALLOCATION="+n.alloc)}
}

// run runs cnitool verb <network> netns and returns its standard output.
func (c *cnitool) run(verb, netns string) ([]byte, error) {
	cmd := exec.Command(c.tool, verb, c.name, netns)
	cmd.Env = c.env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("cnitool %s: %v: %s%s", verb, err, stderr.String(), out)
	}
	return out, nil
}

// leases returns host-local's leases of the network.
func (n *node) leases(network string) []string {
	entries, _ := os.ReadDir(filepath.Join(n.data, network))
	var ips []string
	for _, e := range entries {
		if _, err := netip.ParseAddr(e.Name()); err == nil {
			ips = append(ips, e.Name())
		}
	}
	return ips
}

// TestCNIToolEndToEnd: cnitool attaches a pod's flow through the
// installed plugin, in a queue pool (two queues of xa, software-steered)
// and in a netdev pool (all of xa, moved into the pod); xdpqperf, as uid
// 65534 with no capabilities in the netns cnitool wired (as a runtime
// starts containers in the sandbox's), takes the allocation's sockets and
// receives exactly the frames of its flow while the source interleaves
// frames to another port and another address; DEL and GC (cnitool sends
// no valid-attachments list) leave no flow, no socket and no lease, and
// the netdev pool's xa back on the node.
func TestCNIToolEndToEnd(t *testing.T) {
	testnet.RequireRoot(t) // before building what only a root run uses
	perf := t.TempDir()
	build(t, perf, map[string]string{"xdpqperf": "github.com/xdpq/xdpq/cmd/xdpqperf"})
	t.Run("queue", func(t *testing.T) { cnitoolEndToEnd(t, startNodeFor(t, 65534), perf, 2) })
	t.Run("netdev", func(t *testing.T) { cnitoolEndToEnd(t, startNodeWith(t, 65534, netdevPool, "vf", 1), perf, 4) })
}

func cnitoolEndToEnd(t *testing.T, n *node, perf string, queues int) {
	cnitoolEndToEndOf(t, newCNITool(t, n), perf, queues)
}

// cnitoolEndToEndOf is cnitoolEndToEnd of cnitool c's plugin.
func cnitoolEndToEndOf(t *testing.T, c *cnitool, perf string, queues int) {
	n := c.n
	podNS, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	defer testutils.UnmountNS(podNS)
	defer podNS.Close()
	netns := podNS.Path()
	out, err := c.run("add", netns)
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		CNIVersion string `json:"cniVersion"`
		Interfaces []struct {
			Name    string `json:"name"`
			Sandbox string `json:"sandbox"`
		} `json:"interfaces"`
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.IPs) != 1 || res.CNIVersion != "1.1.0" {
		t.Fatalf("add result %s: %v", out, err)
	}
	netdev := queues == 4
	if netdev && (len(res.Interfaces) != 1 || res.Interfaces[0].Name != "net1" || res.Interfaces[0].Sandbox != netns) {
		t.Errorf("add result interfaces %+v, want net1 in %s", res.Interfaces, netns)
	}
	podIP := netip.MustParsePrefix(res.IPs[0].Address).Addr()
	if got := n.flows(t); got != 1 {
		t.Fatalf("%d flows after add, want 1", got)
	}
	if _, err := c.run("check", netns); err != nil {
		t.Fatal(err)
	}

	var stdout, stderr bytes.Buffer
	pod, err := handover.StartProgramIn(netns, filepath.Join(perf, "xdpqperf"), []string{"-mode", "rxdrop", "-duration", "4s"},
		[]string{"XDPQ_SOCKET=" + n.broker}, &stdout, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer pod.Kill()
	waitSockets(t, n.socket, queues)

	const perQueue = 100
	sendMixed(t, n, podIP, perQueue)
	if err := pod.Wait(); err != nil {
		t.Fatalf("pod: %v\n%s", err, stderr.String())
	}
	totals := map[int]int{}
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		var q, rx, tx int
		if _, err := fmt.Sscanf(sc.Text(), "total q%d: rx %d tx %d", &q, &rx, &tx); err == nil {
			totals[q] = rx
		}
	}
	want := map[int]int{0: perQueue, 1: perQueue} // sendMixed sends on queues 0 and 1
	for q := 2; q < queues; q++ {
		want[q] = 0
	}
	if !maps.Equal(totals, want) {
		t.Errorf("the pod received %v, want %v (its flow only)\n%s", totals, want, stdout.String())
	}

	// cnitool gc: libcni DELs every attachment of the network in its
	// cache (it is given no valid ones), then sends GC with no list,
	// which collects nothing more.
	if _, err := c.run("gc", netns); err != nil {
		t.Fatal(err)
	}
	if got := n.flows(t); got != 0 {
		t.Errorf("%d flows after cnitool gc", got)
	}
	if _, err := c.run("add", netns); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := c.run("del", netns); err != nil {
			t.Fatal(err)
		}
	}
	waitSockets(t, n.socket, 0)
	if got := n.flows(t); got != 0 {
		t.Errorf("%d flows after DEL", got)
	}
	if l := n.leases(c.name); len(l) != 0 {
		t.Errorf("leases after DEL: %v", l)
	}
	if _, err := c.run("check", netns); err == nil {
		t.Error("CHECK passed after DEL")
	}
	if netdev {
		n.checkHome(t)
	}
}

// waitSockets waits until xa has want sockets bound.
func waitSockets(t testing.TB, sock string, want int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		s, err := api.NewClient(sock).Status()
		if err == nil && slices.ContainsFunc(s.Netdevs, func(d api.NetdevStatus) bool { return d.Netdev == "xa" && len(d.Sockets) == want }) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("xa never had %d sockets: %+v %v", want, s, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sendMixed sends, on xb's queues 0 and 1, perQueue frames of the pod's
// flow (udp to podIP:2152) interleaved with as many to port 2153 and to
// another address, and returns the pod's frames by queue.
func sendMixed(t testing.TB, n *node, podIP netip.Addr, perQueue int) [][][]byte {
	t.Helper()
	p := n.pair
	umem, socks, err := xsk.Open(xsk.Netdev{Name: p.B.Name, Ifindex: p.B.Index, NetNS: p.NSPath()}, []uint32{0, 1}, 512,
		xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048}, Rings: xsk.Rings{Fill: 64, Completion: 256, TX: 256}})
	if err != nil {
		t.Fatal(err)
	}
	defer umem.Close()
	other := netip.MustParseAddr("10.77.1.9")
	mine := make([][][]byte, len(socks))
	for q, s := range socks {
		defer s.Close()
		var frames [][]byte
		for j := range perQueue {
			for k, to := range []netip.AddrPort{netip.AddrPortFrom(podIP, 2152), netip.AddrPortFrom(podIP, 2153), netip.AddrPortFrom(other, 2152)} {
				f, err := frame.Spec{SrcMAC: p.B.MAC, DstMAC: p.A.MAC, Src: p.B.Addr, Dst: to.Addr(), Protocol: 17,
					SrcPort: 40000, DstPort: to.Port(), Payload: frame.Payload(uint32(q), uint64(3*j+k), 48)}.Build()
				if err != nil {
					t.Fatal(err)
				}
				frames = append(frames, f)
				if k == 0 {
					mine[q] = append(mine[q], f)
				}
			}
		}
		addrs := make([]uint64, 256)
		for j := range addrs {
			addrs[j] = umem.FrameAddr(q*256 + j)
		}
		if err := traffic.NewSender(s, addrs, 0).Send(frames, time.Now().Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	return mine
}

// BenchmarkCNIToolAddDel: ADD and DEL latency through cnitool and the
// installed plugin (with host-local), each attachment in a netns path of
// its own; reports p50 and p99 of each, and the p50 of STATUS through
// cnitool for the cost of starting the binaries. Run with -benchtime 100x.
func BenchmarkCNIToolAddDel(b *testing.B) {
	b.Run("queue", func(b *testing.B) {
		n := startNode(b)
		benchAddDel(b, n, n.pair.NSPath())
	})
	// A netdev pool's ADD moves xa into the pod and starts its agent
	// there (loading xdpq's program); DEL undoes it.
	b.Run("netdev", func(b *testing.B) {
		pod, err := testutils.NewNS()
		if err != nil {
			b.Fatal(err)
		}
		defer testutils.UnmountNS(pod)
		defer pod.Close()
		benchAddDel(b, startNodeWith(b, 0, netdevPool, "vf", 1), pod.Path())
	})
}

func benchAddDel(b *testing.B, n *node, netns string) {
	c := newCNITool(b, n)
	links := b.TempDir()
	var add, del, status []time.Duration
	i := 0
	for b.Loop() {
		// cnitool names the container after the netns path.
		path := filepath.Join(links, fmt.Sprintf("pod%d", i))
		if err := os.Symlink(netns, path); err != nil {
			b.Fatal(err)
		}
		i++
		start := time.Now()
		if _, err := c.run("add", path); err != nil {
			b.Fatal(err)
		}
		mid := time.Now()
		if _, err := c.run("del", path); err != nil {
			b.Fatal(err)
		}
		end := time.Now()
		// STATUS execs the same two binaries and asks the daemon once:
		// the floor that process start-up sets.
		if _, err := c.run("status", path); err != nil {
			b.Fatal(err)
		}
		add, del, status = append(add, mid.Sub(start)), append(del, end.Sub(mid)), append(status, time.Since(end))
	}
	if got := n.flows(b); got != 0 {
		b.Fatalf("%d flows left", got)
	}
	pct := func(d []time.Duration, p float64) float64 {
		slices.Sort(d)
		return float64(d[min(len(d)-1, int(p*float64(len(d))))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(add, 0.50), "add-p50-ms")
	b.ReportMetric(pct(add, 0.99), "add-p99-ms")
	b.ReportMetric(pct(del, 0.50), "del-p50-ms")
	b.ReportMetric(pct(del, 0.99), "del-p99-ms")
	b.ReportMetric(pct(status, 0.50), "status-p50-ms")
	b.ReportMetric(0, "ns/op")
}
