package daemon

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/client"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// TestMetrics scrapes a running daemon over HTTP as Prometheus would: the
// pools' gauges; the kernel's counters of a live lease's sockets while
// the pod reads nothing (frames dropped on an empty fill ring, then on a
// full RX ring); a refusal by its code; CNI operations by verb and
// result; reloads by result. When the lease ends its series go and the
// daemon holds no copy of its sockets: the queues bind again at once.
// promtool finds nothing to say about the text. A second daemon on the
// same metrics address is refused, naming it.
func TestMetrics(t *testing.T) {
	pair := testnet.NewPair(t, 4)
	dir := t.TempDir()
	o := standaloneOpts(t, pair, dir, testPins(t), "pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-1']}},"+
		" {name: dns, steering: software, devices: {netdevs: ['xa#2-3']}}]\n")
	o.MetricsAddr = "127.0.0.1:0"
	d, _ := runDaemon(t, o)
	base := "http://" + d.metricsLn.Addr().String()
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := get(t, base+path); code != http.StatusOK || body != "ok\n" {
			t.Errorf("%s: %d %q", path, code, body)
		}
	}

	// An allocation attached through the local API, as the CNI plugin does,
	// and a CHECK of an attachment that does not exist.
	ctx := context.Background()
	c := api.NewClient(o.APISocket)
	a, err := d.local.Alloc(ctx, api.AllocRequest{Pool: "upf", Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	flow := api.CNIFlow{Protocol: "udp", Dst: netip.PrefixFrom(pair.PodAddr, 32), DstPort: 5000}
	if _, err := c.CNIAdd(api.CNIAddRequest{ContainerID: "c1", IfName: "net1", Allocation: a.ID, Flows: []api.CNIFlow{flow}, Addresses: []netip.Addr{flow.Dst.Addr()}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CNICheck("nope", "net1"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("check of a missing attachment: %v", err)
	}
	// The pod: rings of 64, and it reads nothing.
	lease, err := client.Connect(a.Socket, client.Options{Ring: 64, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Close()
	// Another allocation's client asks for rings beyond the pool's limit.
	b, err := d.local.Alloc(ctx, api.AllocRequest{Pool: "dns", Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Connect(b.Socket, client.Options{Ring: 16384, Timeout: 5 * time.Second}); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("rings over the limit: %v", err)
	}

	// 100 frames on each queue: 64 fill the RX ring, 36 find the fill ring
	// empty. The pod then gives its spare frames to the fill ring, still
	// reading nothing: 50 more find the RX ring full.
	sendFrames(t, pair, 100)
	waitMetric(t, base, `xdpq_socket_rx_dropped_frames_total{netdev="xa",queue="1"}`, 36)
	for i, s := range lease.Sockets {
		if n := s.Fill(lease.SpareFrames(i)); n != 64 {
			t.Fatalf("the fill ring took %d spares", n)
		}
	}
	sendFrames(t, pair, 50)
	waitMetric(t, base, `xdpq_socket_rx_ring_full_frames_total{netdev="xa",queue="1"}`, 50)

	// Reloads: one good, one refused.
	if err := d.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(o.ConfigPath, []byte("pools: [{name: upf, bogus: 1}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.Reload(ctx); err == nil {
		t.Fatal("an invalid config was put in force")
	}

	text := scrape(t, base)
	m := parseMetrics(t, text)
	for series, want := range map[string]float64{
		`xdpq_pool_capacity_devices{pool="upf"}`:                                      2,
		`xdpq_pool_allocated_devices{pool="upf"}`:                                     2,
		`xdpq_pool_allocations{pool="upf"}`:                                           1,
		`xdpq_pool_leases{pool="upf"}`:                                                1,
		`xdpq_pool_capacity_devices{pool="dns"}`:                                      2,
		`xdpq_pool_allocated_devices{pool="dns"}`:                                     1,
		`xdpq_pool_allocations{pool="dns"}`:                                           1,
		`xdpq_pool_leases{pool="dns"}`:                                                0,
		`xdpq_socket_rx_dropped_frames_total{netdev="xa",queue="0"}`:                  36,
		`xdpq_socket_rx_ring_full_frames_total{netdev="xa",queue="0"}`:                50,
		`xdpq_socket_tx_invalid_descriptors_total{netdev="xa",queue="0"}`:             0,
		`xdpq_broker_refusals_total{code="limit"}`:                                    1,
		`xdpq_broker_refusals_total{code="forbidden"}`:                                0,
		`xdpq_cni_operation_duration_seconds_count{result="success",verb="add"}`:      1,
		`xdpq_cni_operation_duration_seconds_count{result="not-found",verb="check"}`:  1,
		`xdpq_config_reloads_total{result="success"}`:                                 1,
		`xdpq_config_reloads_total{result="failure"}`:                                 1,
		`xdpq_config_last_reload_successful`:                                          0,
		`xdpq_agent_netdev_state{netdev="xa",state="Filter"}`:                         1,
		`xdpq_agent_steered_flows{netdev="xa",steering="software"}`:                   1,
		`xdpq_agent_program_packets_total{netdev="xa",queue="0",result="redirected"}`: 150,
	} {
		if got, ok := m[series]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", series, got, ok, want)
		}
	}
	build := 0
	for series, v := range m {
		if strings.HasPrefix(series, "xdpq_build_info{") && v == 1 &&
			strings.Contains(series, `version="`+xdpq.Version()+`"`) && strings.Contains(series, `goversion="`+runtime.Version()+`"`) {
			build++
		}
	}
	if build != 1 {
		t.Errorf("%d xdpq_build_info series of release %s, want 1", build, xdpq.Version())
	}
	if fill := m[`xdpq_socket_fill_ring_empty_total{netdev="xa",queue="0"}`]; fill < 36 {
		t.Errorf("fill ring found empty %v times; 36 frames found it so", fill)
	}
	if ts := m[`xdpq_config_last_reload_success_timestamp_seconds`]; time.Since(time.Unix(int64(ts), 0)) > time.Minute {
		t.Errorf("last good reload at %v", ts)
	}
	promtool(t, text)

	// The lease ends: its series go, and nothing keeps its queues bound.
	lease.Close()
	deadline := time.Now().Add(5 * time.Second)
	for d.core.broker.Leased(a.ID) { // the broker's state, told to no one: polled
		if time.Now().After(deadline) {
			t.Fatal("the lease did not end")
		}
		time.Sleep(5 * time.Millisecond)
	}
	m = parseMetrics(t, scrape(t, base))
	for series := range m {
		if strings.HasPrefix(series, "xdpq_socket_") {
			t.Errorf("after the lease: %s", series)
		}
	}
	if m[`xdpq_pool_leases{pool="upf"}`] != 0 {
		t.Error("a lease still counted")
	}
	bindQueues(t, pair, []uint32{0, 1})

	// A second daemon (its own state and API) on the same metrics address.
	o2 := standaloneOpts(t, pair, t.TempDir(), testPins(t), "pools: []\n")
	o2.MetricsAddr = d.metricsLn.Addr().String()
	if _, err := New(o2); err == nil || !strings.Contains(err.Error(), o2.MetricsAddr) {
		t.Errorf("a second daemon on the metrics address: %v", err)
	}
	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("the first daemon's health after the second failed: %d", code)
	}
}

// TestProbes: /readyz says the daemon is starting until it is ready, and
// stopping once it stops; /healthz says which part failed. Decisions of
// the daemon's probes, on a fake node: no kernel is asked.
func TestProbes(t *testing.T) {
	d, _ := newFakeNode(t).daemon("pools: []\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := httptest.NewServer(d.metricsHandler(ctx))
	defer srv.Close()
	if code, body := get(t, srv.URL+"/readyz"); code != http.StatusServiceUnavailable || !strings.HasPrefix(body, "starting") {
		t.Errorf("readyz before the start: %d %q", code, body)
	}
	close(d.core.ready)
	if code, body := get(t, srv.URL+"/readyz"); code != http.StatusOK {
		t.Errorf("readyz once ready: %d %q", code, body)
	}
	d.health.started("agent")
	d.health.stopped("agent", errors.New("link notifications ended"))
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := get(t, srv.URL+path); code != http.StatusServiceUnavailable || body != "part agent: link notifications ended\n" {
			t.Errorf("%s with a failed part: %d %q", path, code, body)
		}
	}
	cancel()
	if code, body := get(t, srv.URL+"/readyz"); code != http.StatusServiceUnavailable || body != "stopping\n" {
		t.Errorf("readyz while stopping: %d %q", code, body)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func scrape(t *testing.T, base string) string {
	t.Helper()
	code, text := get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d\n%s", code, text)
	}
	return text
}

// parseMetrics reads the text format's samples by series
// (name{labels} as written: promhttp sorts the labels).
func parseMetrics(t *testing.T, text string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if i < 0 || err != nil {
			t.Fatalf("sample %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// waitMetric waits until a series has the value. The kernel counts as
// the receiving NAPI runs and tells no one: polled.
func waitMetric(t *testing.T, base, series string, want float64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, ok := parseMetrics(t, scrape(t, base))[series]
		if ok && got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %v (present %v), want %v", series, got, ok, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// promtool runs `promtool check metrics` on the text. CI installs
// promtool (Debian's prometheus package); elsewhere its absence skips
// only this check.
func promtool(t *testing.T, text string) {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool is missing (Debian: apt-get install prometheus)")
		}
		t.Log("promtool is missing (Debian: apt-get install prometheus): the metrics are not linted")
		return
	}
	cmd := exec.Command(bin, "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	if out, err := cmd.CombinedOutput(); err != nil || len(out) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

// bindQueues binds sockets to xa's queues: it fails with EBUSY while a
// descriptor of an earlier socket there is open. The kernel frees a
// queue 15-70 ms after its socket's last close and tells no one: retried
// for a second.
func bindQueues(t *testing.T, pair *testnet.Pair, queues []uint32) {
	t.Helper()
	dev := xsk.Netdev{Name: pair.A.Name, Ifindex: pair.A.Index, NetNS: pair.NSPath()}
	deadline := time.Now().Add(time.Second)
	for {
		umem, socks, err := xsk.Open(dev, queues, 64, xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048},
			Rings: xsk.Rings{Fill: 16, Completion: 16, RX: 16}})
		if err == nil {
			for _, s := range socks {
				s.Close()
			}
			umem.Close()
			return
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			t.Fatalf("bind %v after the lease ended: %v", queues, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
