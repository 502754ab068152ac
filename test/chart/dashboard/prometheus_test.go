package dashboard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/perf"
	"github.com/xdpq/xdpq/internal/testing/promtest"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/internal/tools/demo"
	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/client"
	"github.com/xdpq/xdpq/pkg/daemon"
	"github.com/xdpq/xdpq/pkg/xdp"
	"github.com/xdpq/xdpq/pkg/xsk"
)

func TestMain(m *testing.M) { os.Exit(testnet.MainWithLeakCheck(m)) }

const (
	// testNode is the node label the test's scrape gives the daemon's
	// series, as the chart's ServiceMonitor gives each daemon its node's.
	testNode = "xdpq-test-node"
	// job is the scrape's job, as the chart's ServiceMonitor names it.
	job = "xdpq-metrics"
	// rateWindow is $__rate_interval for a 1s scrape and a 1s step:
	// Grafana's max(4 * scrape interval, step + scrape interval).
	rateWindow = "4s"
	// downNode is the node label of a target where no daemon answers.
	downNode = "xdpq-down-node"
	// dashboardFile is the chart's copy of the dashboard.
	dashboardFile = "../../../charts/xdpq/files/xdpq-dashboard.json"
	// rulesFile is the chart's alerts.
	rulesFile = "../../../charts/xdpq/files/xdpq.rules.yaml"
	// config is the daemon's: one software-steered pool of xa's two
	// queues (veth has no ntuple filters).
	config = "pools: [{name: rx, steering: software, devices: {netdevs: ['xa#0-1']}}]\n"
)

// TestDashboardOnPrometheus proves the dashboard against a real
// Prometheus scraping a real daemon each second: the daemon serves a
// pool of xa's two queues on a veth pair; two allocations of a queue
// each are attached through the daemon's API as the CNI plugin does;
// a pod-like receiver (xdpqperf's rxdrop) drains the first, the second's
// holder connects and reads nothing; an operator's program takes the
// netdev's hook and leaves (a re-attach); a config is refused and a good
// one put back; then frames flow to both queues. Every target of every
// panel of the generated JSON (its variables put in) but the DRA
// driver's returns series with data over the test's time range, or the
// panel is named; the receive
// panel shows the drained queue receiving, the loss panel the other
// queue losing (fill ring empty, then rx ring full) and the drained one
// not, the state panel Filter and Overridden, the config panel
// refused and in force. The node variable's query lists the node.
//
// Prometheus also evaluates the chart's alerts (each one's "for" cut to a
// second): XdpqNetdevOverridden fires while the operator's program holds
// the hook, its description naming the netdev, the node and what to do,
// and resolves when xdpq is back; XdpqConfigRefused fires for the refused
// config and resolves with the good one; XdpqQueueFillRingEmpty and
// XdpqQueueRxRingFull fire for the queue whose pod reads nothing and
// never for the reading pod's; XdpqDaemonDown fires for a second target
// where no daemon answers and not for the daemon that does.
func TestDashboardOnPrometheus(t *testing.T) {
	promBin := testnet.RequireTool(t, "prometheus", "prometheus")
	pair := testnet.NewPair(t, 2)
	d, dir := startDaemon(t, pair)
	prom := startPrometheus(t, promBin, d.MetricsAddr().String())
	start := time.Now()
	prom.WaitFor(t, `up{job="`+job+`"} == 1`)
	ctx := context.Background()

	// Two allocations, attached through the daemon's API (timed: the CNI
	// panels). The second ADD comes once Prometheus holds the first's
	// count, so that rate() sees it rise.
	c := api.NewClient(filepath.Join(dir, "api.sock"))
	var allocs [2]*api.Allocation
	for i := range allocs {
		a, err := d.API().Alloc(ctx, api.AllocRequest{Pool: "rx", Count: 1})
		if err != nil {
			t.Fatal(err)
		}
		allocs[i] = a
		flow := api.CNIFlow{Protocol: "udp", Dst: netip.PrefixFrom(podAddr(pair, i), 32), DstPort: port(i)}
		if _, err := c.CNIAdd(api.CNIAddRequest{ContainerID: fmt.Sprintf("pod%d", i), IfName: "net1", Allocation: a.ID,
			PodNamespace: "test", PodName: fmt.Sprintf("pod%d", i),
			Flows: []api.CNIFlow{flow}, Addresses: []netip.Addr{podAddr(pair, i)}}); err != nil {
			t.Fatal(err)
		}
		prom.WaitFor(t, fmt.Sprintf(`xdpq_cni_operation_duration_seconds_count{verb="add"} == %d`, i+1))
	}
	reading, stopped := allocs[0].Queues[0], allocs[1].Queues[0]

	// The pods: one drains its ring, the other never reads.
	rctx, cancel := context.WithCancel(ctx)
	received := make(chan error, 1)
	go func() {
		_, err := perf.Run(rctx, perf.Config{Socket: allocs[0].Socket, Mode: perf.RXDrop, Ring: 2048, Out: io.Discard})
		received <- err
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-received; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("the reading pod: %v", err)
		}
	})
	lease, err := client.Connect(allocs[1].Socket, client.Options{Ring: 64, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lease.Close() }) // the test's outcome is known by then
	waitNetdev(t, d, func(n api.NetdevStatus) bool { return len(n.Sockets) == 2 && n.State == "Filter" })
	// Prometheus holds the sockets' and the program's counters before
	// anything makes them rise.
	prom.WaitFor(t, fmt.Sprintf(`xdpq_socket_fill_ring_empty_total{queue="%d"}`, stopped))
	prom.WaitFor(t, `xdpq_agent_reattach_duration_seconds_count{netdev="xa"} == 0`)
	prom.WaitFor(t, `xdpq_agent_program_packets_total{netdev="xa", result="redirected"}`)

	// An operator's program takes the hook, long enough for a scrape to
	// see it, and leaves: xdpq re-attaches its own.
	operator, err := demo.AttachOperator(pair.NSPath(), pair.A.Index)
	if err != nil {
		t.Fatal(err)
	}
	defer operator.Close()
	waitNetdev(t, d, func(n api.NetdevStatus) bool { return n.State == "Overridden" })
	prom.WaitFor(t, `xdpq_agent_netdev_state{netdev="xa", state="Overridden"} == 1`)
	// Its alert fires (its "for" a second here), saying what to do about
	// this netdev on this node.
	prom.WaitFor(t, promtest.Firing("XdpqNetdevOverridden", `netdev="xa", node="`+testNode+`"`))
	if desc := prom.AlertDescription(t, "XdpqNetdevOverridden"); !strings.Contains(desc, "ip link set dev xa xdp off") ||
		!strings.Contains(desc, "kubectl xdpq status "+testNode) {
		t.Errorf("XdpqNetdevOverridden's description: %s", desc)
	}
	if err := demo.DetachOperator(pair.NSPath(), pair.A.Index); err != nil {
		t.Fatal(err)
	}
	waitNetdev(t, d, func(n api.NetdevStatus) bool { return n.State == "Filter" })
	prom.WaitFor(t, `xdpq_agent_reattach_duration_seconds_count{netdev="xa"} == 1`)
	prom.WaitGone(t, `ALERTS{alertname="XdpqNetdevOverridden"}`) // resolved

	// A config the daemon refuses, then the good one back.
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte("pools: [{name: rx, bogus: 1}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.Reload(ctx); err == nil {
		t.Fatal("an invalid config was put in force")
	}
	prom.WaitFor(t, `xdpq_config_last_reload_successful == 0`)
	prom.WaitFor(t, promtest.Firing("XdpqConfigRefused", `node="`+testNode+`"`))
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	prom.WaitGone(t, `ALERTS{alertname="XdpqConfigRefused"}`)
	// The node whose daemon does not answer: its alert fires, the
	// daemon that answers has none.
	prom.WaitFor(t, promtest.Firing("XdpqDaemonDown", `node="`+downNode+`"`))
	prom.WaitGone(t, `ALERTS{alertname="XdpqDaemonDown", node="`+testNode+`"}`)

	// Frames flow to both pods' queues, until the test ends.
	sendFrames(t, pair, [2]uint32{reading, stopped})
	// The pod that reads nothing: its RX ring fills with the frames it
	// gave at the start, then frames find its fill ring empty. It gives
	// the kernel its spare frames, still reading nothing: what comes
	// then finds its RX ring full.
	prom.WaitFor(t, fmt.Sprintf(`xdpq_socket_fill_ring_empty_total{queue="%d"} > 0`, stopped))
	if n := lease.Sockets[0].Fill(lease.SpareFrames(0)); n != len(lease.SpareFrames(0)) {
		t.Fatalf("the fill ring took %d of %d spare frames", n, len(lease.SpareFrames(0)))
	}
	// The losing queue's alerts fire; the reading pod's queue has none.
	prom.WaitFor(t, promtest.Firing("XdpqQueueFillRingEmpty", fmt.Sprintf(`netdev="xa", queue="%d"`, stopped)))
	prom.WaitFor(t, promtest.Firing("XdpqQueueRxRingFull", fmt.Sprintf(`netdev="xa", queue="%d"`, stopped)))
	prom.WaitGone(t, fmt.Sprintf(`ALERTS{alertname=~"XdpqQueue.+", queue="%d"}`, reading))

	// The panels, as Grafana would ask for them with node chosen.
	panels := promtest.ReadPanels(t, dashboardFile)
	fill := strings.NewReplacer("$__rate_interval", rateWindow, "$"+NodeVar, testNode)
	byTitle := map[string]promtest.Panel{}
	for _, p := range panels {
		byTitle[p.Title] = p
	}
	podNamed := func(pod string) func(map[string]string) bool {
		return func(m map[string]string) bool { return m["namespace"] == "test" && m["pod"] == pod }
	}
	queueOf := func(q uint32) func(map[string]string) bool {
		return func(m map[string]string) bool { return m["netdev"] == "xa" && m["queue"] == strconv.Itoa(int(q)) }
	}
	// What the panels must show besides data, polled until they do: the
	// counters rise as the kernel counts and Prometheus scrapes.
	shows := []struct {
		panel  string
		what   string
		reason string // "": every target; else the target whose legend ends so
		match  func(map[string]string) bool
		ok     func(vals []float64) bool
	}{
		{"Frames redirected to pods per queue", fmt.Sprintf("xa q%d (the reading pod) receiving", reading), "", queueOf(reading), above(0)},
		{"Frames redirected to pods per node", "the node receiving", "", nil, above(0)},
		{"Losses per queue by reason", fmt.Sprintf("xa q%d (the pod that reads nothing) losing on an empty fill ring", stopped), "fill ring empty", queueOf(stopped), above(0)},
		{"Losses per queue by reason", fmt.Sprintf("xa q%d (the pod that reads nothing) losing on a full RX ring", stopped), "rx ring full", queueOf(stopped), above(0)},
		{"Losses per queue by reason", fmt.Sprintf("xa q%d (the reading pod) losing nothing as rx ring full", reading), "rx ring full", queueOf(reading), func(v []float64) bool { return len(v) > 0 && slices.Max(v) == 0 }},
		{"Losses per node by reason", "the node losing", "rx ring full", nil, above(0)},
		{"Frames redirected per pod", "test/pod0 (the reading pod) receiving", "", podNamed("pod0"), above(0)},
		{"Losses per pod by reason", "test/pod1 (the pod that reads nothing) losing on a full RX ring", "rx ring full", podNamed("pod1"), above(0)},
		{"Losses per pod by reason", "test/pod0 (the reading pod) losing nothing as rx ring full", "rx ring full", podNamed("pod0"), func(v []float64) bool { return len(v) > 0 && slices.Max(v) == 0 }},
		{"Netdev state", "xa Filter (2)", "", nil, has(2)},
		{"Netdev state", "xa Overridden (3)", "", nil, has(3)},
		{"Re-attach latency", "the re-attach, under a second", "", nil, func(v []float64) bool { return slices.ContainsFunc(v, func(x float64) bool { return x > 0 && x < 1 }) }},
		{"CNI latency", "the ADDs", "", nil, above(0)},
		{"Config in force", "refused (0)", "", nil, has(0)},
		{"Config in force", "in force (1)", "", nil, has(1)},
		{"Pool capacity vs allocated", "2 devices, 2 allocated", "", nil, has(2)},
		{"Allocations and leases", "2 allocations, 2 leases", "", nil, has(2)},
	}
	for _, s := range shows {
		p, ok := byTitle[s.panel]
		if !ok {
			t.Fatalf("no panel %q", s.panel)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			var seen []float64
			for _, tg := range p.Targets {
				if !strings.HasSuffix(tg.LegendFormat, s.reason) {
					continue
				}
				for _, series := range prom.QueryRange(t, fill.Replace(tg.Expr), start, time.Now()) {
					if s.match == nil || s.match(series.Labels) {
						seen = append(seen, series.Values...)
					}
				}
			}
			if s.ok(seen) {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("panel %q does not show %s: values %v", s.panel, s.what, promtest.Summary(seen))
				break
			}
			time.Sleep(250 * time.Millisecond) // Prometheus scrapes each second and tells no one: polled
		}
	}

	// Every target of every panel returns data, but the DRA driver's:
	// this daemon serves no claim (make e2e's TestKubectlXdpqTop shows
	// them with data).
	prom.CheckPanels(t, panels, fill, start, time.Now(), map[string]string{
		"DRA Prepare latency":      "this daemon serves no DRA claim",
		"DRA operations by result": "this daemon serves no DRA claim",
	})

	// The node variable's query, label_values(metric, node), as Grafana
	// asks Prometheus for it.
	metric, label, ok := strings.Cut(strings.TrimSuffix(strings.TrimPrefix(NodeQuery, "label_values("), ")"), ", ")
	if !ok {
		t.Fatalf("node variable query %q", NodeQuery)
	}
	var nodes []string
	prom.Get(t, "/api/v1/label/"+label+"/values", url.Values{"match[]": {metric}}, &nodes)
	if !slices.Contains(nodes, testNode) {
		t.Errorf("the node variable (%s) lists %v, not %s", NodeQuery, nodes, testNode)
	}
}

func port(i int) uint16 { return uint16(5000 + i) }

// podAddr is pod i's own address: one no interface holds, and no other
// pod's (the daemon refuses a flow to the node's address, or to one
// another pod's flows steer as its own).
func podAddr(p *testnet.Pair, i int) netip.Addr {
	a := p.PodAddr
	for range i {
		a = a.Next()
	}
	return a
}

// above is true of values with one above v.
func above(v float64) func([]float64) bool {
	return func(vals []float64) bool { return slices.ContainsFunc(vals, func(x float64) bool { return x > v }) }
}

// has is true of values holding v.
func has(v float64) func([]float64) bool {
	return func(vals []float64) bool { return slices.Contains(vals, v) }
}

// startDaemon runs a standalone daemon on the pair's xa with config,
// serving metrics on a port of the kernel's choosing, until the test
// ends; it returns the daemon and its directory (config.yaml, api.sock).
func startDaemon(t *testing.T, pair *testnet.Pair) (*daemon.Daemon, string) {
	t.Helper()
	if err := xdp.MountBPFFS(xdp.DefaultBPFFS); err != nil {
		t.Fatal(err)
	}
	pins, err := os.MkdirTemp(xdp.DefaultBPFFS, "xdpq-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(pins) }) // bpffs: gone with the daemon's pins anyway
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := daemon.New(daemon.Options{ConfigPath: cfg, NetNS: pair.NSPath(), PinDir: filepath.Join(pins, "xdpq"),
		StateDir: filepath.Join(dir, "state"), AllocDir: filepath.Join(dir, "alloc"), Standalone: true,
		APISocket: filepath.Join(dir, "api.sock"), CollectPeriod: time.Hour, MetricsAddr: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the daemon: %v", err)
		}
	})
	select {
	case <-d.Ready():
	case err := <-done:
		t.Fatalf("the daemon stopped: %v", err)
	}
	return d, dir
}

// waitNetdev waits until the daemon's status of xa satisfies ok. The
// agent acts on link notifications and tells no one: polled.
func waitNetdev(t *testing.T, d *daemon.Daemon, ok func(api.NetdevStatus) bool) {
	t.Helper()
	var last api.NetdevStatus
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		s, err := d.API().Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range s.Netdevs {
			if n.Netdev == "xa" {
				if last = n; ok(n) {
					return
				}
			}
		}
	}
	t.Fatalf("xa: %+v", last)
}

// sendFrames sends UDP frames from xb's queues qs[i] (arriving on xa's
// queue of the same number) to pod i, port(i), 32 on each every 10ms, until
// the test ends.
func sendFrames(t *testing.T, p *testnet.Pair, qs [2]uint32) {
	t.Helper()
	dev := xsk.Netdev{Name: p.B.Name, Ifindex: p.B.Index, NetNS: p.NSPath()}
	umem, socks, err := xsk.Open(dev, qs[:], 1024, xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048},
		Rings: xsk.Rings{Fill: 64, Completion: 512, TX: 512}})
	if err != nil {
		t.Fatal(err)
	}
	var senders []*traffic.Sender
	var frames [][][]byte
	for i, s := range socks {
		f, err := frame.Spec{SrcMAC: p.B.MAC, DstMAC: p.A.MAC, Src: p.B.Addr, Dst: podAddr(p, i), Protocol: 17,
			SrcPort: 4000, DstPort: port(i), Payload: frame.Payload(uint32(i), 0, 22)}.Build()
		if err != nil {
			t.Fatal(err)
		}
		addrs := make([]uint64, 512)
		for j := range addrs {
			addrs[j] = umem.FrameAddr(i*512 + j)
		}
		senders = append(senders, traffic.NewSender(s, addrs, 0))
		frames = append(frames, slices.Repeat([][]byte{f}, 32))
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var sendErr error
	wg.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond) // the pace of the traffic, not a wait for anything
		defer tick.Stop()
		for range tick.C {
			if stop.Load() {
				return
			}
			for i, s := range senders {
				if err := s.Send(frames[i], time.Now().Add(5*time.Second)); err != nil {
					sendErr = fmt.Errorf("send on xb q%d: %w", qs[i], err)
					return
				}
			}
		}
	})
	t.Cleanup(func() {
		stop.Store(true)
		wg.Wait()
		for _, s := range socks {
			_ = s.Close() // nothing is written through them any more
		}
		_ = umem.Close()
		if sendErr != nil {
			t.Error(sendErr)
		}
	})
}

// startPrometheus runs Prometheus scraping the daemon's metrics at addr
// every second as job, with the node label, and evaluating the chart's
// alerts, each one's "for" cut to a second; a second target where no
// daemon answers is a node whose daemon is down.
func startPrometheus(t *testing.T, bin, addr string) *promtest.Server {
	t.Helper()
	rules, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	rules = regexp.MustCompile(`(?m)^(\s+for:) \d+m$`).ReplaceAll(rules, []byte("$1 1s"))
	down, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	downAddr := down.Addr().String()
	if err := down.Close(); err != nil { // nothing answers there now
		t.Fatal(err)
	}
	return promtest.Start(t, bin, promtest.Config{Rules: rules, ScrapeConfigs: fmt.Sprintf(`  - job_name: %s
    static_configs:
      - targets: [%q]
        labels: {node: %s}
      - targets: [%q]
        labels: {node: %s}
`, job, addr, testNode, downAddr, downNode)})
}
