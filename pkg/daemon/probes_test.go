package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/testing/syncbuf"
	"github.com/xdpq/xdpq/internal/testing/testbin"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/client"
	"golang.org/x/sys/unix"
)

// standaloneOpts are a standalone daemon's options on pair p, everything
// under dir.
func standaloneOpts(t *testing.T, p *testnet.Pair, dir, pins, config string) Options {
	t.Helper()
	cfg := filepath.Join(dir, "config.yaml")
	if _, err := os.Stat(cfg); os.IsNotExist(err) {
		os.WriteFile(cfg, []byte(config), 0o644)
	}
	return Options{ConfigPath: cfg, NetNS: p.NSPath(), PinDir: filepath.Join(pins, "xdpq"), StateDir: filepath.Join(dir, "state"),
		AllocDir: filepath.Join(dir, "alloc"), Standalone: true, APISocket: filepath.Join(dir, "api.sock"), CollectPeriod: time.Hour}
}

// TestAPISocketUnusable: a daemon that cannot serve its API at the path
// it was given exits at once with an error that names the path, and
// removes nothing that is there. (Before, it ran on without an API and
// said nothing until SIGTERM; an empty directory there was deleted.)
func TestAPISocketUnusable(t *testing.T) {
	p := testnet.NewPair(t, 2)
	pins := testPins(t)
	bin := t.TempDir()
	testbin.Build(t, filepath.Join(bin, "deviceplugin"), "github.com/xdpq/xdpq/cmd/deviceplugin")
	for name, setup := range map[string]func(path string){
		"a file":              func(path string) { os.WriteFile(path, []byte("keep me"), 0o644) },
		"an empty directory":  func(path string) { os.Mkdir(path, 0o755) },
		"a full directory":    func(path string) { os.Mkdir(path, 0o755); os.WriteFile(filepath.Join(path, "x"), nil, 0o644) },
		"a file as parent":    func(path string) { os.WriteFile(filepath.Dir(path), nil, 0o644) },
		"a path too long":     func(string) {},
		"a live socket there": nil, // below
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			o := standaloneOpts(t, p, dir, pins, "pools: [{name: demo, steering: software, devices: {netdevs: ['xa#0-1']}}]\n")
			switch name {
			case "a file as parent":
				o.APISocket = filepath.Join(dir, "parent", "api.sock")
			case "a path too long":
				o.APISocket = filepath.Join(dir, strings.Repeat("x", 120), "api.sock")
			case "a live socket there":
				other, err := api.Listen(o.APISocket)
				if err != nil {
					t.Fatal(err)
				}
				defer other.Close()
			}
			if setup != nil {
				setup(o.APISocket)
			}
			before, _ := os.Lstat(o.APISocket)
			cmd := exec.Command(filepath.Join(bin, "deviceplugin"), "--standalone", "--config", o.ConfigPath, "--netns", o.NetNS,
				"--pin-dir", o.PinDir, "--state-dir", o.StateDir, "--alloc-dir", o.AllocDir, "--api-socket", o.APISocket, "--metrics-addr", "")
			done := make(chan error, 1)
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(out.String(), o.APISocket) {
					t.Errorf("exit %v, output %q: want exit 1 naming %s", err, out.String(), o.APISocket)
				}
			case <-time.After(30 * time.Second):
				cmd.Process.Kill()
				t.Fatalf("the daemon runs on without its API:\n%s", out.String())
			}
			if after, _ := os.Lstat(o.APISocket); (before == nil) != (after == nil) || (before != nil && !os.SameFile(before, after)) {
				t.Errorf("what was at the socket path changed: %v -> %v", before, after)
			}
		})
	}
}

// TestSecondDaemon: a second daemon on the same state directory is
// refused with the first one's pid; one on another state directory but
// the same API socket is refused too; the first keeps its API.
func TestSecondDaemon(t *testing.T) {
	p := testnet.NewPair(t, 2)
	dir := t.TempDir()
	o := standaloneOpts(t, p, dir, testPins(t), "pools: [{name: demo, steering: software, devices: {netdevs: ['xa#0-1']}}]\n")
	runDaemon(t, o)
	if _, err := New(o); err == nil || !strings.Contains(err.Error(), "another xdpq daemon (pid ") {
		t.Errorf("a second daemon on the state directory: %v", err)
	}
	o2 := o
	o2.StateDir = filepath.Join(dir, "state2")
	if _, err := New(o2); err == nil || !strings.Contains(err.Error(), o.APISocket) {
		t.Errorf("a second daemon on the API socket: %v", err)
	}
	if _, err := api.NewClient(o.APISocket).Status(); err != nil {
		t.Errorf("the first daemon lost its API: %v", err)
	}
}

// TestSecondDaemonOnPins: a second daemon with state and an API of its
// own but the first one's pin directory (and so its netdevs' maps) is
// refused before it touches a pin, naming the holder; the first one's
// pod keeps its flow and its frames. (Before, the second adopted the
// first's program and removed the pod's flow: flow map 1 -> 0.)
func TestSecondDaemonOnPins(t *testing.T) {
	pair := testnet.NewPair(t, 4)
	dir := t.TempDir()
	pins := testPins(t)
	cfg := "pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-1']}}]\n"
	d, _ := runDaemon(t, standaloneOpts(t, pair, dir, pins, cfg))
	a := allocWithFlow(t, d, pair, "upf")
	pod := connectPod(t, a.Socket)

	o2 := standaloneOpts(t, pair, t.TempDir(), pins, cfg)
	_, err := New(o2)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("another xdpq daemon (pid %d: ", os.Getpid())) ||
		!strings.Contains(err.Error(), o2.PinDir) {
		t.Errorf("a second daemon on the pin directory: %v", err)
	}
	if n := netdevOf(t, d, "xa"); n.Flows != 1 {
		t.Errorf("the first daemon's netdev: %+v; want its flow", n)
	}
	pod.expect(t, pair, "after the second daemon was refused")
}

// TestSecondDaemonOnNetdev: a second daemon with every directory of
// its own (state, API, pins, allocations) but the first one's netdev
// does not manage it: its status names the first one's process, and the
// first one's pod keeps its flow and its frames. Given the first one's
// allocation directory, a daemon is refused before it removes anything
// there. Once the first stops, the second takes the netdev at its next
// reconcile. (Before, the second took the first's program back without
// pins and removed the pod's flow as stale: the pod received nothing,
// and given the allocation directory the second removed its socket.)
func TestSecondDaemonOnNetdev(t *testing.T) {
	pair := testnet.NewPair(t, 4)
	cfg := "pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-1']}}]\n"
	o1 := standaloneOpts(t, pair, t.TempDir(), testPins(t), cfg)
	d, stop := runDaemon(t, o1)
	a := allocWithFlow(t, d, pair, "upf")
	pod := connectPod(t, a.Socket)

	o3 := standaloneOpts(t, pair, t.TempDir(), testPins(t), cfg)
	o3.AllocDir = o1.AllocDir
	if _, err := New(o3); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("another xdpq daemon (pid %d: ", os.Getpid())) ||
		!strings.Contains(err.Error(), "allocation directory "+o1.AllocDir) {
		t.Errorf("a daemon on the first one's allocation directory: %v", err)
	}
	if _, err := os.Stat(a.Socket); err != nil {
		t.Errorf("the first daemon's allocation socket: %v", err)
	}

	o2 := standaloneOpts(t, pair, t.TempDir(), testPins(t), cfg)
	o2.Resync = 100 * time.Millisecond
	d2, _ := runDaemon(t, o2)
	st, err := d2.core.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("another xdpq daemon manages the netdev (pid %d: ", os.Getpid())
	if !strings.Contains(st.ConfigError, want) {
		t.Errorf("the second daemon's status says %q; want %q", st.ConfigError, want)
	}
	if n := netdevOf(t, d, "xa"); n.Flows != 1 || n.State != "Filter" {
		t.Errorf("the first daemon's netdev: %+v; want its flow, filtering", n)
	}
	pod.expect(t, pair, "with a second daemon on the netdev")

	// The first goes (its pod with it): the second takes the netdev.
	pod.lease.Close()
	stop()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st, err := d2.core.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(st.ConfigError, "another xdpq daemon") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the first daemon stopped, the second still says %q", st.ConfigError)
		}
	}
	if _, err := d2.local.Alloc(context.Background(), api.AllocRequest{Pool: "upf", Count: 2}); err != nil {
		t.Errorf("an allocation of the second daemon once the first stopped: %v", err)
	}
}

// TestFlowsPutBack: a pod's flow deleted from the filter's flow map
// behind the daemon's back (bpftool map delete, or a daemon of another
// install that took it for stale) is put back at the daemon's next
// reconcile, and the pod receives again. (Before, status still counted
// the flow, and the pod received nothing until a restart.)
func TestFlowsPutBack(t *testing.T) {
	pair := testnet.NewPair(t, 4)
	o := standaloneOpts(t, pair, t.TempDir(), testPins(t), "pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-1']}}]\n")
	o.Resync = 100 * time.Millisecond
	d, _ := runDaemon(t, o)
	a := allocWithFlow(t, d, pair, "upf")
	pod := connectPod(t, a.Socket)
	pod.expect(t, pair, "before")

	prog, err := d.core.agent.(*agent.Agent).Program("xa")
	if err != nil {
		t.Fatal(err)
	}
	have, err := prog.Flows()
	if err != nil || len(have) == 0 {
		t.Fatalf("the flow map: %v, %v", have, err)
	}
	for f := range have {
		if err := prog.DeleteFlow(f); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		now, err := prog.Flows()
		if err != nil {
			t.Fatal(err)
		}
		if maps.Equal(now, have) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the flow map is %v, want %v put back", now, have)
		}
	}
	pod.expect(t, pair, "after its flow was put back")
}

// TestBrokenRecord: the daemon stops; its allocation's record is cut in
// half (or emptied, or replaced by garbage). On restart nothing is
// removed: the pod's flow stays and its traffic keeps arriving, the
// record is reported in status, the pool refuses new allocations saying
// what to do, another pool works; repaired and reloaded, the allocation
// is back. (Before, the flows were removed and the allocation dropped,
// and the next allocation got its queues and the old pod's traffic.)
func TestBrokenRecord(t *testing.T) {
	for name, damage := range map[string]func([]byte) []byte{
		"cut in half": func(b []byte) []byte { return b[:len(b)/2] },
		"emptied":     func([]byte) []byte { return nil },
		"garbage":     func([]byte) []byte { return []byte("\x7fELF garbage") },
	} {
		t.Run(name, func(t *testing.T) {
			p := testnet.NewPair(t, 4)
			dir := t.TempDir()
			o := standaloneOpts(t, p, dir, testPins(t), "pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-1']}},"+
				" {name: dns, steering: software, devices: {netdevs: ['xa#2-3']}}]\n")
			d, stop := runDaemon(t, o)
			ctx := context.Background()
			a, err := d.local.Alloc(ctx, api.AllocRequest{Pool: "upf", Count: 2, UID: 0})
			if err != nil {
				t.Fatal(err)
			}
			flow := api.CNIFlow{Protocol: "udp", Dst: netip.PrefixFrom(p.PodAddr, 32), DstPort: 5000}
			if _, err := d.local.CNIAdd(ctx, api.CNIAddRequest{ContainerID: "c1", IfName: "net1", Allocation: a.ID, Flows: []api.CNIFlow{flow}, Addresses: []netip.Addr{flow.Dst.Addr()}}); err != nil {
				t.Fatal(err)
			}
			lease, err := client.Connect(a.Socket, client.Options{Ring: 256, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer lease.Close()
			recv := make([]*traffic.Receiver, len(lease.Sockets))
			for i, s := range lease.Sockets {
				if recv[i], err = traffic.NewReceiver(s, lease.RXFrames(i)); err != nil {
					t.Fatal(err)
				}
			}
			expect := func(when string) {
				t.Helper()
				sent := sendFrames(t, p, 20)
				for i, q := range lease.Queues {
					if err := recv[i].Expect(sent[q], time.Now().Add(5*time.Second)); err != nil {
						t.Fatalf("%s: queue %d: %v", when, q, err)
					}
				}
			}
			expect("before")

			stop()
			record := filepath.Join(o.StateDir, "allocations", a.ID+".json")
			good, err := os.ReadFile(record)
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(record, damage(good), 0o600)
			d, _ = runDaemon(t, o)
			expect("after the restart")

			s, _ := d.core.Status(ctx)
			if len(s.StateErrors) != 1 || !strings.Contains(s.StateErrors[0], record) {
				t.Errorf("state errors %q", s.StateErrors)
			}
			// The pod's flow, owner unknown: one filter map entry per queue.
			if s.Netdevs[0].UnknownFlows != 2 {
				t.Errorf("%d unknown flows on xa, want the pod's flow on its 2 queues (%d known)", s.Netdevs[0].UnknownFlows, s.Netdevs[0].Flows)
			}
			_, err = d.local.Alloc(ctx, api.AllocRequest{Pool: "upf", Count: 1})
			if !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "repair the file or remove it") {
				t.Errorf("alloc from the pool of the broken record: %v", err)
			}
			if _, err := d.local.Alloc(ctx, api.AllocRequest{Pool: "dns", Count: 1}); err != nil {
				t.Errorf("alloc from another pool: %v", err)
			}
			if got, _ := os.ReadFile(record); string(got) != string(damage(good)) {
				t.Error("the broken record was changed")
			}

			os.WriteFile(record, good, 0o600)
			if err := d.Reload(ctx); err != nil {
				t.Fatal(err)
			}
			s, _ = d.core.Status(ctx)
			l, err := d.core.Allocations(ctx, "")
			if err != nil || len(s.StateErrors) != 0 || s.Allocations != 2 || len(l.Allocations) != 2 || s.Netdevs[0].Flows != 1 || s.Netdevs[0].UnknownFlows != 0 {
				t.Errorf("after the repair: state errors %q, %d allocations (%d listed, %v), xa %+v", s.StateErrors, s.Allocations, len(l.Allocations), err, s.Netdevs[0])
			}
			if _, err := d.local.CNICheck(ctx, api.AttachmentRef{ContainerID: "c1", IfName: "net1"}); err != nil {
				t.Errorf("check after the repair: %v", err)
			}
			expect("after the repair")
		})
	}
	// The operator removes the broken record instead (its allocation is
	// gone) and reloads: its flows, left in place until then, go, and
	// its pool gives out the queues again.
	t.Run("removed", func(t *testing.T) {
		p := testnet.NewPair(t, 4)
		dir := t.TempDir()
		o := standaloneOpts(t, p, dir, testPins(t), "pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-1']}}]\n")
		d, stop := runDaemon(t, o)
		ctx := context.Background()
		a := allocWithFlow(t, d, p, "upf")
		stop()
		record := filepath.Join(o.StateDir, "allocations", a.ID+".json")
		os.WriteFile(record, []byte("{"), 0o600)
		d, _ = runDaemon(t, o)
		if s, _ := d.core.Status(ctx); s.Netdevs[0].UnknownFlows == 0 {
			t.Fatalf("the broken record's flows were not kept: %+v", s.Netdevs[0])
		}
		os.Remove(record)
		if err := d.Reload(ctx); err != nil {
			t.Fatal(err)
		}
		if s, _ := d.core.Status(ctx); s.Netdevs[0].UnknownFlows != 0 || s.Netdevs[0].Flows != 0 || len(s.StateErrors) != 0 {
			t.Errorf("after the record's removal and a reload: %+v, state errors %v", s.Netdevs[0], s.StateErrors)
		}
		if _, err := d.local.Alloc(ctx, api.AllocRequest{Pool: "upf", Count: 2}); err != nil {
			t.Errorf("the pool after the record's removal: %v", err)
		}
	})
}

// TestReadyFollowsLinks: once the daemon is ready, and so once its local
// API answers, its agent follows the link notifications of the NICs'
// namespace: the netlink socket it holds for them is open. (Run used to
// make it ready while the agent's event loop was still starting:
// TestModel counted a fresh daemon's descriptors then, without that
// socket and its namespace handle, and found the two "left" after a
// sequence.)
func TestReadyFollowsLinks(t *testing.T) {
	p := testnet.NewPair(t, 2)
	o := standaloneOpts(t, p, t.TempDir(), testPins(t), "pools: []\n")
	for i := range 10 { // the old order lost the race often, not always
		_, stop := runDaemon(t, o)
		l, err := p.LinkListeners()
		stop()
		if err != nil {
			t.Fatal(err)
		}
		if len(l) != 1 {
			t.Fatalf("start %d: ready with %d sockets following the links of the NICs' namespace %v, want the agent's one", i, len(l), l)
		}
	}
}

// TestPartFails: when a part of the daemon fails (here its API listener
// is closed under it), Run stops the others and returns that part's
// error, named; the daemon does not run on without its API. (Before, Run
// waited for the caller's context, and the error appeared only then.)
func TestPartFails(t *testing.T) {
	p := testnet.NewPair(t, 2)
	o := standaloneOpts(t, p, t.TempDir(), testPins(t), "pools: [{name: demo, steering: software, devices: {netdevs: ['xa#0-1']}}]\n")
	o.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	d, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Run(context.Background()) }()
	<-d.Ready()
	d.apiLn.Close()
	select {
	case err := <-done:
		if err == nil || !strings.HasPrefix(err.Error(), "local api: ") {
			t.Errorf("Run returned %v, want the local api's error", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the daemon runs on without its API")
	}
}

// TestReloadKeepsHeldQueues: a reload that takes a live allocation's
// queues out of the config (a range the netdev lacks, the pool removed)
// leaves the pod's netdev managed, its flow steered and its traffic
// arriving; fixing the config changes nothing for the pod either.
func TestReloadKeepsHeldQueues(t *testing.T) {
	p := testnet.NewPair(t, 4)
	dir := t.TempDir()
	good := "pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-1']}}]\n"
	o := standaloneOpts(t, p, dir, testPins(t), good)
	d, _ := runDaemon(t, o)
	ctx := context.Background()
	a := allocWithFlow(t, d, p, "upf")
	pd := connectPod(t, a.Socket)
	pd.expect(t, p, "before")
	for _, c := range []struct{ name, config string }{
		{"a range xa lacks", "pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-7']}}]\n"},
		{"the pool removed", "pools: []\n"},
		{"the config fixed", good},
	} {
		os.WriteFile(o.ConfigPath, []byte(c.config), 0o644)
		if err := d.Reload(ctx); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		pd.expect(t, p, c.name)
		if _, err := d.local.CNICheck(ctx, api.AttachmentRef{ContainerID: "c1", IfName: "net1"}); err != nil {
			t.Errorf("%s: check: %v", c.name, err)
		}
	}
}

// TestFDLimit: a daemon whose descriptor limit is below what its pools
// may need (2 per device and 5120) raises it as far as the hard limit
// allows, and says in status when that is not enough. (Before, it ran
// with whatever limit it was given, and a flood of connections reached
// it.) This machine's root lacks CAP_SYS_RESOURCE: the hard limit cannot
// be raised here, neither by the daemon nor back by the test, so the
// case of a hard limit too low runs the daemon as a process of its own
// under prlimit.
func TestFDLimit(t *testing.T) {
	p := testnet.NewPair(t, 4)
	const config = "pools: [{name: a, devices: {netdevs: ['xa#0-3', 'xb#0-3']}}]\n"
	const need = 5120 + 2*8
	t.Run("raised", func(t *testing.T) {
		var orig unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &orig); err != nil {
			t.Fatal(err)
		}
		if orig.Max < need {
			t.Fatalf("this test needs a hard descriptor limit of %d, not %d", need, orig.Max)
		}
		t.Cleanup(func() { unix.Setrlimit(unix.RLIMIT_NOFILE, &orig) })
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: 1050, Max: orig.Max}); err != nil {
			t.Fatal(err)
		}
		d, stop := runDaemon(t, standaloneOpts(t, p, t.TempDir(), testPins(t), config))
		defer stop()
		var rl unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
			t.Fatal(err)
		}
		if rl.Cur != need || rl.Max != orig.Max {
			t.Errorf("descriptor limit %+v, want %d (hard %d)", rl, need, orig.Max)
		}
		if s, _ := d.core.Status(context.Background()); s.ConfigError != "" {
			t.Errorf("status says %q", s.ConfigError)
		}
	})
	t.Run("hard limit too low", func(t *testing.T) {
		bin := t.TempDir()
		testbin.Build(t, filepath.Join(bin, "deviceplugin"), "github.com/xdpq/xdpq/cmd/deviceplugin")
		o := standaloneOpts(t, p, t.TempDir(), testPins(t), config)
		cmd := exec.Command("prlimit", "--nofile=1050:5000", "--", filepath.Join(bin, "deviceplugin"), "--standalone", "--config", o.ConfigPath,
			"--netns", o.NetNS, "--pin-dir", o.PinDir, "--state-dir", o.StateDir, "--alloc-dir", o.AllocDir, "--api-socket", o.APISocket)
		var out syncbuf.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() }()
		want := "descriptor limit 5000 is below the 5136 that 8 devices may need"
		waitStatus(t, o.APISocket, func(s *api.Status) bool { return strings.Contains(s.ConfigError, want) })
		if !strings.Contains(out.String(), "descriptor limit below the pools' need") {
			t.Errorf("the log does not say so:\n%s", out.String())
		}
	})
}
