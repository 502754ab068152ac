package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/daemon"
	"github.com/xdpq/xdpq/pkg/xdp"
)

func TestMain(m *testing.M) { os.Exit(testnet.MainWithLeakCheck(m)) }

// testPlugin is the plugin the tests' verbs call; startNodeWith gives it
// a cache directory of the test's own.
var testPlugin Plugin

func CmdAdd(args *skel.CmdArgs) error    { return testPlugin.Add(args) }
func CmdDel(args *skel.CmdArgs) error    { return testPlugin.Del(args) }
func CmdCheck(args *skel.CmdArgs) error  { return testPlugin.Check(args) }
func CmdGC(args *skel.CmdArgs) error     { return testPlugin.GC(args) }
func CmdStatus(args *skel.CmdArgs) error { return testPlugin.Status(args) }

// node runs a standalone daemon in a netns with a software-steered pool
// of xa's queues 0 and 1, builds host-local IPAM, and allocates the pool.
type node struct {
	pair   *testnet.Pair
	d      *daemon.Daemon
	bin    string // host-local
	socket string
	alloc  string
	broker string // the allocation's broker socket
	data   string // host-local's leases
	// restart stops the daemon and starts it again on the same
	// directories, running between the two (if not nil).
	restart func(between func())
}

func startNode(t testing.TB) *node { return startNodeFor(t, 0) }

// startNodeFor is startNode with the allocation owned by uid. The pool
// grants flows to 10.88.0.0/24 and 10.78.0.5 beside the pod's own
// addresses.
func startNodeFor(t testing.TB, uid uint32) *node {
	t.Helper()
	return startNodeWith(t, uid, "pools: [{name: demo, steering: software, devices: {netdevs: ['xa#0-1']}, sharedDestinations: [10.88.0.0/24, 10.78.0.5]}]\n", "demo", 2)
}

// startNodeWith is startNode with the daemon's config, and an allocation
// of count devices of pool owned by uid.
func startNodeWith(t testing.TB, uid uint32, config, pool string, count int) *node {
	t.Helper()
	testnet.RequireRoot(t)
	p := testnet.NewPair(t, 4)
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	build(t, bin, map[string]string{"host-local": "github.com/containernetworking/plugins/plugins/ipam/host-local"})
	// testutils runs the plugin with CNI_PATH set to PATH.
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	testPlugin = Plugin{CacheDir: filepath.Join(dir, "cache")}
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	xdp.MountBPFFS(xdp.DefaultBPFFS)
	pins, _ := os.MkdirTemp(xdp.DefaultBPFFS, "xdpq-test-")
	t.Cleanup(func() { os.RemoveAll(pins) })
	sock := filepath.Join(dir, "api.sock")
	// The pod (uid 65534) must reach its allocation's socket.
	allocDir, _ := os.MkdirTemp("", "xdpq-alloc-")
	if err := os.Chmod(allocDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(allocDir) })
	opts := daemon.Options{ConfigPath: cfg, NetNS: p.NSPath(), PinDir: filepath.Join(pins, "xdpq"),
		StateDir: filepath.Join(dir, "state"), AllocDir: allocDir, Standalone: true, APISocket: sock,
		CollectPeriod: 100 * time.Millisecond,
		Logger:        slog.New(slog.NewTextHandler(io.Discard, nil))}
	var stop func()
	start := func() *daemon.Daemon {
		d, err := daemon.New(opts)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		var once sync.Once
		stop = func() {
			once.Do(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("the daemon: %v", err)
				}
			})
		}
		select {
		case <-d.Ready():
		case err := <-done:
			stop = func() {}
			t.Fatalf("the daemon stopped: %v", err)
		}
		return d
	}
	d := start()
	t.Cleanup(func() { stop() })
	a, err := d.API().Alloc(context.Background(), api.AllocRequest{Pool: pool, Count: count, UID: uid})
	if err != nil {
		t.Fatal(err)
	}
	n := &node{pair: p, d: d, bin: bin, socket: sock, alloc: a.ID, broker: a.Socket, data: filepath.Join(dir, "ipam")}
	n.restart = func(between func()) {
		stop()
		if between != nil {
			between()
		}
		n.d = start()
	}
	return n
}

func (n *node) conf(ver string) []byte {
	return []byte(fmt.Sprintf(`{"cniVersion":%q,"name":"upf","type":"xdpq","daemonSocket":%q,
		"ipam":{"type":"host-local","subnet":"10.77.0.0/24","dataDir":%q},
		"flows":[{"protocol":"udp","destinationPort":"2152"},{"protocol":"tcp","destination":"10.78.0.5","destinationPort":"80-81"}]}`,
		ver, n.socket, n.data))
}

func (n *node) flows(t testing.TB) int {
	t.Helper()
	s, err := api.NewClient(n.socket).Status()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range s.Netdevs {
		if d.Netdev == "xa" {
			return d.Flows
		}
	}
	return -1
}

// TestVerbs runs ADD, CHECK, DEL (three times) for every spec version:
// the flows are steered to the allocation's queues with the IPAM address
// as destination, and DEL leaves no flow and no lease.
func TestVerbs(t *testing.T) {
	n := startNode(t)
	for _, ver := range []string{"0.4.0", "1.0.0", "1.1.0"} {
		args := &skel.CmdArgs{ContainerID: "ctr-" + ver, Netns: n.pair.NSPath(), IfName: "net1",
			Args: "IgnoreUnknown=1;XDPQ_ALLOCATION=" + n.alloc, StdinData: n.conf(ver)}
		r, _, err := testutils.CmdAddWithArgs(args, func() error { return CmdAdd(args) })
		if err != nil {
			t.Fatalf("%s add: %v", ver, err)
		}
		res, err := current.NewResultFromResult(r)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.IPs) != 1 || !strings.HasPrefix(res.IPs[0].Address.String(), "10.77.0.") {
			t.Fatalf("%s: result IPs %v", ver, res.IPs)
		}
		// udp to the IPAM address port 2152, tcp to 10.78.0.5 ports 80
		// and 81: three flows, each on both queues.
		if got := n.flows(t); got != 3 {
			t.Errorf("%s: %d flows steered, want 3", ver, got)
		}
		lease := filepath.Join(n.data, "upf", res.IPs[0].Address.IP.String())
		if _, err := os.Stat(lease); err != nil {
			t.Errorf("%s: no host-local lease: %v", ver, err)
		}
		check := withPrev(t, args, r)
		if err := testutils.CmdCheckWithArgs(check, func() error { return CmdCheck(check) }); err != nil {
			t.Errorf("%s check: %v", ver, err)
		}
		// A prevResult with another address: the flows it gives are not
		// the ones steered.
		other := *res
		other.IPs = []*current.IPConfig{{Address: net.IPNet{IP: net.IPv4(10, 77, 0, 200), Mask: net.CIDRMask(24, 32)}}}
		wrong := withPrev(t, args, &other)
		if err := testutils.CmdCheckWithArgs(wrong, func() error { return CmdCheck(wrong) }); err == nil || !strings.Contains(err.Error(), "flows differ") {
			t.Errorf("%s check with another address: %v", ver, err)
		}
		noPrev := *args
		if err := testutils.CmdCheckWithArgs(&noPrev, func() error { return CmdCheck(&noPrev) }); err == nil || !strings.Contains(err.Error(), "prevResult") {
			t.Errorf("%s check without prevResult: %v", ver, err)
		}
		for i := range 3 {
			if err := testutils.CmdDelWithArgs(args, func() error { return CmdDel(args) }); err != nil {
				t.Fatalf("%s del %d: %v", ver, i+1, err)
			}
		}
		if got := n.flows(t); got != 0 {
			t.Errorf("%s: %d flows after DEL", ver, got)
		}
		if _, err := os.Stat(lease); !os.IsNotExist(err) {
			t.Errorf("%s: lease left after DEL: %v", ver, err)
		}
		if err := testutils.CmdCheckWithArgs(check, func() error { return CmdCheck(check) }); err == nil {
			t.Errorf("%s: CHECK passed after DEL", ver)
		}
	}
	// DEL of an attachment the daemon never had, with the netns gone.
	args := &skel.CmdArgs{ContainerID: "never", Netns: "/var/run/netns/gone", IfName: "net1", StdinData: n.conf("1.1.0")}
	if err := testutils.CmdDelWithArgs(args, func() error { return CmdDel(args) }); err != nil {
		t.Errorf("del of nothing: %v", err)
	}
}

func TestAddRefused(t *testing.T) {
	n := startNode(t)
	args := &skel.CmdArgs{ContainerID: "c1", Netns: n.pair.NSPath(), IfName: "net1",
		Args: "XDPQ_ALLOCATION=demo-nope", StdinData: n.conf("1.0.0")}
	_, _, err := testutils.CmdAddWithArgs(args, func() error { return CmdAdd(args) })
	var ce *types.Error
	if !errors.As(err, &ce) || ce.Code != ErrDaemon || !strings.Contains(ce.Details, `no allocation "demo-nope"`) {
		t.Fatalf("add to a missing allocation: %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(n.data, "upf")); len(entries) > 2 { // last_reserved_ip and lock only
		t.Errorf("a refused ADD kept its IPAM lease: %v", entries)
	}

	// The same ADD twice is answered twice (a runtime's retry); an ADD
	// of an attached container and interface with other flows is refused
	// and leaves the first one's flows alone.
	add := func(flows string) error {
		a := &skel.CmdArgs{ContainerID: "c2", Netns: n.pair.NSPath(), IfName: "net1", Args: "XDPQ_ALLOCATION=" + n.alloc,
			StdinData: []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"upf","type":"xdpq","daemonSocket":%q,"flows":%s}`, n.socket, flows))}
		_, _, err := testutils.CmdAddWithArgs(a, func() error { return CmdAdd(a) })
		return err
	}
	first := `[{"protocol":"udp","destination":"10.88.0.1","destinationPort":"53"}]`
	for range 2 {
		if err := add(first); err != nil {
			t.Fatal(err)
		}
	}
	err = add(`[{"protocol":"udp","destination":"10.88.0.2","destinationPort":"53"}]`)
	if err == nil || !strings.Contains(err.Error(), "attached already") {
		t.Errorf("ADD over an attachment with other flows: %v", err)
	}
	if got := n.flows(t); got != 1 {
		t.Errorf("%d flows, want the first ADD's one", got)
	}
}

// TestGCAndStatus: GC removes what is not in the valid list, nothing
// without a list; STATUS reports an unreachable daemon with code 50.
func TestGCAndStatus(t *testing.T) {
	n := startNode(t)
	conf := func(extra string) string {
		return fmt.Sprintf(`{"cniVersion":"1.1.0","name":"upf","type":"xdpq","daemonSocket":%q,
			"ipam":{"type":"host-local","subnet":"10.77.0.0/24","dataDir":%q},
			"flows":[{"protocol":"udp","destinationPort":"53"}]%s}`, n.socket, n.data, extra)
	}
	for _, id := range []string{"keep", "drop"} {
		args := &skel.CmdArgs{ContainerID: id, Netns: n.pair.NSPath(), IfName: "net1",
			Args: "XDPQ_ALLOCATION=" + n.alloc, StdinData: []byte(conf(""))}
		if _, _, err := testutils.CmdAddWithArgs(args, func() error { return CmdAdd(args) }); err != nil {
			t.Fatal(err)
		}
	}
	gc := func(conf string) error {
		// As a runtime runs GC: CNI_PATH says where host-local is.
		t.Setenv("CNI_PATH", n.bin)
		return CmdGC(&skel.CmdArgs{StdinData: []byte(conf)})
	}
	if err := gc(conf("")); err != nil {
		t.Fatal(err)
	}
	if got, leases := n.flows(t), n.leases("upf"); got != 2 || len(leases) != 2 {
		t.Fatalf("GC without a list collected: %d flows, leases %v left", got, leases)
	}
	if err := gc(conf(`,"cni.dev/valid-attachments":[{"containerID":"keep","ifname":"net1"}]`)); err != nil {
		t.Fatal(err)
	}
	// The daemon dropped the flow and host-local (GC delegated) the lease.
	if got, leases := n.flows(t), n.leases("upf"); got != 1 || len(leases) != 1 {
		t.Fatalf("after GC: %d flows, leases %v; want 1 and 1", got, leases)
	}
	ok := &skel.CmdArgs{StdinData: []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"upf","type":"xdpq","daemonSocket":%q}`, n.socket))}
	if err := CmdStatus(ok); err != nil {
		t.Errorf("status: %v", err)
	}
	bad := &skel.CmdArgs{StdinData: []byte(`{"cniVersion":"1.1.0","name":"upf","type":"xdpq","daemonSocket":"/nonexistent.sock"}`)}
	var ce *types.Error
	if err := CmdStatus(bad); !errors.As(err, &ce) || ce.Code != types.ErrPluginNotAvailable {
		t.Errorf("status with no daemon: %v, want code 50", err)
	}
	if !strings.Contains(ce.Details, "API at /nonexistent.sock does not answer") || strings.Contains(ce.Details, "http://") {
		t.Errorf("status with no daemon says %q", ce.Details)
	}
}

// TestFreeEndsAttachments: when the daemon frees an allocation (xdpqctl
// free, or its collector when kubelet no longer assigns the devices),
// the attachments on it go too, so their flows cannot reach the queues'
// next holder; CHECK then fails and DEL still succeeds.
func TestFreeEndsAttachments(t *testing.T) {
	n := startNode(t)
	args := &skel.CmdArgs{ContainerID: "c1", Netns: n.pair.NSPath(), IfName: "net1",
		Args: "XDPQ_ALLOCATION=" + n.alloc, StdinData: n.conf("1.1.0")}
	r, _, err := testutils.CmdAddWithArgs(args, func() error { return CmdAdd(args) })
	if err != nil {
		t.Fatal(err)
	}
	if got := n.flows(t); got != 3 {
		t.Fatalf("%d flows after ADD", got)
	}
	if err := n.d.API().Free(context.Background(), n.alloc); err != nil {
		t.Fatal(err)
	}
	if got := n.flows(t); got != 0 {
		t.Errorf("%d flows left after the allocation was freed", got)
	}
	check := withPrev(t, args, r)
	err = testutils.CmdCheckWithArgs(check, func() error { return CmdCheck(check) })
	if err == nil || !strings.Contains(err.Error(), "no attachment") {
		t.Errorf("CHECK after free: %v", err)
	}
	if err := testutils.CmdDelWithArgs(args, func() error { return CmdDel(args) }); err != nil {
		t.Errorf("DEL after free: %v", err)
	}
}

// withPrev returns args with r as the configuration's prevResult, as a
// runtime sends CHECK.
func withPrev(t *testing.T, args *skel.CmdArgs, r types.Result) *skel.CmdArgs {
	t.Helper()
	var conf map[string]any
	if err := json.Unmarshal(args.StdinData, &conf); err != nil {
		t.Fatal(err)
	}
	conv, err := r.GetAsVersion(conf["cniVersion"].(string))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(conv)
	conf["prevResult"] = json.RawMessage(b)
	c := *args
	c.StdinData, _ = json.Marshal(conf)
	return &c
}

// TestAttachmentsSurviveRestart: a restarted daemon keeps the attachments
// it recorded with their flows installed (CHECK reads them back from the
// flow map), and removes the flows of one whose record is gone; DEL then
// works as before.
func TestAttachmentsSurviveRestart(t *testing.T) {
	n := startNode(t)
	var checks []*skel.CmdArgs
	for _, id := range []string{"kept", "forgotten"} {
		args := &skel.CmdArgs{ContainerID: id, Netns: n.pair.NSPath(), IfName: "net1",
			Args: "XDPQ_ALLOCATION=" + n.alloc, StdinData: n.conf("1.1.0")}
		if id == "forgotten" { // its own flow, not the IPAM address's
			args.StdinData = []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"upf","type":"xdpq","daemonSocket":%q,
				"flows":[{"protocol":"udp","destination":"10.88.0.1","destinationPort":"53"}]}`, n.socket))
		}
		r, _, err := testutils.CmdAddWithArgs(args, func() error { return CmdAdd(args) })
		if err != nil {
			t.Fatal(err)
		}
		checks = append(checks, withPrev(t, args, r))
	}
	if got := n.flows(t); got != 4 {
		t.Fatalf("%d flows, want 4", got)
	}
	n.restart(nil)
	if got := n.flows(t); got != 4 {
		t.Errorf("after a restart: %d flows, want 4", got)
	}
	for _, c := range checks {
		if err := testutils.CmdCheckWithArgs(c, func() error { return CmdCheck(c) }); err != nil {
			t.Errorf("check %s after a restart: %v", c.ContainerID, err)
		}
	}
	// While the daemon is down, the record of "forgotten" goes from its
	// allocation's.
	n.restart(func() {
		path := filepath.Join(filepath.Dir(n.data), "state", "allocations", n.alloc+".json")
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var rec map[string]json.RawMessage
		var atts []map[string]any
		if err := json.Unmarshal(b, &rec); err != nil || json.Unmarshal(rec["attachments"], &atts) != nil {
			t.Fatalf("%s: %v\n%s", path, err, b)
		}
		atts = slices.DeleteFunc(atts, func(a map[string]any) bool { return a["containerID"] == "forgotten" })
		rec["attachments"], _ = json.Marshal(atts)
		b, _ = json.Marshal(rec)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	})
	if got := n.flows(t); got != 3 {
		t.Errorf("after a restart without forgotten's record: %d flows, want 3", got)
	}
	if err := testutils.CmdCheckWithArgs(checks[0], func() error { return CmdCheck(checks[0]) }); err != nil {
		t.Errorf("check kept: %v", err)
	}
	del := &skel.CmdArgs{ContainerID: "kept", Netns: n.pair.NSPath(), IfName: "net1", StdinData: n.conf("1.1.0")}
	if err := testutils.CmdDelWithArgs(del, func() error { return CmdDel(del) }); err != nil {
		t.Fatal(err)
	}
	if got := n.flows(t); got != 0 {
		t.Errorf("%d flows after DEL", got)
	}
}

// TestStatusVersionSkew: STATUS of a daemon that speaks another API
// version (version 1's status lists allocations, version 2's counts
// them) says the plugin is not available and which versions disagree;
// a daemon of the plugin's version passes.
func TestStatusVersionSkew(t *testing.T) {
	for _, tt := range []struct {
		version int
		says    string
	}{
		{api.Version - 1, fmt.Sprintf("the daemon speaks API version %d, this plugin %d", api.Version-1, api.Version)},
		{api.Version + 1, fmt.Sprintf("the daemon speaks API version %d, this plugin %d", api.Version+1, api.Version)},
		{api.Version, ""},
	} {
		sock := filepath.Join(t.TempDir(), "api.sock")
		ln, err := api.Listen(sock)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- api.Serve(ctx, ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"api":%d}`, tt.version)
			}), nil)
		}()
		err = CmdStatus(&skel.CmdArgs{StdinData: []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"upf","type":"xdpq","daemonSocket":%q}`, sock))})
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		var ce *types.Error
		switch {
		case tt.says == "" && err != nil:
			t.Errorf("version %d: %v", tt.version, err)
		case tt.says != "" && (!errors.As(err, &ce) || ce.Code != types.ErrPluginNotAvailable || !strings.Contains(ce.Details, tt.says)):
			t.Errorf("version %d: %v, want code 50 saying %q", tt.version, err, tt.says)
		}
	}
}
