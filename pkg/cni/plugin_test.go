package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/xdpq/xdpq/pkg/api"
)

// The plugin's decisions against a fake daemon: the local API served on
// a socket of the test's, over a Backend that records what the plugin
// asked and answers as the case has it. They need no root: the pod's
// netns is the test's own, and host-local keeps its leases in a
// directory of the test's. The tests with a whole daemon on veth
// (cni_test.go, chain_test.go) show the same verbs steering flows.

// fakeDaemon is the daemon's local API as the plugin meets it.
type fakeDaemon struct {
	socket string

	mu       sync.Mutex
	calls    []string            // "add c1/net1", "del c1/net1", ...
	adds     []api.CNIAddRequest // every ADD's request
	gcValid  [][]string          // every GC's valid list
	addErr   error               // ADD's answer, if not an attachment
	checkErr error               // CHECK's answer, if not the attachment
	delErr   error
	att      *api.Attachment // what ADD made; CHECK reports it
	mode     string          // the pool's; "" a queue pool
}

func startFakeDaemon(t *testing.T) *fakeDaemon {
	t.Helper()
	f := &fakeDaemon{socket: filepath.Join(t.TempDir(), "api.sock")}
	ln, err := api.Listen(f.socket)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- api.Serve(ctx, ln, api.NewHandler(f, log), log) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the fake daemon's API: %v", err)
		}
	})
	return f
}

func (f *fakeDaemon) record(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

// took returns the calls since the last took.
func (f *fakeDaemon) took() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

func (f *fakeDaemon) Status(context.Context) (*api.Status, error) {
	return nil, errors.New("the fake daemon has no status")
}

func (f *fakeDaemon) Allocations(context.Context, string) (*api.AllocationList, error) {
	return nil, errors.New("the fake daemon has no allocations")
}

func (f *fakeDaemon) Alloc(context.Context, api.AllocRequest) (*api.Allocation, error) {
	return nil, errors.New("the fake daemon allocates nothing")
}

func (f *fakeDaemon) Free(context.Context, string) error {
	return errors.New("the fake daemon frees nothing")
}

func (f *fakeDaemon) CNIAdd(_ context.Context, req api.CNIAddRequest) (*api.Attachment, error) {
	f.record("add %s/%s", req.ContainerID, req.IfName)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.adds = append(f.adds, req)
	if f.addErr != nil {
		return nil, f.addErr
	}
	f.att = &api.Attachment{CNIAddRequest: req, AllocationID: "demo-1", Netdev: "xa", Queues: []uint32{0, 1}, Mode: api.ModeQueue}
	if f.mode == api.ModeNetdev {
		f.att.Mode, f.att.Mac = api.ModeNetdev, "02:00:00:00:00:09"
	}
	return f.att, nil
}

func (f *fakeDaemon) CNIDel(_ context.Context, ref api.AttachmentRef) error {
	f.record("del %s/%s", ref.ContainerID, ref.IfName)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.delErr != nil {
		return f.delErr
	}
	f.att = nil
	return nil
}

func (f *fakeDaemon) CNICheck(_ context.Context, ref api.AttachmentRef) (*api.Attachment, error) {
	f.record("check %s/%s", ref.ContainerID, ref.IfName)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.checkErr != nil {
		return nil, f.checkErr
	}
	if f.att == nil {
		return nil, fmt.Errorf("no attachment %s/%s: %w", ref.ContainerID, ref.IfName, api.ErrNotFound)
	}
	return f.att, nil
}

func (f *fakeDaemon) CNIGC(_ context.Context, req api.GCRequest) ([]string, error) {
	f.record("gc")
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gcValid = append(f.gcValid, slices.Clone(req.Valid))
	return nil, nil
}

// podNetns is a network namespace an unprivileged test may name as the
// pod's: its own.
const podNetns = "/proc/self/ns/net"

// hostLocal builds host-local into a directory on PATH (testutils runs a
// verb with CNI_PATH set to PATH, as a runtime finds IPAM), and returns
// where its leases go.
func hostLocal(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	build(t, bin, map[string]string{"host-local": "github.com/containernetworking/plugins/plugins/ipam/host-local"})
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	return filepath.Join(t.TempDir(), "leases")
}

// ipamConf is a configuration with host-local IPAM keeping its leases in
// data, and a flow to the IPAM address.
func ipamConf(socket, data string) []byte {
	return fmt.Appendf(nil, `{"cniVersion":"1.1.0","name":"upf","type":"xdpq","daemonSocket":%q,
		"ipam":{"type":"host-local","subnet":"10.77.0.0/24","dataDir":%q},
		"flows":[{"protocol":"udp","destinationPort":"2152"}]}`, socket, data)
}

// TestAddTellsDaemon: ADD gives the daemon what finds the pod's
// allocation and what it steers: the attachment (container, interface),
// the pod from CNI_ARGS, Multus's resource and device, the netns and
// MTU, the IPAM address as the pod's address and as the flow's
// destination; not chained. The result is IPAM's.
func TestAddTellsDaemon(t *testing.T) {
	f := startFakeDaemon(t)
	data := hostLocal(t)
	p := Plugin{CacheDir: filepath.Join(t.TempDir(), "cache")}
	conf := fmt.Appendf(nil, `{"cniVersion":"1.1.0","name":"upf","type":"xdpq","daemonSocket":%q,
		"resourceName":"xdpq.io/upf","deviceID":"xa-q1","mtu":9000,
		"ipam":{"type":"host-local","subnet":"10.77.0.0/24","dataDir":%q},
		"flows":[{"protocol":"udp","destinationPort":"2152"},{"protocol":"tcp","destination":"10.78.0.5","destinationPort":"80-81"}]}`,
		f.socket, data)
	args := &skel.CmdArgs{ContainerID: "c1", Netns: podNetns, IfName: "net1",
		Args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=pod1;K8S_POD_UID=uid-1;XDPQ_ALLOCATION=demo-1", StdinData: conf}
	r, _, err := testutils.CmdAddWithArgs(args, func() error { return p.Add(args) })
	if err != nil {
		t.Fatal(err)
	}
	res, err := current.NewResultFromResult(r)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.IPs) != 1 || res.IPs[0].Address.String() != "10.77.0.2/24" {
		t.Fatalf("result IPs %v, want host-local's 10.77.0.2/24", res.IPs)
	}
	if got := f.took(); !slices.Equal(got, []string{"add c1/net1"}) {
		t.Fatalf("the daemon was asked %v", got)
	}
	ip := netip.MustParseAddr("10.77.0.2")
	want := api.CNIAddRequest{ContainerID: "c1", IfName: "net1", Allocation: "demo-1", Resource: "xdpq.io/upf", DeviceID: "xa-q1",
		PodUID: "uid-1", PodNamespace: "ns1", PodName: "pod1", Netns: podNetns, MTU: 9000, Addresses: []netip.Addr{ip},
		Flows: []api.CNIFlow{
			{Protocol: "udp", Dst: netip.PrefixFrom(ip, 32), DstPort: 2152},
			{Protocol: "tcp", Dst: netip.MustParsePrefix("10.78.0.5/32"), DstPort: 80},
			{Protocol: "tcp", Dst: netip.MustParsePrefix("10.78.0.5/32"), DstPort: 81},
		}}
	got, _ := json.Marshal(f.adds[0])
	if w, _ := json.Marshal(want); string(got) != string(w) {
		t.Errorf("the daemon was asked\n%s\nwant\n%s", got, w)
	}
	if cached, err := os.ReadFile(p.cachePath(args)); err != nil || string(cached) != string(conf) {
		t.Errorf("the cache for DEL: %q, %v; want the configuration", cached, err)
	}
}

// TestAddRefusedUndone: an ADD the daemon refuses fails with the
// plugin's daemon code and the daemon's reason, and leaves nothing for
// anyone to collect: host-local's lease is released and the cache file
// removed.
func TestAddRefusedUndone(t *testing.T) {
	f := startFakeDaemon(t)
	data := hostLocal(t)
	p := Plugin{CacheDir: filepath.Join(t.TempDir(), "cache")}
	f.addErr = fmt.Errorf("no allocation %q: %w", "demo-nope", api.ErrNotFound)
	args := &skel.CmdArgs{ContainerID: "c1", Netns: podNetns, IfName: "net1",
		Args: "XDPQ_ALLOCATION=demo-nope", StdinData: ipamConf(f.socket, data)}
	_, _, err := testutils.CmdAddWithArgs(args, func() error { return p.Add(args) })
	var ce *types.Error
	if !errors.As(err, &ce) || ce.Code != ErrDaemon || !strings.Contains(ce.Details, `no allocation "demo-nope"`) {
		t.Fatalf("ADD refused by the daemon: %v; want code %d with its reason", err, ErrDaemon)
	}
	if l := ipamLeases(t, data); len(l) != 0 {
		t.Errorf("a refused ADD kept its IPAM leases %v", l)
	}
	if _, err := os.Stat(p.cachePath(args)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused ADD left its cache file: %v", err)
	}
}

// TestAddNetnsNotANamespace: an ADD whose CNI_NETNS is no network
// namespace (a path that does not exist, a regular file) is refused
// with CNI's code 4 naming the path, before IPAM or the daemon: no
// lease, no call, no cache. (Before, a missing path was accepted and its
// attachment never collected.)
func TestAddNetnsNotANamespace(t *testing.T) {
	f := startFakeDaemon(t)
	data := hostLocal(t)
	p := Plugin{CacheDir: filepath.Join(t.TempDir(), "cache")}
	file := filepath.Join(t.TempDir(), "not-a-netns")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, netns := range []string{"/var/run/netns/xdpq-test-no-such-pod", file} {
		args := &skel.CmdArgs{ContainerID: "c1", Netns: netns, IfName: "net1",
			Args: "XDPQ_ALLOCATION=demo-1", StdinData: ipamConf(f.socket, data)}
		_, _, err := testutils.CmdAddWithArgs(args, func() error { return p.Add(args) })
		var ce *types.Error
		if !errors.As(err, &ce) || ce.Code != types.ErrInvalidEnvironmentVariables || !strings.Contains(ce.Msg, netns) {
			t.Errorf("ADD in %s: %v; want code 4 naming it", netns, err)
		}
		if got := f.took(); len(got) != 0 {
			t.Errorf("ADD in %s asked the daemon %v", netns, got)
		}
		if _, err := os.Stat(p.cachePath(args)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("ADD in %s left a cache: %v", netns, err)
		}
		if entries, _ := os.ReadDir(filepath.Join(data, "upf")); len(entries) != 0 {
			t.Errorf("ADD in %s ran IPAM: %v", netns, entries)
		}
	}
}

// TestAddRetriedKeepsCache: a runtime's retry of an ADD that succeeded
// (same container and interface) fails at host-local, which refuses a
// second lease for them; the first ADD's cache of its configuration,
// which DEL needs, stays as it was, and DEL then undoes the first ADD
// from it: the daemon is told, its lease and the cache go. (Before, the
// failed retry removed the cache.)
func TestAddRetriedKeepsCache(t *testing.T) {
	f := startFakeDaemon(t)
	data := hostLocal(t)
	p := Plugin{CacheDir: filepath.Join(t.TempDir(), "cache")}
	conf := ipamConf(f.socket, data)
	args := &skel.CmdArgs{ContainerID: "c1", Netns: podNetns, IfName: "net1", Args: "XDPQ_ALLOCATION=demo-1", StdinData: conf}
	if _, _, err := testutils.CmdAddWithArgs(args, func() error { return p.Add(args) }); err != nil {
		t.Fatal(err)
	}
	cache := p.cachePath(args)
	first, err := os.ReadFile(cache)
	if err != nil {
		t.Fatalf("the first ADD's cache: %v", err)
	}
	retry := *args
	retry.StdinData = []byte(strings.Replace(string(conf), `"name":"upf"`, `"name":"upf", "mtu": 0`, 1))
	_, _, err = testutils.CmdAddWithArgs(&retry, func() error { return p.Add(&retry) })
	var ce *types.Error
	if !errors.As(err, &ce) || ce.Code != ErrIPAM {
		t.Fatalf("the retried ADD: %v; want host-local's refusal", err)
	}
	if now, err := os.ReadFile(cache); err != nil || string(now) != string(first) {
		t.Fatalf("the cache after the retry failed: %q, %v; want the first ADD's %q", now, err, first)
	}
	// DEL as a runtime that lost the configuration sends it: without
	// IPAM; the cache has it.
	del := *args
	del.StdinData = fmt.Appendf(nil, `{"cniVersion":"1.1.0","name":"upf","type":"xdpq","daemonSocket":%q}`, f.socket)
	if err := testutils.CmdDelWithArgs(&del, func() error { return p.Del(&del) }); err != nil {
		t.Fatal(err)
	}
	if got := f.took(); !slices.Equal(got, []string{"add c1/net1", "del c1/net1"}) {
		t.Errorf("the daemon was asked %v, want the first ADD and DEL", got)
	}
	if l := ipamLeases(t, data); len(l) != 0 {
		t.Errorf("leases %v after DEL, want none", l)
	}
	if _, err := os.Stat(cache); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the cache after DEL: %v", err)
	}
}

// chainConf is a configuration chained after a primary plugin that gave
// the pod addr: no IPAM of its own, prevResult its result.
func chainConf(t *testing.T, socket, addr, extra string) []byte {
	t.Helper()
	prev := &current.Result{CNIVersion: "1.1.0",
		Interfaces: []*current.Interface{{Name: "eth0", Mac: "02:00:00:00:00:01", Sandbox: podNetns}},
		IPs:        []*current.IPConfig{{Interface: current.Int(0), Address: *mustIPNet(t, addr)}}}
	b, err := json.Marshal(prev)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Appendf(nil, `{"cniVersion":"1.1.0","name":"upf","type":"xdpq","daemonSocket":%q,
		"flows":[{"protocol":"udp","destinationPort":"2152"}],"prevResult":%s%s}`, socket, b, extra)
}

// TestAddInChain: chained after the node's primary plugin, ADD takes the
// pod's address from prevResult (no IPAM of its own; one configured is
// refused before the daemon is asked), tells the daemon it is chained,
// and passes prevResult on as it is. A pod that holds no xdpq device
// (the daemon says ErrNoDevices: every pod on the node goes through the
// chain) passes through: prevResult, no error, no cache left behind; any
// other refusal fails the ADD.
func TestAddInChain(t *testing.T) {
	for _, tc := range []struct {
		name    string
		extra   string // more of the configuration
		addErr  error
		asked   bool   // the daemon was asked
		code    uint   // the ADD's error code; 0: it passes prevResult on
		cached  bool   // a cache file for DEL is left
		details string // in the error's details
	}{
		{name: "pod with devices", asked: true, cached: true},
		{name: "pod without devices", addErr: api.ErrNoDevices, asked: true},
		{name: "refused", addErr: fmt.Errorf("flow to 10.77.0.9: %w", api.ErrConflict), asked: true, code: ErrDaemon, details: "10.77.0.9"},
		{name: "ipam in a chain", extra: `,"ipam":{"type":"host-local","subnet":"10.77.0.0/24"}`, code: ErrInvalidField,
			details: "leave out ipam"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := startFakeDaemon(t)
			f.addErr = tc.addErr
			p := Plugin{CacheDir: filepath.Join(t.TempDir(), "cache")}
			args := &skel.CmdArgs{ContainerID: "c1", Netns: podNetns, IfName: "eth0", Args: "K8S_POD_UID=uid-1",
				StdinData: chainConf(t, f.socket, "10.244.1.7/24", tc.extra)}
			r, out, err := testutils.CmdAddWithArgs(args, func() error { return p.Add(args) })
			var ce *types.Error
			switch {
			case tc.code == 0 && err != nil:
				t.Fatalf("ADD: %v", err)
			case tc.code != 0 && (!errors.As(err, &ce) || ce.Code != tc.code || !strings.Contains(ce.Details, tc.details)):
				t.Fatalf("ADD: %v; want code %d saying %q", err, tc.code, tc.details)
			}
			if asked := len(f.took()) > 0; asked != tc.asked {
				t.Fatalf("the daemon asked: %v, want %v", asked, tc.asked)
			}
			if tc.asked {
				req := f.adds[0]
				ip := netip.MustParseAddr("10.244.1.7")
				if !req.Chained || !slices.Equal(req.Addresses, []netip.Addr{ip}) ||
					len(req.Flows) != 1 || req.Flows[0].Dst != netip.PrefixFrom(ip, 32) {
					t.Errorf("the daemon was asked %+v; want chained, prevResult's address, the flow to it", req)
				}
			}
			if tc.code == 0 {
				res, err := current.NewResultFromResult(r)
				if err != nil {
					t.Fatalf("%v\n%s", err, out)
				}
				if len(res.Interfaces) != 1 || res.Interfaces[0].Name != "eth0" || len(res.IPs) != 1 || res.IPs[0].Address.String() != "10.244.1.7/24" {
					t.Errorf("result %s; want prevResult's interface and address", out)
				}
			}
			_, err = os.Stat(p.cachePath(args))
			if cached := err == nil; cached != tc.cached {
				t.Errorf("cache file left: %v, want %v (stat: %v)", cached, tc.cached, err)
			}
		})
	}
}

// TestCheck: CHECK needs ADD's result (prevResult); the flows the
// configuration and prevResult's address give must be the ones the
// daemon steers for the attachment; an attachment the daemon does not
// have fails, except in a chain for a pod ADD passed through (no cache
// file: it holds no xdpq device).
func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name     string
		addr     string // prevResult's; "" for no prevResult
		steered  string // the address the daemon's attachment steers to; "": none
		cache    bool   // ADD kept a cache file
		fails    string // in the error; "" when CHECK passes
		notAsked bool   // refused before the daemon is asked
	}{
		{name: "steered", addr: "10.244.1.7/24", steered: "10.244.1.7", cache: true},
		{name: "other address", addr: "10.244.1.8/24", steered: "10.244.1.7", cache: true, fails: "flows differ"},
		{name: "no prevResult", steered: "10.244.1.7", cache: true, fails: "prevResult", notAsked: true},
		{name: "attachment gone", addr: "10.244.1.7/24", cache: true, fails: "no attachment"},
		{name: "passed through", addr: "10.244.1.7/24"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := startFakeDaemon(t)
			p := Plugin{CacheDir: filepath.Join(t.TempDir(), "cache")}
			conf := fmt.Appendf(nil, `{"cniVersion":"1.1.0","name":"upf","type":"xdpq","daemonSocket":%q,
				"flows":[{"protocol":"udp","destinationPort":"2152"}]}`, f.socket)
			if tc.addr != "" {
				conf = chainConf(t, f.socket, tc.addr, "")
			}
			args := &skel.CmdArgs{ContainerID: "c1", Netns: podNetns, IfName: "eth0", StdinData: conf}
			if tc.steered != "" {
				ip := netip.MustParseAddr(tc.steered)
				f.att = &api.Attachment{CNIAddRequest: api.CNIAddRequest{ContainerID: "c1", IfName: "eth0",
					Flows: []api.CNIFlow{{Protocol: "udp", Dst: netip.PrefixFrom(ip, 32), DstPort: 2152}}}, Mode: api.ModeQueue}
			}
			if tc.cache {
				mkdir(t, p.CacheDir)
				if err := os.WriteFile(p.cachePath(args), conf, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			err := testutils.CmdCheckWithArgs(args, func() error { return p.Check(args) })
			switch {
			case tc.fails == "" && err != nil:
				t.Errorf("CHECK: %v", err)
			case tc.fails != "" && (err == nil || !strings.Contains(err.Error(), tc.fails)):
				t.Errorf("CHECK: %v; want it to fail saying %q", err, tc.fails)
			}
			if asked := len(f.took()) > 0; asked == tc.notAsked {
				t.Errorf("the daemon asked: %v", asked)
			}
		})
	}
}

// TestDelAnswered: DEL works from the configuration ADD cached (the
// runtime's may lack IPAM), tells the daemon, releases the IPAM lease
// and removes the cache, and is idempotent; a daemon that answers with
// an error fails DEL and keeps the lease and the cache for the runtime's
// retry.
func TestDelAnswered(t *testing.T) {
	for _, tc := range []struct {
		name   string
		delErr error
	}{
		{name: "done"},
		{name: "daemon fails", delErr: errors.New("ledger: disk full")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := startFakeDaemon(t)
			data := hostLocal(t)
			p := Plugin{CacheDir: filepath.Join(t.TempDir(), "cache")}
			args := &skel.CmdArgs{ContainerID: "c1", Netns: podNetns, IfName: "net1", Args: "XDPQ_ALLOCATION=demo-1",
				StdinData: ipamConf(f.socket, data)}
			if _, _, err := testutils.CmdAddWithArgs(args, func() error { return p.Add(args) }); err != nil {
				t.Fatal(err)
			}
			f.took()
			f.delErr = tc.delErr
			del := *args
			del.StdinData = fmt.Appendf(nil, `{"cniVersion":"1.1.0","name":"upf","type":"xdpq","daemonSocket":%q}`, f.socket)
			err := testutils.CmdDelWithArgs(&del, func() error { return p.Del(&del) })
			_, cacheErr := os.Stat(p.cachePath(args))
			leases := ipamLeases(t, data)
			if got := f.took(); !slices.Equal(got, []string{"del c1/net1"}) {
				t.Errorf("the daemon was asked %v", got)
			}
			if tc.delErr != nil {
				var ce *types.Error
				if !errors.As(err, &ce) || ce.Code != ErrDaemon || !strings.Contains(ce.Details, "disk full") {
					t.Fatalf("DEL: %v; want the daemon's error", err)
				}
				if len(leases) != 1 || cacheErr != nil {
					t.Errorf("leases %v, cache stat %v; want both kept for the retry", leases, cacheErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(leases) != 0 || !errors.Is(cacheErr, os.ErrNotExist) {
				t.Errorf("leases %v, cache stat %v after DEL; want neither", leases, cacheErr)
			}
			if err := testutils.CmdDelWithArgs(&del, func() error { return p.Del(&del) }); err != nil {
				t.Errorf("DEL again: %v", err)
			}
		})
	}
}

// TestGC: GC without cni.dev/valid-attachments collects nothing (it
// neither asks the daemon nor has host-local release every lease); with
// one, the daemon gets the list as "containerID/ifName" and host-local
// releases the leases of the attachments not in it.
func TestGC(t *testing.T) {
	f := startFakeDaemon(t)
	data := hostLocal(t)
	p := Plugin{CacheDir: filepath.Join(t.TempDir(), "cache")}
	conf := ipamConf(f.socket, data)
	for _, id := range []string{"keep", "drop"} {
		args := &skel.CmdArgs{ContainerID: id, Netns: podNetns, IfName: "net1", Args: "XDPQ_ALLOCATION=demo-1", StdinData: conf}
		if _, _, err := testutils.CmdAddWithArgs(args, func() error { return p.Add(args) }); err != nil {
			t.Fatal(err)
		}
	}
	f.took()
	// As a runtime runs GC: CNI_PATH says where host-local is.
	t.Setenv("CNI_PATH", os.Getenv("PATH"))
	if err := p.GC(&skel.CmdArgs{StdinData: conf}); err != nil {
		t.Fatal(err)
	}
	if got, l := f.took(), ipamLeases(t, data); len(got) != 0 || len(l) != 2 {
		t.Fatalf("GC without a list: asked the daemon %v, leases %v left; want nothing collected", got, l)
	}
	list := strings.Replace(string(conf), `"name":"upf"`, `"name":"upf","cni.dev/valid-attachments":[{"containerID":"keep","ifname":"net1"}]`, 1)
	if err := p.GC(&skel.CmdArgs{StdinData: []byte(list)}); err != nil {
		t.Fatal(err)
	}
	if len(f.gcValid) != 1 || !slices.Equal(f.gcValid[0], []string{"keep/net1"}) {
		t.Errorf("the daemon's GC lists %v, want [[keep/net1]]", f.gcValid)
	}
	if l := ipamLeases(t, data); len(l) != 1 {
		t.Errorf("leases %v after GC, want keep's alone", l)
	}
}

// mustIPNet parses an address with its prefix length, as CNI results
// carry it.
func mustIPNet(t *testing.T, cidr string) *net.IPNet {
	t.Helper()
	ip, n, err := net.ParseCIDR(cidr)
	if err != nil {
		t.Fatal(err)
	}
	n.IP = ip
	return n
}

// TestNetdevAddUndone: in a netdev-mode pool the daemon moves the netdev
// into the pod and the plugin puts IPAM's addresses on it there. When
// that fails (here the interface is not in the namespace: unprivileged,
// entering it fails already), the ADD is undone whole: the daemon is
// told DEL (the netdev back to the node), host-local's lease is
// released, no cache stays, and the error says what failed.
func TestNetdevAddUndone(t *testing.T) {
	f := startFakeDaemon(t)
	f.mode = api.ModeNetdev
	data := hostLocal(t)
	p := Plugin{CacheDir: filepath.Join(t.TempDir(), "cache")}
	args := &skel.CmdArgs{ContainerID: "c1", Netns: podNetns, IfName: "xdpqtest0", Args: "XDPQ_ALLOCATION=vf-1",
		StdinData: ipamConf(f.socket, data)}
	_, _, err := testutils.CmdAddWithArgs(args, func() error { return p.Add(args) })
	var ce *types.Error
	if !errors.As(err, &ce) || ce.Code != ErrIPAM || ce.Msg != "configure xdpqtest0" {
		t.Fatalf("ADD: %v; want the configuration's failure (code %d)", err, ErrIPAM)
	}
	if got := f.took(); !slices.Equal(got, []string{"add c1/xdpqtest0", "del c1/xdpqtest0"}) {
		t.Errorf("the daemon was asked %v; want the ADD undone", got)
	}
	if l := ipamLeases(t, data); len(l) != 0 {
		t.Errorf("leases %v after the undone ADD", l)
	}
	if _, err := os.Stat(p.cachePath(args)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the undone ADD left its cache: %v", err)
	}
}

// TestCheckNetdevInterface: CHECK of a netdev-mode pool's attachment
// looks at the netdev in the pod only once prevResult agrees with the
// daemon: it must name the interface in a sandbox, with the MAC the
// daemon moved in; else CHECK fails saying which, without entering the
// pod's namespace.
func TestCheckNetdevInterface(t *testing.T) {
	for _, c := range []struct {
		name  string
		iface *current.Interface // prevResult's
		fails string
	}{
		{name: "no interface in prevResult", fails: "prevResult has no interface net1 in a sandbox"},
		{name: "not in a sandbox", iface: &current.Interface{Name: "net1", Mac: "02:00:00:00:00:09"},
			fails: "prevResult has no interface net1 in a sandbox"},
		{name: "another MAC", iface: &current.Interface{Name: "net1", Mac: "02:00:00:00:00:01", Sandbox: podNetns},
			fails: "prevResult gives MAC 02:00:00:00:00:01, the netdev has 02:00:00:00:00:09"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := startFakeDaemon(t)
			p := Plugin{CacheDir: filepath.Join(t.TempDir(), "cache")}
			ip := netip.MustParseAddr("10.77.0.2")
			f.att = &api.Attachment{CNIAddRequest: api.CNIAddRequest{ContainerID: "c1", IfName: "net1",
				Flows: []api.CNIFlow{{Protocol: "udp", Dst: netip.PrefixFrom(ip, 32), DstPort: 2152}}}, Mode: api.ModeNetdev, Mac: "02:00:00:00:00:09"}
			prev := &current.Result{CNIVersion: "1.1.0", IPs: []*current.IPConfig{{Address: *mustIPNet(t, "10.77.0.2/24")}}}
			if c.iface != nil {
				prev.Interfaces = []*current.Interface{c.iface}
				prev.IPs[0].Interface = current.Int(0)
			}
			b, err := json.Marshal(prev)
			if err != nil {
				t.Fatal(err)
			}
			args := &skel.CmdArgs{ContainerID: "c1", Netns: podNetns, IfName: "net1", StdinData: fmt.Appendf(nil,
				`{"cniVersion":"1.1.0","name":"upf","type":"xdpq","daemonSocket":%q,"flows":[{"protocol":"udp","destinationPort":"2152"}],"prevResult":%s}`,
				f.socket, b)}
			err = testutils.CmdCheckWithArgs(args, func() error { return p.Check(args) })
			var ce *types.Error
			if !errors.As(err, &ce) || ce.Code != ErrDaemon || !strings.Contains(ce.Details, c.fails) {
				t.Fatalf("CHECK: %v; want it to fail saying %q", err, c.fails)
			}
		})
	}
}
