package daemon

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/xdpq/xdpq/internal/testing/kubelettest"
	"github.com/xdpq/xdpq/internal/testing/testbin"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/cni"
	"github.com/xdpq/xdpq/pkg/xdp"
)

// The scale benchmark's load: kubelet admits scaleAllocs pods one after
// the other (GetPreferredAllocation, then Allocate of one queue), at most
// scaleLive alive at once: from pod scaleLive+1 on, the oldest pod has
// ended first and kubelet may give its device again, which the daemon
// sees as a re-allocation. Then, scaleAddPasses times, the CNI plugin ADDs
// every live pod from scaleWorkers goroutines at once (one flow each),
// as fast as they go, while a status client (a process of its own, as
// xdpqctl is) asks back to back, and DELs them one at a time; then as
// many passes again with the client listing the allocations back to back
// instead; then as many with the ADDs paced at scalePacedRate a second
// and status asked every scalePacedPoll; then scalePluginPasses with the
// ADDs made by the plugin's binary, a process per ADD as a runtime runs
// it, flat out, and status asked back to back.
//
// Flat out, the ADDs take every CPU: the CNI clients of this binary one
// CPU (the plugin's processes both), the daemon the rest, so a status
// call waits for its turn on a CPU behind them, in the kernel's and in
// Go's scheduler, whatever the daemon does; through the plugin, the
// daemon is all but idle and status waits as long. Paced, the CPUs have
// room, and status shows what the daemon itself makes it wait: a lock
// held across an ADD's kernel calls would show there.
const (
	scaleNetdevs      = 64
	scaleQueues       = 64
	scaleAllocs       = 300
	scaleLive         = 200
	scaleWorkers      = 8
	scaleAddPasses    = 10                   // a pass gives ~25 status calls: with 3, a round's p99 was its slowest call
	scalePluginPasses = 4                    // passes of ADDs through the plugin's binary, ~200 status calls each
	scalePacedRate    = 1000                 // ADDs a second of the paced passes: a node's pod starts are some tens a second
	scalePacedPoll    = 5 * time.Millisecond // between status calls of the paced passes: containerd asks every few seconds
	scaleStatus       = 200                  // status calls, and list calls, of an idle daemon
	scaleRounds       = 3                    // per layout
)

// scaleBaselineEnv names a daemon binary (cmd/deviceplugin built from
// another tree) for BenchmarkScale64x64 to run beside this tree's.
const scaleBaselineEnv = "XDPQ_SCALE_BASELINE"

// scaleRSSGoal is the goal for the daemon's resident memory, in MiB.
const scaleRSSGoal = 40

// scaleLayout says where the daemon and the load generator (this test
// binary, the fake kubelet and the CNI clients, and the status client's
// process, started on the same CPUs) run.
type scaleLayout struct {
	name      string
	inProcess bool         // the daemon runs in this binary (for -cpuprofile)
	daemon    *unix.CPUSet // the daemon process's CPUs; nil: the test's
	daemonBin string       // the daemon's binary; "": the one built from this tree
	load      *unix.CPUSet // this binary's CPUs during the round; nil: unchanged
}

// scaleRound is what one round measured.
type scaleRound struct {
	firstList, healthy                     time.Duration
	preferred, allocate, statusIdle        []time.Duration
	listIdle                               []time.Duration // GET /v1/allocations of an idle daemon
	emptyRPC                               []time.Duration // GetDevicePluginOptions: the transport's share of a call
	statusLoaded, add, del                 []time.Duration // add, del: of the passes with the status client
	statusPaced, addPaced                  []time.Duration // status and ADD latency of the paced passes
	listLoaded                             []time.Duration // GET /v1/allocations while ADDs run
	statusPlugin, addPlugin                []time.Duration // status and ADD latency of the passes through the plugin's binary
	pluginPhase                            time.Duration   // wall time of those ADDs
	cpuAllocate, cpuStatus, cpuList        time.Duration   // daemon CPU time per pod admitted, per idle status, per idle list; 0 in process
	cpuAdd                                 time.Duration   // daemon CPU time per ADD of the passes with the status client; 0 in process
	rssMiB, hwmMiB, anonMiB, fileMiB       float64         // 0 in process
	updates                                int64           // ListAndWatch lists after the first healthy one
	reallocated                            int             // Allocates of a device an earlier pod held
	addPhase                               time.Duration   // wall time of those ADDs
	devicesAtFirstList, healthyAtFirstList int
	statusAllocations                      int
	errors                                 map[string]int // the daemon's log records of level ERROR, by message
	warnings                               int            // and of level WARN
}

// BenchmarkScale64x64 runs the daemon (cmd/deviceplugin, a process of its
// own, so that its RSS and CPU time are its alone) on 64 netdevs of 64
// queues each, one pool of all 4096 queues, with a fake kubelet, its
// state on a tmpfs as under /run on a node, and prints a table: the time
// from start to the first ListAndWatch list and to every device healthy,
// GetPreferredAllocation and Allocate latency, the latency of status
// (GET /v1/status) and of the allocations' list (GET /v1/allocations)
// idle and while CNI ADDs run in parallel through the API socket, CNI ADD and DEL
// latency, the daemon's CPU time per pod and per ADD, the errors it
// logged, and its RSS; each with its goal and ratio to it where the issue
// sets one. Nothing fails on a number; it fails when a call fails.
//
// The machine may have few, shared cores, so it runs two layouts
// interleaved, scaleRounds rounds each: "split" (the daemon alone on CPU
// 1, the load on CPU 0) and "shared" (both on every CPU, as on a node),
// and gives each number as the median of the rounds with their range;
// the reported metrics are the first layout's medians. Run it with
// -benchtime 1x.
func BenchmarkScale64x64(b *testing.B) {
	testnet.RequireRoot(b)
	bins := buildScaleBins(b)
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		b.Fatal(err)
	}
	layouts := []scaleLayout{{name: "shared: both on all CPUs", daemon: &all}}
	if all.IsSet(0) && all.IsSet(1) {
		var zero, one unix.CPUSet
		zero.Set(0)
		one.Set(1)
		layouts = append([]scaleLayout{{name: "split: daemon alone on CPU 1, load CPU 0", daemon: &one, load: &zero}}, layouts...)
	} else {
		b.Log("CPUs 0 and 1 are not both ours: only the shared layout runs")
	}
	// A daemon built from another tree runs beside this one's, each
	// layout's rounds interleaved, for a before and after in one run.
	if base := os.Getenv(scaleBaselineEnv); base != "" {
		var both []scaleLayout
		for _, l := range layouts {
			old := l
			old.name, old.daemonBin = l.name+", "+filepath.Base(base), base
			both = append(both, l, old)
		}
		layouts = both
	}
	load := loadAverage()
	results := make([][]scaleRound, len(layouts))
	for range b.N {
		// Interleaved, so that a busy spell of the machine falls on both.
		for r := range scaleRounds {
			for i, l := range layouts {
				b.Logf("round %d/%d, %s", r+1, scaleRounds, l.name)
				results[i] = append(results[i], runScaleRound(b, bins, l))
			}
		}
	}
	b.StopTimer()
	printScaleTable(load, layouts, results)
	first := results[0]
	b.ReportMetric(median(first, func(r scaleRound) float64 { return r.firstList.Seconds() }), "s-to-first-list")
	b.ReportMetric(median(first, func(r scaleRound) float64 { return us(pct(r.allocate, 50)) }), "alloc-p50-µs")
	b.ReportMetric(median(first, func(r scaleRound) float64 { return us(pct(r.allocate, 99)) }), "alloc-p99-µs")
	b.ReportMetric(median(first, func(r scaleRound) float64 { return us(pct(r.statusLoaded, 99)) }), "status-loaded-p99-µs")
	b.ReportMetric(median(first, func(r scaleRound) float64 { return us(pct(r.statusPaced, 99)) }), "status-paced-p99-µs")
	b.ReportMetric(median(first, func(r scaleRound) float64 { return us(pct(r.statusPlugin, 99)) }), "status-plugin-p99-µs")
	b.ReportMetric(median(first, func(r scaleRound) float64 { return us(pct(r.listLoaded, 99)) }), "list-loaded-p99-µs")
	b.ReportMetric(median(first, func(r scaleRound) float64 { return r.rssMiB }), "rss-MiB")
}

// BenchmarkScale64x64InProcess is BenchmarkScale64x64's load on a daemon
// run inside the test binary, one round, for profiles of the daemon's
// code (go test -cpuprofile, -mutexprofile); it reports no RSS or CPU
// time, which would be the load generator's too.
func BenchmarkScale64x64InProcess(b *testing.B) {
	testnet.RequireRoot(b)
	l := scaleLayout{name: "in process", inProcess: true}
	bins := buildScaleBins(b)
	bins.daemon = ""
	var rounds []scaleRound
	load := loadAverage()
	for range b.N {
		rounds = append(rounds, runScaleRound(b, bins, l))
	}
	b.StopTimer()
	printScaleTable(load, []scaleLayout{l}, [][]scaleRound{rounds})
}

// scaleBins are the binaries a round runs: the daemon (cmd/deviceplugin;
// "" in process) and the CNI plugin (cmd/cni).
type scaleBins struct{ daemon, cni string }

func buildScaleBins(b *testing.B) scaleBins {
	dir := b.TempDir()
	bins := scaleBins{daemon: filepath.Join(dir, "deviceplugin"), cni: filepath.Join(dir, "xdpq")}
	for bin, pkg := range map[string]string{bins.daemon: "./cmd/deviceplugin", bins.cni: "./cmd/cni"} {
		testbin.Build(b, bin, "github.com/xdpq/xdpq/"+strings.TrimPrefix(pkg, "./"))
	}
	return bins
}

// runScaleRound makes the netdevs, starts a daemon on them, runs the load
// and stops the daemon.
func runScaleRound(b *testing.B, bins scaleBins, l scaleLayout) scaleRound {
	var r scaleRound
	netns := scaleNetdevsNS(b)
	podNS, err := testutils.NewNS()
	if err != nil {
		b.Fatal(err)
	}
	defer func() { podNS.Close(); testutils.UnmountNS(podNS) }()
	dir, err := os.MkdirTemp(b.TempDir(), "round-")
	if err != nil {
		b.Fatal(err)
	}
	// The state and allocation directories are under /run on a node: a
	// tmpfs, where fsync costs nothing, and a short path (status answers
	// with every allocation's socket path).
	run, err := os.MkdirTemp("/run", "xdpq-bench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.Remove(run)
	if err := unix.Mount("tmpfs", run, "tmpfs", 0, "size=64m,mode=0755"); err != nil {
		b.Fatal(err)
	}
	defer unix.Unmount(run, unix.MNT_DETACH)
	var entries []string
	for i := range scaleNetdevs {
		entries = append(entries, fmt.Sprintf("'n%d#0-%d'", i, scaleQueues-1))
	}
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte("pools: [{name: big, steering: software, devices: {netdevs: ["+strings.Join(entries, ",")+"]}}]\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	plugins := filepath.Join(dir, "plugins")
	if err := os.MkdirAll(plugins, 0o755); err != nil {
		b.Fatal(err)
	}
	kubelet := kubelettest.Start(b, plugins)
	defer kubelet.Stop()
	if err := xdp.MountBPFFS(xdp.DefaultBPFFS); err != nil {
		b.Fatal(err)
	}
	pins, err := os.MkdirTemp(xdp.DefaultBPFFS, "xdpq-bench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(pins)
	sock := filepath.Join(dir, "api.sock")
	opts := Options{ConfigPath: cfg, NetNS: netns.Path(), PinDir: filepath.Join(pins, "xdpq"), StateDir: filepath.Join(run, "state"),
		AllocDir: filepath.Join(run, "alloc"), PluginDir: plugins, APISocket: sock, PodResourcesSocket: filepath.Join(dir, "no-kubelet.sock")}
	logPath := filepath.Join(dir, "daemon.log")
	logf, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	defer logf.Close()

	if l.load != nil {
		defer pinThreads(b, l.load)()
	}
	start := time.Now()
	d := startScaleDaemon(b, cmp.Or(l.daemonBin, bins.daemon), l, opts, logf)
	var stopOnce sync.Once
	stop := func() {
		stopOnce.Do(func() {
			if err := d.stop(); err != nil {
				log, _ := os.ReadFile(logPath)
				b.Errorf("daemon: %v\n%s", err, tail(string(log), 40))
			}
		})
	}
	defer stop()

	var reg *pluginapi.RegisterRequest
	select {
	case reg = <-kubelet.Registrations:
	case <-time.After(time.Minute):
		log, _ := os.ReadFile(logPath)
		b.Fatalf("no registration in a minute\n%s", tail(string(log), 40))
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(plugins, reg.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	c := pluginapi.NewDevicePluginClient(conn)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		b.Fatal(err)
	}
	list, err := stream.Recv()
	if err != nil {
		b.Fatal(err)
	}
	r.firstList = time.Since(start)
	r.devicesAtFirstList, r.healthyAtFirstList = len(list.Devices), healthyCount(list.Devices)
	// kubelet reads every list; so does this, in the background once every
	// device is healthy, counting the lists the load makes the daemon send.
	for n := healthyCount(list.Devices); n < scaleNetdevs*scaleQueues; n = healthyCount(list.Devices) {
		if list, err = stream.Recv(); err != nil {
			b.Fatalf("ListAndWatch: %v (%d of %d devices healthy)", err, n, scaleNetdevs*scaleQueues)
		}
	}
	r.healthy = time.Since(start)
	if len(list.Devices) != scaleNetdevs*scaleQueues {
		b.Fatalf("%d devices, want %d", len(list.Devices), scaleNetdevs*scaleQueues)
	}
	var updates atomic.Int64
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for {
			if _, err := stream.Recv(); err != nil {
				return
			}
			updates.Add(1)
		}
	}()
	defer func() { cancel(); <-drained }()

	// Pods come and go as kubelet admits them: it offers every free device
	// for its preferred allocation, and takes the one preferred.
	free := map[string]bool{}
	for _, dev := range list.Devices {
		free[dev.ID] = true
	}
	var live []string // the devices of live pods, oldest first
	given := map[string]bool{}
	cpu0 := d.cpu()
	for i := range scaleAllocs {
		if len(live) == scaleLive {
			free[live[0]] = true
			live = live[1:]
		}
		avail := make([]string, 0, len(free))
		for id := range free {
			avail = append(avail, id)
		}
		slices.Sort(avail)
		t0 := time.Now()
		pref, err := c.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
			{AvailableDeviceIDs: avail, AllocationSize: 1}}})
		r.preferred = append(r.preferred, time.Since(t0))
		if err != nil {
			b.Fatalf("pod %d: GetPreferredAllocation: %v", i, err)
		}
		if len(pref.ContainerResponses) != 1 || len(pref.ContainerResponses[0].DeviceIDs) != 1 {
			b.Fatalf("pod %d: GetPreferredAllocation answered %v", i, pref.ContainerResponses)
		}
		id := pref.ContainerResponses[0].DeviceIDs[0]
		if !free[id] {
			b.Fatalf("pod %d: preferred %s, which is not free", i, id)
		}
		t0 = time.Now()
		if _, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{id}}}}); err != nil {
			b.Fatalf("pod %d: Allocate %s: %v", i, id, err)
		}
		r.allocate = append(r.allocate, time.Since(t0))
		if given[id] {
			r.reallocated++
		}
		given[id] = true
		delete(free, id)
		live = append(live, id)
	}
	if cpu := d.cpu(); cpu > 0 {
		r.cpuAllocate = (cpu - cpu0) / scaleAllocs
	}
	for range scaleAllocs {
		t0 := time.Now()
		if _, err := c.GetDevicePluginOptions(ctx, &pluginapi.Empty{}); err != nil {
			b.Fatal(err)
		}
		r.emptyRPC = append(r.emptyRPC, time.Since(t0))
	}

	client := api.NewClient(sock)
	cpu0 = d.cpu()
	for range scaleStatus {
		t0 := time.Now()
		s, err := client.Status()
		r.statusIdle = append(r.statusIdle, time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
		if s.Allocations != scaleLive {
			b.Fatalf("status counts %d allocations, want %d", s.Allocations, scaleLive)
		}
	}
	if cpu := d.cpu(); cpu > 0 {
		r.cpuStatus = (cpu - cpu0) / scaleStatus
	}
	cpu0 = d.cpu()
	for range scaleStatus {
		t0 := time.Now()
		l, err := client.Allocations("")
		r.listIdle = append(r.listIdle, time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
		r.statusAllocations = len(l.Allocations)
	}
	if cpu := d.cpu(); cpu > 0 {
		r.cpuList = (cpu - cpu0) / scaleStatus
	}
	if r.statusAllocations != scaleLive {
		b.Fatalf("the list shows %d allocations, want %d", r.statusAllocations, scaleLive)
	}

	// scaleAddPasses passes of CNI ADDs of every live pod, with status
	// asked meanwhile, then as many with the allocations listed
	// meanwhile, then as many paced with status asked, then
	// scalePluginPasses through the plugin's binary with status asked;
	// each pass's pods are DELeted one at a time after it (through the
	// plugin after its passes). The ADD and DEL rows are of the first
	// passes.
	cpuAdd := time.Duration(0)
	// The plugin keeps what its DEL needs in the node's CNI cache
	// directory: a pass that fails before its DELs leaves it there.
	defer func() {
		for pass := 3 * scaleAddPasses; pass < 3*scaleAddPasses+scalePluginPasses; pass++ {
			for i := range live {
				os.Remove(filepath.Join(cni.DefaultCacheDir, scaleContainerID(pass, i)+"-net1.json"))
			}
		}
	}()
	poller := startScalePoller(b, sock)
	defer poller.close()
	for pass := range 3*scaleAddPasses + scalePluginPasses {
		listing := pass >= scaleAddPasses && pass < 2*scaleAddPasses
		paced := pass >= 2*scaleAddPasses && pass < 3*scaleAddPasses
		plugin := pass >= 3*scaleAddPasses
		first := !listing && !paced && !plugin
		add := func(req api.CNIAddRequest) error { return scaleCNIAdd(sock, req) }
		if plugin {
			add = func(req api.CNIAddRequest) error { return scalePluginAdd(bins.cni, sock, req) }
		}
		what, rate, every := "status", 0, time.Duration(0)
		if listing {
			what = "allocations"
		}
		if paced {
			rate, every = scalePacedRate, scalePacedPoll
		}
		cpu0 := d.cpu()
		ps, err := scaleAddPass(add, pass, live, reg.ResourceName, podNS.Path(), poller, what, every, rate)
		if cpu := d.cpu(); cpu > 0 && first {
			cpuAdd += cpu - cpu0
		}
		if err != nil {
			b.Fatal(err)
		}
		switch {
		case listing:
			r.listLoaded = append(r.listLoaded, ps.polls...)
		case paced:
			r.statusPaced = append(r.statusPaced, ps.polls...)
			r.addPaced = append(r.addPaced, ps.add...)
		case plugin:
			r.statusPlugin = append(r.statusPlugin, ps.polls...)
			r.addPlugin = append(r.addPlugin, ps.add...)
			r.pluginPhase += ps.wall
		default:
			r.add = append(r.add, ps.add...)
			r.statusLoaded = append(r.statusLoaded, ps.polls...)
			r.addPhase += ps.wall
		}
		s, err := client.Status()
		if err != nil {
			b.Fatal(err)
		}
		flows := 0
		for _, n := range s.Netdevs {
			flows += n.Flows
		}
		if flows != len(live) {
			b.Fatalf("status shows %d flows after %d ADDs", flows, len(live))
		}
		for i := range live {
			t0 := time.Now()
			del := client.CNIDel
			if plugin {
				del = func(containerID, ifName string) error { return scalePluginDel(bins.cni, sock, containerID, ifName) }
			}
			if err := del(scaleContainerID(pass, i), "net1"); err != nil {
				b.Fatal(err)
			}
			if first {
				r.del = append(r.del, time.Since(t0))
			}
		}
	}
	r.cpuAdd = cpuAdd / time.Duration(len(r.add))
	r.updates = updates.Load()
	r.rssMiB, r.hwmMiB, r.anonMiB, r.fileMiB = d.memory()
	cancel()
	<-drained
	stop()
	r.errors, r.warnings = scaleLogProblems(b, logPath)
	return r
}

// scaleLogProblems counts the daemon's log records of level ERROR, by
// message and error, and those of level WARN.
func scaleLogProblems(b *testing.B, path string) (errors map[string]int, warnings int) {
	data, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	allocID := regexp.MustCompile(`big-[0-9a-f]{12}`)
	errors = map[string]int{}
	for line := range strings.Lines(string(data)) {
		var rec struct{ Level, Msg, Err string }
		if json.Unmarshal([]byte(line), &rec) != nil {
			errors["not a JSON log record: "+strings.TrimSpace(line)]++
			continue
		}
		switch rec.Level {
		case "ERROR":
			// Allocation ids differ from record to record: one line for all.
			errors[rec.Msg+": "+allocID.ReplaceAllString(rec.Err, "big-…")]++
		case "WARN":
			warnings++
		}
	}
	return errors, warnings
}

// scaleNetdevsNS makes a network namespace with scaleNetdevs veth pairs
// of scaleQueues queues, n<i> and p<i>, up; it goes at the end of the
// benchmark.
func scaleNetdevsNS(b *testing.B) ns.NetNS {
	netns, err := testutils.NewNS()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { netns.Close(); testutils.UnmountNS(netns) })
	err = netns.Do(func(ns.NetNS) error {
		for i := range scaleNetdevs {
			v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("n%d", i), NumTxQueues: scaleQueues, NumRxQueues: scaleQueues},
				PeerName: fmt.Sprintf("p%d", i), PeerNumTxQueues: scaleQueues, PeerNumRxQueues: scaleQueues}
			if err := netlink.LinkAdd(v); err != nil {
				return err
			}
			for _, n := range []string{v.Name, v.PeerName} {
				l, err := netlink.LinkByName(n)
				if err == nil {
					err = netlink.LinkSetUp(l)
				}
				if err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return netns
}

// scalePass is what a pass of CNI ADDs measured.
type scalePass struct {
	add, polls []time.Duration
	wall       time.Duration
}

// scaleAddPass ADDs pod i (of pass) with device live[i] for every i with
// add, from scaleWorkers goroutines, while the poller calls what
// ("status", or "allocations": the allocations' list) every interval, or
// back to back. With a rate, the ADDs start at most rate a second; else
// as fast as the workers go.
func scaleAddPass(add func(api.CNIAddRequest) error, pass int, live []string, resource, netns string, poller *scalePoller, what string, every time.Duration, rate int) (scalePass, error) {
	var (
		mu    sync.Mutex
		ps    scalePass
		first error
	)
	fail := func(err error) {
		mu.Lock()
		first = cmp.Or(first, err)
		mu.Unlock()
	}
	failed := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return first != nil
	}
	jobs := make(chan int)
	if err := poller.start(what, every); err != nil {
		return ps, err
	}
	var workers sync.WaitGroup
	t0 := time.Now()
	for range scaleWorkers {
		workers.Go(func() {
			for i := range jobs {
				if failed() {
					continue
				}
				req := scaleAddRequest(pass, i, live[i], resource, netns)
				t0 := time.Now()
				err := add(req)
				lat := time.Since(t0)
				if err != nil {
					fail(fmt.Errorf("ADD %s: %w", req.ContainerID, err))
					continue
				}
				mu.Lock()
				ps.add = append(ps.add, lat)
				mu.Unlock()
			}
		})
	}
	var tick <-chan time.Time
	if rate > 0 {
		t := time.NewTicker(time.Second / time.Duration(rate))
		defer t.Stop()
		tick = t.C
	}
	for i := range live {
		if tick != nil {
			<-tick
		}
		jobs <- i
	}
	close(jobs)
	workers.Wait()
	ps.wall = time.Since(t0)
	var err error
	if ps.polls, err = poller.stop(); err != nil {
		fail(fmt.Errorf("poll %s: %w", what, err))
	}
	return ps, first
}

// scaleCNIAdd sends the CNI plugin's ADD request on a connection of its
// own and reads the answer, without net/http's client: for eight clients
// at once in this binary its goroutines and buffers per connection took
// the load's CPU whole (/proc/stat during a pass: 95 % and more), and a
// status call then waited for that CPU, not for the daemon. (The plugin
// is a process of its own per call, its cost not the daemon's either.)
func scaleCNIAdd(sock string, req api.CNIAddRequest) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(time.Minute)); err != nil { // a stalled daemon fails the bench
		return err
	}
	head := fmt.Sprintf("POST /v1/cni/add HTTP/1.1\r\nHost: xdpq\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n", len(body))
	if _, err := c.Write(append([]byte(head), body...)); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Status, answer)
	}
	var att api.Attachment
	if err := json.Unmarshal(answer, &att); err != nil || att.ContainerID != req.ContainerID {
		return fmt.Errorf("the answer is not the attachment of %s (%v): %s", req.ContainerID, err, answer)
	}
	return nil
}

// scalePluginAdd ADDs req through the CNI plugin's binary as a runtime
// does (containernetworking's invoke): a process per call, the network
// configuration a NAD with one flow to the pod's address would give on
// its stdin after the primary plugin (prevResult: the address), the pod
// in CNI_ARGS. It checks the plugin answered a result of the configuration's
// CNI version (an attachment of flows adds no interface to it).
func scalePluginAdd(plugin, sock string, req api.CNIAddRequest) error {
	f := req.Flows[0]
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"bench","type":"xdpq","resourceName":%q,"deviceID":%q,"daemonSocket":%q,`+
		`"prevResult":{"cniVersion":"1.1.0","ips":[{"address":%q}]},"flows":[{"protocol":%q,"destination":"ipam","destinationPort":"%d"}]}`,
		req.Resource, req.DeviceID, sock, f.Dst.String(), f.Protocol, f.DstPort)
	args := &invoke.Args{Command: "ADD", ContainerID: req.ContainerID, NetNS: req.Netns, IfName: req.IfName, Path: filepath.Dir(plugin),
		PluginArgsStr: fmt.Sprintf("K8S_POD_NAMESPACE=%s;K8S_POD_NAME=%s;K8S_POD_UID=%s;K8S_POD_INFRA_CONTAINER_ID=%s",
			req.PodNamespace, req.PodName, req.PodUID, req.ContainerID)}
	res, err := invoke.ExecPluginWithResult(context.Background(), plugin, []byte(conf), args, nil)
	if err != nil {
		return fmt.Errorf("plugin ADD %s: %w", req.ContainerID, err)
	}
	if res.Version() != "1.1.0" {
		return fmt.Errorf("plugin ADD %s: a result of version %s, want 1.1.0", req.ContainerID, res.Version())
	}
	return nil
}

// scalePluginDel DELs an attachment through the CNI plugin's binary, which
// removes the file its ADD kept for DEL.
func scalePluginDel(plugin, sock, containerID, ifName string) error {
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"bench","type":"xdpq","daemonSocket":%q}`, sock)
	args := &invoke.Args{Command: "DEL", ContainerID: containerID, IfName: ifName, Path: filepath.Dir(plugin)}
	if err := invoke.ExecPluginWithoutResult(context.Background(), plugin, []byte(conf), args, nil); err != nil {
		return fmt.Errorf("plugin DEL %s: %w", containerID, err)
	}
	return nil
}

func scaleContainerID(pass, i int) string { return fmt.Sprintf("%032x%032x", pass+1, i+1) }

// scaleAddRequest is the ADD the CNI plugin sends for pod i of a pass:
// Multus gives the device, the NAD one UDP flow to the pod's address.
func scaleAddRequest(pass, i int, dev, resource, netns string) api.CNIAddRequest {
	dst := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 100, byte(i >> 8), byte(i)}), 32)
	return api.CNIAddRequest{ContainerID: scaleContainerID(pass, i), IfName: "net1", Resource: resource, DeviceID: dev,
		PodUID: fmt.Sprintf("00000000-0000-0000-0000-%012d", i), PodNamespace: "bench", PodName: fmt.Sprintf("pod-%d", i), Netns: netns,
		Flows: []api.CNIFlow{{Protocol: "udp", Dst: dst, DstPort: 2152}}, Addresses: []netip.Addr{dst.Addr()}}
}

// Run with the argument scalePollerArg alone, and scalePollerEnv set to
// the API socket, this test binary is the status client of
// BenchmarkScale64x64 (see [runScalePoller]) instead of running tests.
const (
	scalePollerArg = "xdpq-scale-poller"
	scalePollerEnv = "XDPQ_SCALE_POLLER"
)

// scalePoller is the status client, in a process of its own as xdpqctl
// and the CNI plugin's STATUS are: a goroutine of this binary would wait
// in its scheduler behind the CNI clients' goroutines, which a user's
// client does not.
type scalePoller struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

// pollResult is what the poller measured between a start and a stop.
type pollResult struct {
	Latencies []time.Duration
	Err       string
}

// startScalePoller starts the poller on the CPUs of the calling thread.
func startScalePoller(b *testing.B, sock string) *scalePoller {
	cmd := exec.Command(os.Args[0], scalePollerArg)
	cmd.Env = append(os.Environ(), scalePollerEnv+"="+sock)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	p := &scalePoller{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	p.out.Buffer(nil, 1<<20)
	return p
}

// close ends the poller's process.
func (p *scalePoller) close() {
	p.in.Close()
	p.cmd.Wait()
}

// start has the poller call what ("status" or "allocations") until stop:
// a call every interval, or back to back.
func (p *scalePoller) start(what string, every time.Duration) error {
	_, err := fmt.Fprintln(p.in, what, every)
	return err
}

func (p *scalePoller) stop() ([]time.Duration, error) {
	if _, err := fmt.Fprintln(p.in, "stop"); err != nil {
		return nil, err
	}
	if !p.out.Scan() {
		return nil, fmt.Errorf("poller: no result: %v", p.out.Err())
	}
	var r pollResult
	if err := json.Unmarshal(p.out.Bytes(), &r); err != nil {
		return nil, fmt.Errorf("poller: %w", err)
	}
	if r.Err != "" {
		return r.Latencies, errors.New(r.Err)
	}
	return r.Latencies, nil
}

// runScalePoller is the poller's process: for each line on stdin naming
// what to call, it calls it back to back on sock until the next line,
// and writes a pollResult line.
func runScalePoller(sock string) int {
	client := api.NewClient(sock)
	in := bufio.NewScanner(os.Stdin)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var what, interval string
		if _, err := fmt.Sscan(in.Text(), &what, &interval); err != nil {
			fmt.Fprintf(os.Stderr, "poller: %q: %v\n", in.Text(), err)
			return 1
		}
		every, err := time.ParseDuration(interval)
		if err != nil {
			fmt.Fprintf(os.Stderr, "poller: %v\n", err)
			return 1
		}
		poll := func() error { _, err := client.Status(); return err }
		if what == "allocations" {
			poll = func() error { _, err := client.Allocations(""); return err }
		}
		var tick <-chan time.Time // nil: back to back
		stopTick := func() {}
		if every > 0 {
			t := time.NewTicker(every)
			tick, stopTick = t.C, t.Stop
		}
		stop := make(chan struct{})
		go func() {
			in.Scan()
			close(stop)
		}()
		var r pollResult
	polling:
		for {
			if tick != nil {
				select {
				case <-stop:
					break polling
				case <-tick:
				}
			}
			select {
			case <-stop:
				break polling
			default:
			}
			t0 := time.Now()
			err := poll()
			r.Latencies = append(r.Latencies, time.Since(t0))
			if err != nil {
				r.Err = err.Error()
				<-stop
				break polling
			}
		}
		stopTick()
		if err := out.Encode(r); err != nil {
			return 1
		}
	}
	return 0
}

// scaleDaemon is a running daemon, in its own process or in this one.
type scaleDaemon struct {
	pid  int // 0 in process
	stop func() error
}

// cpu is the daemon process's user and system time so far; 0 in process.
func (d scaleDaemon) cpu() time.Duration {
	if d.pid == 0 {
		return 0
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", d.pid))
	if err != nil {
		return 0
	}
	// Fields after the command's closing parenthesis: utime and stime are
	// the 12th and 13th, in clock ticks (100 a second on Linux).
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// memory is the daemon process's VmRSS, VmHWM, RssAnon and RssFile in
// MiB; 0 in process.
func (d scaleDaemon) memory() (rss, hwm, anon, file float64) {
	if d.pid == 0 {
		return 0, 0, 0, 0
	}
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.pid))
	for _, l := range strings.Split(string(status), "\n") {
		k, v, _ := strings.Cut(l, ":")
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[0], 64)
		switch k {
		case "VmRSS":
			rss = kb / 1024
		case "VmHWM":
			hwm = kb / 1024
		case "RssAnon":
			anon = kb / 1024
		case "RssFile":
			file = kb / 1024
		}
	}
	return rss, hwm, anon, file
}

// startScaleDaemon starts the daemon: bin with opts's flags on l.daemon's
// CPUs, or in this process.
func startScaleDaemon(b *testing.B, bin string, l scaleLayout, opts Options, logf *os.File) scaleDaemon {
	if l.inProcess {
		opts.Logger = slog.New(slog.NewJSONHandler(logf, nil))
		d, err := New(opts)
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		return scaleDaemon{stop: func() error { cancel(); return <-done }}
	}
	// cmd/deviceplugin has no flag for the PodResources socket: the
	// daemon finds no kubelet there, as opts's does not exist either.
	cmd := exec.Command(bin, "--config", opts.ConfigPath, "--netns", opts.NetNS, "--pin-dir", opts.PinDir, "--state-dir", opts.StateDir,
		"--alloc-dir", opts.AllocDir, "--plugin-dir", opts.PluginDir, "--registry-dir", "", "--api-socket", opts.APISocket, "--metrics-addr", "")
	cmd.Stderr = logf
	// The child inherits the CPUs of the thread that forks it.
	runtime.LockOSThread()
	var mine unix.CPUSet
	err := unix.SchedGetaffinity(0, &mine)
	if err == nil {
		err = unix.SchedSetaffinity(0, l.daemon)
	}
	if err == nil {
		err = cmd.Start()
		unix.SchedSetaffinity(0, &mine)
	}
	runtime.UnlockOSThread()
	if err != nil {
		b.Fatal(err)
	}
	return scaleDaemon{pid: cmd.Process.Pid, stop: func() error {
		cmd.Process.Signal(os.Interrupt)
		return cmd.Wait()
	}}
}

// pinThreads puts every thread of this process on cpus (threads made
// later inherit it) and returns what puts them back.
func pinThreads(b *testing.B, cpus *unix.CPUSet) (restore func()) {
	var was unix.CPUSet
	if err := unix.SchedGetaffinity(0, &was); err != nil {
		b.Fatal(err)
	}
	set := func(s *unix.CPUSet) error {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		for _, t := range tasks {
			tid, _ := strconv.Atoi(t.Name())
			// A thread may end meanwhile: ESRCH is fine.
			if err := unix.SchedSetaffinity(tid, s); err != nil && err != unix.ESRCH {
				return fmt.Errorf("thread %d: %w", tid, err)
			}
		}
		return nil
	}
	if err := set(cpus); err != nil {
		b.Fatal(err)
	}
	// As many Ps as CPUs, as Go sets at start: two threads of this
	// binary taking turns on one CPU by the kernel's time slices held
	// the CNI and status clients for milliseconds.
	procs := runtime.GOMAXPROCS(cpus.Count())
	return func() {
		runtime.GOMAXPROCS(procs)
		if err := set(&was); err != nil {
			b.Error(err)
		}
	}
}

func healthyCount(devs []*pluginapi.Device) int {
	n := 0
	for _, d := range devs {
		if d.Health == pluginapi.Healthy {
			n++
		}
	}
	return n
}

// pct is the p-th percentile of lat (nearest rank).
func pct(lat []time.Duration, p float64) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(lat))
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(i, 0)]
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func median(rounds []scaleRound, f func(scaleRound) float64) float64 {
	v := make([]float64, len(rounds))
	for i, r := range rounds {
		v[i] = f(r)
	}
	slices.Sort(v)
	return v[len(v)/2]
}

func loadAverage() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.Join(strings.Fields(string(b))[:min(3, len(strings.Fields(string(b))))], " ")
}

// printScaleTable prints one row per measure and a column per layout:
// the median of the rounds, its ratio to the goal, and the rounds' range.
func printScaleTable(loadBefore string, layouts []scaleLayout, results [][]scaleRound) {
	type row struct {
		name        string
		unit        string
		goal        float64 // in unit; 0 for none
		processOnly bool    // a measure of the daemon's process
		val         func(scaleRound) float64
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	lat := func(name string, p float64, goal time.Duration, f func(scaleRound) []time.Duration) row {
		return row{name: fmt.Sprintf("%s p%g", name, p), unit: "ms", goal: ms(goal), val: func(r scaleRound) float64 { return ms(pct(f(r), p)) }}
	}
	preferred := func(r scaleRound) []time.Duration { return r.preferred }
	allocate := func(r scaleRound) []time.Duration { return r.allocate }
	idle := func(r scaleRound) []time.Duration { return r.statusIdle }
	loaded := func(r scaleRound) []time.Duration { return r.statusLoaded }
	paced := func(r scaleRound) []time.Duration { return r.statusPaced }
	viaPlugin := func(r scaleRound) []time.Duration { return r.statusPlugin }
	listIdle := func(r scaleRound) []time.Duration { return r.listIdle }
	listLoaded := func(r scaleRound) []time.Duration { return r.listLoaded }
	add := func(r scaleRound) []time.Duration { return r.add }
	del := func(r scaleRound) []time.Duration { return r.del }
	rows := []row{
		{name: "first ListAndWatch after start", unit: "ms", goal: 1000, val: func(r scaleRound) float64 { return ms(r.firstList) }},
		{name: "  devices in it", unit: "of 4096", val: func(r scaleRound) float64 { return float64(r.devicesAtFirstList) }},
		{name: "  devices healthy in it", unit: "of 4096", val: func(r scaleRound) float64 { return float64(r.healthyAtFirstList) }},
		{name: "every device healthy after start", unit: "ms", val: func(r scaleRound) float64 { return ms(r.healthy) }},
		lat("GetPreferredAllocation (all free offered)", 50, 0, preferred),
		lat("GetPreferredAllocation (all free offered)", 99, 0, preferred),
		lat(fmt.Sprintf("Allocate (%d pods, %d alive at once)", scaleAllocs, scaleLive), 50, time.Millisecond, allocate),
		lat(fmt.Sprintf("Allocate (%d pods, %d alive at once)", scaleAllocs, scaleLive), 99, 5*time.Millisecond, allocate),
		lat("  an empty call (GetDevicePluginOptions)", 50, 0, func(r scaleRound) []time.Duration { return r.emptyRPC }),
		{name: "  of them re-allocations", unit: fmt.Sprintf("of %d", scaleAllocs), val: func(r scaleRound) float64 { return float64(r.reallocated) }},
		{name: "  daemon CPU per pod (Preferred + Allocate)", unit: "ms", processOnly: true, val: func(r scaleRound) float64 { return ms(r.cpuAllocate) }},
		lat(fmt.Sprintf("status, idle, %d allocations counted,", scaleLive), 50, 0, idle),
		lat(fmt.Sprintf("status, idle, %d allocations counted,", scaleLive), 99, 0, idle),
		{name: "  daemon CPU per status", unit: "ms", processOnly: true, val: func(r scaleRound) float64 { return ms(r.cpuStatus) }},
		lat(fmt.Sprintf("status every %v while ADDs run at %d/s, %d at once,", scalePacedPoll, scalePacedRate, scaleWorkers), 50, 0, paced),
		lat(fmt.Sprintf("status every %v while ADDs run at %d/s, %d at once,", scalePacedPoll, scalePacedRate, scaleWorkers), 99, 5*time.Millisecond, paced),
		{name: "  status calls while they run", val: func(r scaleRound) float64 { return float64(len(r.statusPaced)) }},
		lat(fmt.Sprintf("  CNI ADD at %d/s", scalePacedRate), 99, 0, func(r scaleRound) []time.Duration { return r.addPaced }),
		lat(fmt.Sprintf("status while the CNI plugin ADDs flat out, %d processes at once,", scaleWorkers), 50, 0, viaPlugin),
		lat(fmt.Sprintf("status while the CNI plugin ADDs flat out, %d processes at once,", scaleWorkers), 99, 5*time.Millisecond, viaPlugin),
		{name: "  status calls while they run", val: func(r scaleRound) float64 { return float64(len(r.statusPlugin)) }},
		lat("  CNI ADD through the plugin", 50, 0, func(r scaleRound) []time.Duration { return r.addPlugin }),
		lat("  CNI ADD through the plugin", 99, 0, func(r scaleRound) []time.Duration { return r.addPlugin }),
		{name: "  ADDs a second", unit: "/s", val: func(r scaleRound) float64 { return float64(len(r.addPlugin)) / r.pluginPhase.Seconds() }},
		lat("status while the ADDs run flat out (every CPU busy)", 50, 0, loaded),
		lat("status while the ADDs run flat out (every CPU busy)", 99, 5*time.Millisecond, loaded),
		{name: "  status calls while they run", val: func(r scaleRound) float64 { return float64(len(r.statusLoaded)) }},
		lat(fmt.Sprintf("allocations list, idle, %d listed,", scaleLive), 50, 0, listIdle),
		lat(fmt.Sprintf("allocations list, idle, %d listed,", scaleLive), 99, 0, listIdle),
		{name: "  daemon CPU per list", unit: "ms", processOnly: true, val: func(r scaleRound) float64 { return ms(r.cpuList) }},
		lat("allocations list while the ADDs run flat out", 99, 0, listLoaded),
		{name: "  list calls while the ADDs run", val: func(r scaleRound) float64 { return float64(len(r.listLoaded)) }},
		lat(fmt.Sprintf("CNI ADD (%d at once flat out, a flow each)", scaleWorkers), 50, 0, add),
		lat(fmt.Sprintf("CNI ADD (%d at once flat out, a flow each)", scaleWorkers), 99, 0, add),
		{name: "  ADDs a second", unit: "/s", val: func(r scaleRound) float64 { return float64(len(r.add)) / r.addPhase.Seconds() }},
		{name: "  daemon CPU per ADD (the status calls too)", unit: "ms", processOnly: true, val: func(r scaleRound) float64 { return ms(r.cpuAdd) }},
		lat("CNI DEL (one at a time)", 50, 0, del),
		lat("CNI DEL (one at a time)", 99, 0, del),
		{name: "daemon log: errors", val: func(r scaleRound) float64 { return float64(sumValues(r.errors)) }},
		{name: "daemon log: warnings", val: func(r scaleRound) float64 { return float64(r.warnings) }},
		{name: "ListAndWatch lists sent during the load", val: func(r scaleRound) float64 { return float64(r.updates) }},
		{name: "daemon RSS after the load (VmRSS)", unit: "MiB", goal: scaleRSSGoal, processOnly: true, val: func(r scaleRound) float64 { return r.rssMiB }},
		{name: "  of it anonymous (RssAnon: heap, stacks)", unit: "MiB", processOnly: true, val: func(r scaleRound) float64 { return r.anonMiB }},
		{name: "  of it the binary's pages (RssFile)", unit: "MiB", processOnly: true, val: func(r scaleRound) float64 { return r.fileMiB }},
		{name: "daemon peak RSS (VmHWM)", unit: "MiB", processOnly: true, val: func(r scaleRound) float64 { return r.hwmMiB }},
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "daemon on %d netdevs × %d queues (%d devices, one pool, software steering), GOMAXPROCS of the load %d, load average before %s\n",
		scaleNetdevs, scaleQueues, scaleNetdevs*scaleQueues, runtime.GOMAXPROCS(0), loadBefore)
	fmt.Fprintf(&sb, "each cell: median of %d rounds, ×ratio to the goal where there is one, [min–max of the rounds]\n", len(results[0]))
	tw := tabwriter.NewWriter(&sb, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "\tgoal")
	for _, l := range layouts {
		fmt.Fprintf(tw, "\t%s", l.name)
	}
	fmt.Fprintln(tw)
	for _, rw := range rows {
		fmt.Fprintf(tw, "%s\t", rw.name)
		if rw.goal > 0 {
			fmt.Fprintf(tw, "≤ %s %s", num(rw.goal), rw.unit)
		}
		for i, l := range layouts {
			if rw.processOnly && l.inProcess {
				fmt.Fprint(tw, "\t—")
				continue
			}
			v := make([]float64, len(results[i]))
			for j, r := range results[i] {
				v[j] = rw.val(r)
			}
			slices.Sort(v)
			cell := num(v[len(v)/2]) + " " + rw.unit
			if rw.goal > 0 {
				cell += " ×" + strconv.FormatFloat(v[len(v)/2]/rw.goal, 'f', 2, 64)
			}
			if len(v) > 1 {
				cell += " [" + num(v[0]) + "–" + num(v[len(v)-1]) + "]"
			}
			fmt.Fprintf(tw, "\t%s", strings.TrimSpace(cell))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	errs := map[string]int{}
	for _, rounds := range results {
		for _, r := range rounds {
			for msg, n := range r.errors {
				errs[msg] += n
			}
		}
	}
	for _, msg := range slices.Sorted(maps.Keys(errs)) {
		fmt.Fprintf(&sb, "daemon error, %d times in all rounds: %s\n", errs[msg], msg)
	}
	// Straight to stdout: a benchmark's log is cut to a few lines.
	fmt.Print(sb.String())
}

func sumValues(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// num formats v with about three significant digits.
func num(v float64) string {
	switch {
	case v >= 100 || v == math.Trunc(v):
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}
