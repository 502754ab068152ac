package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/perf"
	"github.com/xdpq/xdpq/internal/testing/handover"
	"github.com/xdpq/xdpq/internal/testing/testbin"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/client"
	"github.com/xdpq/xdpq/pkg/daemon"
	"github.com/xdpq/xdpq/pkg/xdp"
)

// podUID is who the pods run as: nobody, with no capabilities.
const podUID = 65534

// Pods are the pod programs of rows (e) to (g), built from this tree.
type Pods struct {
	Perf    string // xdpqperf, for (e) and (f), and the Go forwarder
	CRxdrop string // clients/c's xdpq-rxdrop, for (g)
	CL2fwd  string // clients/c's xdpq-l2fwd, the C forwarder
}

// FindCC returns the path of the first C compiler of names (separated by
// commas) that is installed.
func FindCC(names string) (string, error) {
	for _, n := range strings.Split(names, ",") {
		if path, err := exec.LookPath(strings.TrimSpace(n)); err == nil {
			return path, nil
		}
	}
	return "", fmt.Errorf("no C compiler: none of %s is installed", names)
}

// BuildPods builds xdpqperf into dir, and with cc (a C compiler) the C
// client's examples xdpq-rxdrop and xdpq-l2fwd (clients/c's Makefile); cc "" leaves (g) out. It
// runs the go tool, so it works inside this module's tree.
func BuildPods(dir, cc string) (Pods, error) {
	var p Pods
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return p, fmt.Errorf("find the module's directory (go list -m): %w; run it in xdpq's source tree with go in root's PATH (make bench does), or pass -pods=false to leave out the pod rows", err)
	}
	perf := filepath.Join(dir, "xdpqperf")
	if err := testbin.Run(perf, "github.com/xdpq/xdpq/cmd/xdpqperf"); err != nil {
		return p, err
	}
	p.Perf = perf
	if cc == "" {
		return p, nil
	}
	cdir := filepath.Join(dir, "c")
	mk := exec.Command("make", "-C", filepath.Join(strings.TrimSpace(string(root)), "clients/c"), "O="+cdir, "CC="+cc)
	if out, err := mk.CombinedOutput(); err != nil {
		return p, fmt.Errorf("build the C client (%s): %w\n%s", strings.Join(mk.Args, " "), err, out)
	}
	p.CRxdrop = filepath.Join(cdir, "xdpq-rxdrop")
	p.CL2fwd = filepath.Join(cdir, "xdpq-l2fwd")
	return p, nil
}

// podDaemon is the xdpq daemon the pod rows share, standalone in this
// process. Its pool on A exists only while a pod row runs: removing it
// detaches the daemon's program, so that (a) to (d) find A's hook free.
type podDaemon struct {
	d       *daemon.Daemon
	pair    *testnet.Pair
	queues  int // the pool's queues: A's 0..queues-1
	work    string
	pins    string
	config  string
	metrics string // the daemon's /metrics URL
	cancel  context.CancelFunc
	stopped chan error
}

func startDaemon(p *testnet.Pair, queues int) (*podDaemon, error) {
	work, err := os.MkdirTemp("", "xdpq-bench-")
	if err != nil {
		return nil, err
	}
	// uid 65534 reaches its allocation's socket in here.
	if err := os.Chmod(work, 0o755); err != nil {
		return nil, errors.Join(err, os.RemoveAll(work))
	}
	if err := xdp.MountBPFFS(xdp.DefaultBPFFS); err != nil {
		return nil, errors.Join(err, os.RemoveAll(work))
	}
	pins, err := os.MkdirTemp(xdp.DefaultBPFFS, "xdpq-bench-")
	if err != nil {
		return nil, errors.Join(err, os.RemoveAll(work))
	}
	pd := &podDaemon{pair: p, queues: queues, work: work, pins: pins, config: filepath.Join(work, "config.yaml")}
	if err := pd.writeConfig("pools: []\n"); err != nil {
		return nil, errors.Join(err, pd.removeDirs())
	}
	d, err := daemon.New(daemon.Options{ConfigPath: pd.config, NetNS: p.NSPath(), PinDir: filepath.Join(pins, "xdpq"),
		StateDir: filepath.Join(work, "state"), AllocDir: filepath.Join(work, "alloc"), Standalone: true,
		APISocket: filepath.Join(work, "api.sock"), MetricsAddr: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("xdpq daemon: %w", err), pd.removeDirs())
	}
	pd.d = d
	pd.metrics = "http://" + d.MetricsAddr().String() + "/metrics"
	ctx, cancel := context.WithCancel(context.Background())
	pd.cancel, pd.stopped = cancel, make(chan error, 1)
	go func() { pd.stopped <- d.Run(ctx) }()
	select {
	case <-d.Ready():
		return pd, nil
	case err := <-pd.stopped:
		cancel()
		return nil, errors.Join(fmt.Errorf("xdpq daemon stopped: %w", err), pd.removeDirs())
	}
}

func (pd *podDaemon) removeDirs() error {
	return errors.Join(os.RemoveAll(pd.pins), os.RemoveAll(pd.work))
}

func (pd *podDaemon) close() error {
	pd.cancel()
	err := <-pd.stopped
	return errors.Join(err, pd.removeDirs())
}

// writeConfig replaces the config file at once (a rename), so that the
// daemon's file watch never reads half of it.
func (pd *podDaemon) writeConfig(yaml string) error {
	tmp := pd.config + ".new"
	if err := os.WriteFile(tmp, []byte(yaml), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, pd.config)
}

// setPool puts the pool in force as pod kind k wants it (busy polling,
// TX), or with k nil none: the daemon has applied it when Reload returns.
func (pd *podDaemon) setPool(k *podKind) error {
	yaml := "pools: []\n"
	if k != nil {
		yaml = fmt.Sprintf("pools:\n  - name: bench\n    steering: hardware\n    devices: {netdevs: ['%s#0-%d']}\n",
			pd.pair.A.Name, pd.queues-1)
		if k.busyPoll {
			yaml += "    busyPoll: {timeoutMicros: 20, budget: 64}\n"
		}
		if k.tx {
			yaml += "    allowTX: true\n"
		}
	}
	if err := pd.writeConfig(yaml); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pd.d.Reload(ctx); err != nil {
		return fmt.Errorf("xdpq daemon: reload %q: %w", yaml, err)
	}
	return nil
}

// podKind is one of the pod rows.
type podKind struct {
	name     string
	busyPoll bool
	tx       bool // it transmits: its pool allows TX
	// command is the pod's program and arguments; ready is what it prints
	// once its sockets are bound and their fill rings filled; received
	// reads how many frames it counted from all it printed.
	command  func(Pods) (string, []string)
	ready    string
	received func(out string) (uint64, error)
	// away reads the longest its receive loops left their RX rings while
	// frames came (client.Receiver.LongestAway), if it says; nil: it
	// does not.
	away func(out string) (time.Duration, bool)
}

// withRing is the kind with its client asking for rings of ring
// entries (xdpqperf -ring, xdpq-rxdrop -r), named so.
func (k podKind) withRing(ring uint32) podKind {
	command := k.command
	flag := "-ring"
	if strings.Contains(k.name, "xdpq-rxdrop") {
		flag = "-r"
	}
	k.command = func(p Pods) (string, []string) {
		bin, args := command(p)
		return bin, append(slices.Clone(args), flag, strconv.FormatUint(uint64(ring), 10))
	}
	k.name = fmt.Sprintf("%s, ring %d", k.name, ring)
	return k
}

// withArgs is k with args added to its command, and suffix to its name.
func (k podKind) withArgs(suffix string, args ...string) podKind {
	command := k.command
	k.command = func(p Pods) (string, []string) {
		bin, a := command(p)
		return bin, append(slices.Clone(a), args...)
	}
	k.name += suffix
	return k
}

// perLoopSuffix names the row of xdpqperf with a goroutine per queue.
const perLoopSuffix = ", a loop per queue"

func (pd *podDaemon) receivers(cfg Config) []receiver {
	var kinds []podKind
	if cfg.Pods.Perf != "" {
		args := []string{"-mode", "rxdrop"}
		if cfg.Jumbo() {
			args = append(args, "-multi-buffer")
		}
		perf := func(p Pods) (string, []string) { return p.Perf, args }
		kinds = append(kinds,
			podKind{name: "(e) pod: xdpqperf rxdrop", command: perf, ready: "xdpqperf rxdrop: allocation", received: perfReceived, away: perfAway},
			podKind{name: "(f) pod: xdpqperf rxdrop, busyPoll", busyPoll: true, command: perf, ready: "xdpqperf rxdrop: allocation", received: perfReceived, away: perfAway})
	}
	if cfg.Pods.CRxdrop != "" {
		var args []string
		if cfg.Jumbo() {
			args = []string{"-m"}
		}
		kinds = append(kinds, podKind{name: "(g) pod: C xdpq-rxdrop", command: func(p Pods) (string, []string) { return p.CRxdrop, args },
			ready: ": active (", received: cReceived, away: cAway})
	}
	var rs []receiver
	rings := cfg.PodRings
	if len(rings) == 0 {
		rings = []uint32{0} // the client's default
	}
	for _, k := range kinds {
		for _, ring := range rings {
			k := k
			if ring != 0 {
				k = k.withRing(ring)
			}
			for _, n := range cfg.PodQueues {
				// A busy-polling pod spins, and runs the queue's NAPI (the
				// receive side's XDP work) on its own core.
				rs = append(rs, receiver{name: k.name, queues: n, spins: k.busyPoll, pod: true, ring: ring, start: pd.startPod(k, n, cfg)})
			}
		}
	}
	if n := slices.Max(cfg.PodQueues); len(cfg.PodRings) == 0 && cfg.Pods.Perf != "" && n > 1 {
		// xdpqperf on the most queues with a goroutine per queue
		// (client.Receiver), where its default on the pod's one core is
		// one loop over them all (client.Poller): what that choice buys.
		k := kinds[0].withArgs(perLoopSuffix, "-loops", "queue")
		rs = append(rs, receiver{name: k.name, queues: n, pod: true, start: pd.startPod(k, n, cfg)})
	}
	if len(cfg.PodRings) == 0 && len(kinds) > 0 {
		// The C client's kind (xdpqperf's where it has none) at the
		// most queues, each with the default ring divided among them:
		// as many frames in circulation as its 1-queue row. Set beside
		// that kind's row at the same queue count, it measures what
		// the frames of N rings cost the one core that copies them
		// (on veth, the sender's).
		k, n := kinds[0], slices.Max(cfg.PodQueues)
		if cfg.Pods.CRxdrop != "" {
			k = kinds[len(kinds)-1]
		}
		if ring := defaultRing(cfg) / uint32(n); n > 1 && ring >= 64 && ring&(ring-1) == 0 {
			k = k.withRing(ring)
			rs = append(rs, receiver{name: k.name, queues: n, ring: ring, pod: true, start: pd.startPod(k, n, cfg)})
		}
	}
	return rs
}

// defaultRing is the clients' default ring size (the C client's is
// pkg/client's).
func defaultRing(cfg Config) uint32 {
	if cfg.Jumbo() {
		return client.DefaultRingMultiBuffer
	}
	return client.DefaultRing
}

// perfReceived adds up xdpqperf's "total qN: rx M tx K" lines.
func perfReceived(out string) (uint64, error) {
	t, ok := perf.ParseTotals(out)
	if !ok {
		return 0, errors.New("xdpqperf printed no total")
	}
	return t.Received(), nil
}

// perfAway reads xdpqperf's "away qN: longest Kus" lines: the longest of
// its queues.
func perfAway(out string) (time.Duration, bool) {
	t, _ := perf.ParseTotals(out)
	if len(t.Away) == 0 {
		return 0, false
	}
	return slices.Max(t.Away), true
}

// cAway reads xdpq-rxdrop's "away: longest Kus" line.
func cAway(out string) (time.Duration, bool) {
	for line := range strings.Lines(out) {
		var us int64
		if _, err := fmt.Sscanf(line, "away: longest %dus", &us); err == nil {
			return time.Duration(us) * time.Microsecond, true
		}
	}
	return 0, false
}

// cReceived reads xdpq-rxdrop's "total: N frames, ..." line.
func cReceived(out string) (uint64, error) {
	for _, line := range strings.Split(out, "\n") {
		var n uint64
		if _, err := fmt.Sscanf(line, "total: %d frames", &n); err == nil {
			return n, nil
		}
	}
	return 0, errors.New("xdpq-rxdrop printed no total")
}

// startPod puts the pool in force, allocates queues 0..n-1 for uid 65534
// and starts the pod on them, pinned to the receive core; it is running
// once the pod says so. Finishing it reads its sockets' counters from the
// daemon's metrics while it still holds them, stops it with SIGTERM,
// reads what it counted, frees the allocation and removes the pool.
func (pd *podDaemon) startPod(k podKind, n int, cfg Config) func(*testnet.Pair) (*running, error) {
	return func(p *testnet.Pair) (r *running, err error) {
		if err := pd.setPool(&k); err != nil {
			return nil, err
		}
		var alloc *api.Allocation
		defer func() {
			if err == nil {
				return
			}
			if alloc != nil {
				err = errors.Join(err, pd.d.API().Free(context.Background(), alloc.ID))
			}
			err = errors.Join(err, pd.setPool(nil))
		}()
		alloc, err = pd.d.API().Alloc(context.Background(), api.AllocRequest{Pool: "bench", Count: n, UID: podUID})
		if err != nil {
			return nil, fmt.Errorf("allocate %d queues: %w", n, err)
		}
		for i, q := range alloc.Queues {
			if q != uint32(i) { // the sender sends on B's queues 0..n-1
				return nil, fmt.Errorf("allocation %s has queues %v, want 0..%d", alloc.ID, alloc.Queues, n-1)
			}
		}
		path, args := k.command(cfg.Pods)
		out := newPodOutput(k.ready)
		pod, err := startPinned(cfg.RxCPU, path, args, []string{"XDPQ_SOCKET=" + alloc.Socket}, out)
		if err != nil {
			return nil, err
		}
		exited := make(chan error, 1)
		go func() { exited <- pod.Wait() }()
		select {
		case <-out.ready:
		case err := <-exited:
			return nil, fmt.Errorf("pod exited before it was ready (%v):\n%s", err, out.String())
		case <-time.After(30 * time.Second):
			_ = pod.Cmd.Process.Kill() // given up; a pod that exited meanwhile says so next
			return nil, fmt.Errorf("pod not ready within 30 s (%v):\n%s", <-exited, out.String())
		}
		pid := pod.Cmd.Process.Pid
		if err := checkPod(pid, cfg.RxCPU); err != nil {
			_ = pod.Cmd.Process.Kill() // given up; a pod that exited meanwhile says so next
			return nil, fmt.Errorf("%w (pod: %v)", err, <-exited)
		}
		tasks := fmt.Sprintf("/proc/%d/task/*/schedstat", pid)
		waited0, err := schedstat(tasks, runnable)
		if err != nil {
			_ = pod.Cmd.Process.Kill() // given up; a pod that exited meanwhile says so next
			return nil, fmt.Errorf("%w (pod: %v)", err, <-exited)
		}
		return &running{
			// The process's, not its threads' now: a Go pod makes and
			// ends threads as its loops block in poll.
			cpu: func() (time.Duration, error) { return processCPU(pid) },
			finish: func() (outcome, error) {
				drops, errDrops := pd.drops(n)
				// Its threads' waits for the core: exact for the C
				// client's one thread; a Go pod's threads that ended
				// are left out.
				waited1, errWaited := schedstat(tasks, runnable)
				wait := max(waited1-waited0, 0)
				// A pod that exited already fails the signal, and its exit
				// below says how it went.
				_ = pod.Cmd.Process.Signal(syscall.SIGTERM)
				var errExit error
				select {
				case errExit = <-exited:
				case <-time.After(10 * time.Second):
					_ = pod.Cmd.Process.Kill() // a pod that exited meanwhile says so next
					errExit = fmt.Errorf("did not exit within 10 s of SIGTERM (%v)", <-exited)
				}
				if errExit != nil {
					errExit = fmt.Errorf("pod: %w\n%s", errExit, out.String())
				}
				received, errCount := k.received(out.String())
				if errCount != nil {
					errCount = fmt.Errorf("%w:\n%s", errCount, out.String())
				}
				err := errors.Join(errDrops, errWaited, errExit, errCount, pd.d.API().Free(context.Background(), alloc.ID), pd.setPool(nil))
				o := outcome{received: received, drops: &drops, waited: &wait}
				if k.away != nil {
					if a, ok := k.away(out.String()); ok {
						o.away = &a
					}
				}
				return o, err
			},
		}, nil
	}
}

// startPinned starts the pod program as handover.StartProgram does (uid
// 65534, no capabilities, a network namespace of its own) from a thread
// pinned to cpu: the child inherits the thread's affinity, and so every
// thread it makes.
func startPinned(cpu int, path string, args, env []string, out io.Writer) (*handover.Pod, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var was unix.CPUSet
	if err := unix.SchedGetaffinity(0, &was); err != nil {
		return nil, fmt.Errorf("affinity: %w", err)
	}
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("pin to cpu %d: %w", cpu, err)
	}
	// The thread must live on after this (the child's Pdeathsig is the
	// thread's): it is unpinned and unlocked, not left to exit.
	pod, err := handover.StartProgram(path, args, env, out, out)
	if errRestore := unix.SchedSetaffinity(0, &was); errRestore != nil {
		if err == nil {
			pod.Kill()
		}
		return nil, errors.Join(err, fmt.Errorf("restore affinity: %w", errRestore))
	}
	return pod, err
}

// checkPod checks that the pod runs as uid 65534 with no capability,
// pinned to cpu.
func checkPod(pid, cpu int) error {
	var id handover.Msg
	if err := handover.IdentityOf(strconv.Itoa(pid), &id); err != nil {
		return fmt.Errorf("pod identity: %w", err)
	}
	if id.UID != strconv.Itoa(podUID) || strings.Trim(id.CapEff, "0") != "" {
		return fmt.Errorf("pod runs as uid %s with capabilities %s, want uid %d and none", id.UID, id.CapEff, podUID)
	}
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(pid, &set); err != nil {
		return fmt.Errorf("pod affinity: %w", err)
	}
	if set.Count() != 1 || !set.IsSet(cpu) {
		return fmt.Errorf("pod runs on %d cpus, want cpu %d only", set.Count(), cpu)
	}
	return nil
}

// drops reads the kernel's counters of the pod's sockets on A's queues
// 0..n-1 from the daemon's metrics (it keeps a copy of each socket while
// the lease lasts).
func (pd *podDaemon) drops(n int) (Drops, error) {
	var d Drops
	resp, err := http.Get(pd.metrics)
	if err != nil {
		return d, fmt.Errorf("daemon metrics: %w", err)
	}
	defer func() { _ = resp.Body.Close() }() // read to its end, or its status is the answer
	if resp.StatusCode != http.StatusOK {
		return d, fmt.Errorf("daemon metrics: %s", resp.Status)
	}
	fields := map[string]*uint64{
		"xdpq_socket_rx_dropped_frames_total":   &d.RXDropped,
		"xdpq_socket_rx_ring_full_frames_total": &d.RingFull,
		"xdpq_socket_fill_ring_empty_total":     &d.FillEmpty,
	}
	seen := map[string]int{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		// name{netdev="xa",queue="0"} 12
		name, rest, ok := strings.Cut(sc.Text(), "{")
		v := fields[name]
		if !ok || v == nil {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok || !strings.Contains(labels, `netdev="`+pd.pair.A.Name+`"`) {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return d, fmt.Errorf("daemon metrics: %q: %w", sc.Text(), err)
		}
		*v += uint64(f)
		seen[name]++
	}
	if err := sc.Err(); err != nil {
		return d, fmt.Errorf("daemon metrics: %w", err)
	}
	for name := range fields {
		if seen[name] != n {
			return d, fmt.Errorf("daemon metrics: %d sockets in %s, want %d", seen[name], name, n)
		}
	}
	return d, nil
}

// podOutput collects what a pod prints (stdout and stderr: exec writes
// them from one goroutine) and closes ready when marker shows.
type podOutput struct {
	marker []byte
	ready  chan struct{}
	mu     sync.Mutex // guards buf and seen
	buf    bytes.Buffer
	seen   bool
}

func newPodOutput(marker string) *podOutput {
	return &podOutput{marker: []byte(marker), ready: make(chan struct{})}
}

func (o *podOutput) Write(b []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf.Write(b)
	if !o.seen && bytes.Contains(o.buf.Bytes(), o.marker) {
		o.seen = true
		close(o.ready)
	}
	return len(b), nil
}

func (o *podOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}
