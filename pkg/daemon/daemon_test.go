package daemon

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/testing/handover"
	"github.com/xdpq/xdpq/internal/testing/testbin"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/client"
	"github.com/xdpq/xdpq/pkg/xsk"
)

func TestMain(m *testing.M) {
	if len(os.Args) == 2 && os.Args[1] == scalePollerArg {
		os.Exit(runScalePoller(os.Getenv(scalePollerEnv)))
	}
	os.Exit(testnet.MainWithLeakCheck(m))
}

// TestStandalone is the standalone mode as a bare-metal user runs it: the
// daemon on a config file, `xdpqctl alloc` through the local API, an
// unprivileged xdpqperf that receives its queues' traffic through the
// broker, `xdpqctl free`; and the config reloaded while it runs.
func TestStandalone(t *testing.T) {
	p := testnet.NewPair(t, 4)
	dir := t.TempDir()
	bin := t.TempDir()
	for _, c := range []string{"xdpqctl", "xdpqperf"} {
		testbin.Build(t, filepath.Join(bin, c), "github.com/xdpq/xdpq/cmd/"+c)
	}
	cfgPath := filepath.Join(dir, "config.yaml")
	os.WriteFile(cfgPath, []byte("pools: [{name: demo, steering: hardware, devices: {netdevs: ['xa#0-1']}}]\n"), 0o644)
	pins := testPins(t)
	allocDir, _ := os.MkdirTemp("", "xdpq-alloc-")
	defer os.RemoveAll(allocDir)
	os.Chmod(allocDir, 0o755)
	apiSock := filepath.Join(dir, "api.sock")
	start := func() (stop func()) {
		_, stop = runDaemon(t, Options{ConfigPath: cfgPath, NetNS: p.NSPath(), PinDir: filepath.Join(pins, "xdpq"),
			StateDir: filepath.Join(dir, "state"), AllocDir: allocDir, Standalone: true, APISocket: apiSock})
		return stop
	}
	stop := start()
	ctl := func(args ...string) (string, error) {
		out, err := exec.Command(filepath.Join(bin, "xdpqctl"), append([]string{"-api-socket", apiSock, "-o", "json"}, args...)...).CombinedOutput()
		return string(out), err
	}
	// The daemon is ready (runDaemon waited): its pool is there.
	if out, err := ctl("status"); err != nil || !strings.Contains(out, `"free": 2`) {
		t.Fatalf("status: %v\n%s", err, out)
	}
	if out, err := ctl("alloc", "-pool", "nope", "-n", "1"); err == nil || !strings.Contains(out, `no pool "nope" (pools: demo)`) {
		t.Errorf("alloc from a missing pool: %v %s", err, out)
	}
	if out, err := ctl("alloc", "-pool", "demo", "-n", "3"); err == nil || !strings.Contains(out, "3 queues asked, 2 free") {
		t.Errorf("alloc beyond the pool: %v %s", err, out)
	}
	out, err := ctl("alloc", "-pool", "demo", "-n", "2", "-uid", "65534")
	if err != nil {
		t.Fatalf("alloc: %v\n%s", err, out)
	}
	st, err := api.NewClient(apiSock).Status()
	if err != nil || st.Allocations != 1 || st.Pools[0].Allocations != 1 || st.Pools[0].Free != 0 {
		t.Fatalf("status after alloc: %+v %v", st, err)
	}
	a, err := api.NewClient(apiSock).Allocations("")
	if err != nil || len(a.Allocations) != 1 {
		t.Fatalf("allocations after alloc: %+v %v", a, err)
	}
	alloc := a.Allocations[0]
	if alloc.Netdev != "xa" || len(alloc.Queues) != 2 {
		t.Fatalf("allocation %+v", alloc)
	}

	// The pod: xdpqperf as uid 65534, no capabilities, its own netns.
	var stdout, stderr bytes.Buffer
	pod, err := handover.StartProgram(filepath.Join(bin, "xdpqperf"), []string{"-mode", "rxdrop", "-duration", "3s"},
		[]string{"XDPQ_SOCKET=" + alloc.Socket}, &stdout, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer pod.Kill()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, _ := api.NewClient(apiSock).Status()
		if len(st.Netdevs) == 1 && len(st.Netdevs[0].Sockets) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pod's lease did not become active: %+v\n%s", st, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	sendFrames(t, p, 300)
	if err := pod.Wait(); err != nil {
		t.Fatalf("xdpqperf: %v\n%s", err, stderr.String())
	}
	totals := map[string]string{}
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		var q, rx, tx int
		if _, err := fmt.Sscanf(sc.Text(), "total q%d: rx %d tx %d", &q, &rx, &tx); err == nil {
			totals[fmt.Sprint(q)] = fmt.Sprint(rx)
		}
	}
	if totals["0"] != "300" || totals["1"] != "300" {
		t.Errorf("the pod received %v, want 300 on queues 0 and 1\n%s", totals, stdout.String())
	}

	// The daemon restarts: the allocation is served again at the same path
	// (its owner kept: root is refused, uid 65534 would be let in).
	stop()
	start() // stopped when the test ends
	waitStatus(t, apiSock, func(s *api.Status) bool {
		return s.Allocations == 1 && s.Pools[0].Allocations == 1 && s.Pools[0].Free == 0
	})
	if l, err := api.NewClient(apiSock).Allocations(""); err != nil || len(l.Allocations) != 1 || l.Allocations[0].ID != alloc.ID {
		t.Fatalf("allocations after the restart: %+v %v, want %s", l, err, alloc.ID)
	}
	_, err = client.Connect(alloc.Socket, client.Options{Timeout: 2 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "belongs to uid 65534") {
		t.Errorf("the restored allocation's socket: %v", err)
	}

	if out, err := ctl("free", alloc.ID); err != nil {
		t.Fatalf("free: %v %s", err, out)
	}
	if _, err := os.Stat(filepath.Join(allocDir, alloc.ID+".json")); !os.IsNotExist(err) {
		t.Errorf("the allocation's record stays after free: %v", err)
	}
	if out, err := ctl("free", alloc.ID); err == nil || !strings.Contains(out, "no allocation") {
		t.Errorf("free twice: %v %s", err, out)
	}
	if _, err := os.Stat(alloc.Socket); !os.IsNotExist(err) {
		t.Errorf("the allocation's socket stays after free: %v", err)
	}

	// Hot reload: a bigger pool is applied; an invalid file is refused
	// and reported, and the pool stays.
	os.WriteFile(cfgPath, []byte("pools: [{name: demo, steering: hardware, devices: {netdevs: ['xa#0-3']}}]\n"), 0o644)
	waitStatus(t, apiSock, func(s *api.Status) bool { return len(s.Pools) == 1 && s.Pools[0].Queues == 4 })
	os.WriteFile(cfgPath, []byte("pools: [{name: demo, devices: {netdevs: ['xa#0-3']}, mtu: 9000}]\n"), 0o644)
	waitStatus(t, apiSock, func(s *api.Status) bool {
		return strings.Contains(s.ConfigError, "pools[0].mtu: unknown field") && s.Pools[0].Queues == 4
	})
}

var seq atomic.Uint64

// nextSeq numbers frames across calls, so that a frame received is the
// one sent, not an earlier one's twin.
func nextSeq() uint64 { return seq.Add(1) }

func waitStatus(t *testing.T, sock string, ok func(*api.Status) bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s, err := api.NewClient(sock).Status()
		if err == nil && ok(s) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("status %+v, %v", s, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sendFrames sends n frames (udp to the pod's address, port 5000, each
// payload unique) from xb's queues 0 and 1 each, and returns them by
// queue.
func sendFrames(t *testing.T, p *testnet.Pair, n int) [][][]byte {
	t.Helper()
	return sendFramesOn(t, p, n, 0, 1)
}

// sendFramesOn is sendFrames from xb's queues qa and qb (arriving on xa's
// queues of the same numbers); it returns them in that order.
func sendFramesOn(t *testing.T, p *testnet.Pair, n int, qa, qb uint32) [][][]byte {
	t.Helper()
	sent := make([][][]byte, 2)
	dev := xsk.Netdev{Name: p.B.Name, Ifindex: p.B.Index, NetNS: p.NSPath()}
	umem, socks, err := xsk.Open(dev, []uint32{qa, qb}, 1024, xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048},
		Rings: xsk.Rings{Fill: 64, Completion: 512, TX: 512}})
	if err != nil {
		t.Fatal(err)
	}
	defer umem.Close()
	for i, s := range socks {
		defer s.Close()
		var frames [][]byte
		for range n {
			f, _ := frame.Spec{SrcMAC: p.B.MAC, DstMAC: p.A.MAC, Src: p.B.Addr, Dst: p.PodAddr, Protocol: 17,
				SrcPort: 1, DstPort: 5000, Payload: frame.Payload(uint32(i), nextSeq(), 40)}.Build()
			frames = append(frames, f)
		}
		addrs := make([]uint64, 512)
		for j := range addrs {
			addrs[j] = umem.FrameAddr(i*512 + j)
		}
		if err := traffic.NewSender(s, addrs, 0).Send(frames, time.Now().Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
		sent[i] = frames
	}
	return sent
}
