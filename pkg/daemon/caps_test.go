package daemon

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/xdpq/xdpq/internal/testing/handover"
	"github.com/xdpq/xdpq/internal/testing/testbin"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/api"
)

// capRun is one daemon under a capability set (setpriv as kubelet's
// runtime does for a container: bounding and inheritable sets), and the
// first step of a user's work that failed under it.
type capRun struct {
	step string
	err  error
	log  string // the daemon's, when it did all its work
}

// TestCapabilities runs the daemon as the DaemonSet does, as root in an
// unprivileged container with Capabilities added, through what a
// node's users do: a queue pool received by an unprivileged pod through
// the broker, a CNI attachment with a flow in the pod's namespace, a
// netdev-mode pool whose netdev CNI moves into the pod and DPDK's
// handshake receives on. It passes with Capabilities; with any one
// of them dropped some step fails (the list has nothing it does not
// need); each case's failure is logged, the measurement behind the
// chart's list.
func TestCapabilities(t *testing.T) {
	testnet.RequireRoot(t)
	testnet.RequireTool(t, "util-linux", "setpriv")
	bin := t.TempDir()
	for _, c := range []string{"deviceplugin", "xdpqperf"} {
		testbin.Build(t, filepath.Join(bin, c), "github.com/xdpq/xdpq/cmd/"+c)
	}
	all := make([]string, 0, len(Capabilities))
	for c := range Capabilities {
		all = append(all, c)
	}
	slices.Sort(all)
	t.Run("all", func(t *testing.T) {
		if r := runWithCaps(t, bin, all); r.err != nil {
			t.Fatalf("with %v: %s: %v", all, r.step, r.err)
		}
	})
	for _, drop := range all {
		t.Run("without "+drop, func(t *testing.T) {
			caps := slices.DeleteFunc(slices.Clone(all), func(c string) bool { return c == drop })
			r := runWithCaps(t, bin, caps)
			if drop == "sys_ptrace" && !initNetnsReadable() {
				// In a sandbox whose pid 1 not even full root may inspect,
				// what SYS_PTRACE is for fails with it too: the work
				// is done, and the daemon says what it cannot do.
				if r.err != nil {
					t.Fatalf("without %s: %s: %v", drop, r.step, r.err)
				}
				if !strings.Contains(r.log, "initial netns /proc/1/ns/net: permission denied") {
					t.Fatalf("without %s the daemon does not say the node's namespace is out of its reach:\n%s", drop, r.log)
				}
				t.Logf("without %s: the node's namespace cannot be opened (as here with it: this sandbox's pid 1)", drop)
				return
			}
			if r.err == nil {
				t.Fatalf("the daemon did all its work without %s: it is not needed (%s)", drop, Capabilities[drop])
			}
			t.Logf("without %s: %s fails: %v", drop, r.step, r.err)
		})
	}
}

// runWithCaps starts the daemon with caps only and does the work of
// TestCapabilities; it returns the first step that failed.
func runWithCaps(t *testing.T, bin string, caps []string) capRun {
	pair := testnet.NewPair(t, 2)
	dir := t.TempDir()
	o := standaloneOpts(t, pair, dir, testPins(t), `pools:
- {name: q, steering: software, devices: {netdevs: ['xa#0-1']}}
`)
	// The pod (uid 65534) reaches its socket below the allocation
	// directory: not under t.TempDir (0700).
	allocDir, err := os.MkdirTemp("", "xdpq-alloc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(allocDir) })
	os.Chmod(allocDir, 0o755)
	o.AllocDir = allocDir
	set := "-all"
	for _, c := range caps {
		set += ",+" + c
	}
	d, err := startDaemonProcess(filepath.Join(bin, "deviceplugin"), o,
		[]string{"setpriv", "--inh-caps=" + set, "--bounding-set=" + set, "--"}, "--metrics-addr", "")
	if err != nil {
		return capRun{step: "start", err: err}
	}
	defer d.stop()
	c := api.NewClient(o.APISocket)
	a, err := c.Alloc("q", 2, 65534)
	if err != nil {
		return capRun{step: "alloc for uid 65534", err: err}
	}
	pod, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { pod.Close(); testutils.UnmountNS(pod) }()
	flow := api.CNIFlow{Protocol: "udp", Dst: netip.PrefixFrom(pair.PodAddr, 32), DstPort: 5000}
	if _, err := c.CNIAdd(api.CNIAddRequest{ContainerID: "c1", IfName: "net1", Netns: pod.Path(), Allocation: a.ID, Flows: []api.CNIFlow{flow}, Addresses: []netip.Addr{flow.Dst.Addr()}}); err != nil {
		return capRun{step: "CNI ADD (queue pool)", err: err}
	}

	// The pod: xdpqperf as uid 65534 with no capability.
	var stdout, stderr bytes.Buffer
	perf, err := handover.StartProgram(filepath.Join(bin, "xdpqperf"), []string{"-mode", "rxdrop", "-duration", "3s"},
		[]string{"XDPQ_SOCKET=" + a.Socket}, &stdout, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer perf.Kill()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, err := c.Status()
		if err == nil && len(s.Netdevs) == 1 && len(s.Netdevs[0].Sockets) == 2 && s.Netdevs[0].State == "Filter" {
			break
		}
		if time.Now().After(deadline) {
			perf.Kill()
			perf.Wait()
			var nd []api.NetdevStatus
			if s != nil {
				nd = s.Netdevs
			}
			return capRun{step: "the pod's lease", err: fmt.Errorf("not active (pod: %q); netdevs %+v; the daemon says: %s", strings.TrimSpace(stderr.String()), nd, problem(d.out.String()))}
		}
		time.Sleep(20 * time.Millisecond)
	}
	sendFrames(t, pair, 300)
	if err := perf.Wait(); err != nil {
		return capRun{step: "the pod's lease", err: fmt.Errorf("xdpqperf: %v\n%s\ndaemon: %s", err, stderr.String(), d.out)}
	}
	totals := map[uint32]int{}
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		var q uint32
		var rx, tx int
		if _, err := fmt.Sscanf(sc.Text(), "total q%d: rx %d tx %d", &q, &rx, &tx); err == nil {
			totals[q] = rx
		}
	}
	if totals[0] != 300 || totals[1] != 300 {
		return capRun{step: "the pod receives", err: fmt.Errorf("received %v, want 300 on queues 0 and 1\n%s", totals, stdout.String())}
	}
	if err := c.CNIDel("c1", "net1"); err != nil {
		return capRun{step: "CNI DEL (queue pool)", err: err}
	}
	if err := c.Free(a.ID); err != nil {
		return capRun{step: "free", err: err}
	}

	// A netdev-mode pool: CNI ADD moves the netdev into the pod, and
	// DPDK's handshake gets its map there.
	if err := os.WriteFile(o.ConfigPath, []byte("pools: [{name: vf, mode: netdev, devices: {netdevs: [xa]}}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		s, err := c.Status()
		if err == nil && len(s.Pools) == 1 && s.Pools[0].Name == "vf" && s.Pools[0].Free == 1 {
			break
		}
		if time.Now().After(deadline) {
			return capRun{step: "reload to a netdev pool", err: fmt.Errorf("status %+v %v\n%s", s, err, d.out)}
		}
		time.Sleep(20 * time.Millisecond)
	}
	nd, err := c.Alloc("vf", 1, 0)
	if err != nil {
		return capRun{step: "alloc (netdev pool)", err: err}
	}
	if _, err := c.CNIAdd(api.CNIAddRequest{ContainerID: "c2", IfName: "net1", Netns: pod.Path(), Allocation: nd.ID}); err != nil {
		return capRun{step: "CNI ADD (netdev pool)", err: err}
	}
	if err := dpdkHandshake(t, nd.Socket, pod, pair); err != nil {
		return capRun{step: "DPDK in the pod", err: fmt.Errorf("%w\n%s", err, d.out)}
	}
	if err := c.CNIDel("c2", "net1"); err != nil {
		return capRun{step: "CNI DEL (netdev pool)", err: err}
	}
	if s, err := c.Status(); err != nil || s.ConfigError != "" || len(s.StateErrors) > 0 {
		return capRun{step: "status at the end", err: fmt.Errorf("%+v %v\n%s", s, err, d.out)}
	}
	if l := problem(d.out.String()); l != "" {
		return capRun{step: "the daemon's log", err: errors.New(l)}
	}
	return capRun{log: d.out.String()}
}

// problem returns the first warning or error of a daemon's log, "" if
// none.
func problem(log string) string {
	for _, l := range strings.Split(log, "\n") {
		if !strings.Contains(l, `"level":"ERROR"`) && !strings.Contains(l, `"level":"WARN"`) {
			continue
		}
		if !initNetnsReadable() && strings.Contains(l, "initial netns /proc/1/ns/net: permission denied") {
			continue // also as full root here
		}
		return l
	}
	return ""
}

// initNetnsReadable says whether this process (the test's, full root)
// may open the initial network namespace through pid 1. In some sandboxes
// not even root may.
func initNetnsReadable() bool {
	_, err := os.Stat("/proc/1/ns/net")
	return err == nil
}

// dpdkHandshake does DPDK's handshake on socket for the pod's net1 and
// checks that its own socket there receives what pair's xb sends.
func dpdkHandshake(t *testing.T, socket string, pod ns.NetNS, pair *testnet.Pair) error {
	rcv, err := tryDPDKClient(t, socket, pod, "net1", 0)
	if err != nil {
		return err
	}
	return rcv.Expect(sendFrames(t, pair, 100)[0], time.Now().Add(5*time.Second))
}
