package bench

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/xdpq/xdpq/internal/testing/testnet"
)

// txResult is one transmitter's measurements, one per round.
type txResult struct {
	Name   string
	Queues int
	// Rate is the frames per second that reached B; Said what the
	// transmitter counted as sent.
	Rate, Said []float64
	// CoreNS is the transmitter's core busy per frame at B (it runs B's
	// receive side too, on veth); CPUNS its own CPU time per frame.
	CoreNS, CPUNS []float64
}

// transmitters are the TX rows at n queues: testpmd's txonly and a pod's
// xdpqperf txpush, both sending from A's queues 0..n-1 to B.
func (pd *podDaemon) transmitters(cfg Config, n int) []receiver {
	var rs []receiver
	if cfg.Testpmd != "" {
		rs = append(rs, receiver{name: "DPDK af_xdp PMD txonly", queues: n, spins: true, start: startTestpmd(cfg, "txonly", n)})
	}
	if pd != nil && cfg.Pods.Perf != "" {
		a, b := pd.pair.A, pd.pair.B
		args := []string{"-mode", "txpush", "-size", fmt.Sprint(cfg.FrameSize), "-src-mac", a.MAC.String(), "-dst-mac", b.MAC.String(),
			"-src", a.Addr.String(), "-dst", b.Addr.String()}
		k := podKind{name: "pod: xdpqperf txpush", tx: true, command: func(p Pods) (string, []string) { return p.Perf, args },
			ready: "xdpqperf txpush: allocation", received: perfSent}
		rs = append(rs, receiver{name: k.name, queues: n, pod: true, start: pd.startPod(k, n, cfg)})
	}
	return rs
}

// measureTX lets transmitter r run for the run's duration and counts on
// B what reaches it.
func measureTX(p *testnet.Pair, r receiver, cfg Config) (txMeasure, error) {
	var m txMeasure
	back, err := startCounter(p.NSPath(), p.B.Index)
	if err != nil {
		return m, err
	}
	run, err := r.start(p)
	if err != nil {
		return m, errors.Join(err, back.close())
	}
	var errs []error
	cpu := func() time.Duration {
		if run.cpu == nil {
			return 0
		}
		c, err := run.cpu()
		errs = append(errs, err)
		return c
	}
	cpu0 := cpu()
	f0, err0 := cpuBusy(cfg.RxCPU)
	b0, err1 := back.count()
	start := time.Now()
	// The measurement's window, the transmitter sending all along: a
	// duration measured, not a wait for something to happen.
	time.Sleep(cfg.Duration)
	b1, err2 := back.count()
	f1, err3 := cpuBusy(cfg.RxCPU)
	cpu1 := cpu()
	elapsed := time.Since(start)
	out, err4 := run.finish()
	errs = append(errs, err0, err1, err2, err3, err4, back.close())
	if err := errors.Join(errs...); err != nil {
		return m, err
	}
	// The transmitter's own count covers its whole run, from before the
	// window to its end: it is given per second of that run, roughly the
	// window plus the start and stop.
	n := float64(max(b1-b0, 1))
	m = txMeasure{rate: float64(b1-b0) / elapsed.Seconds(), said: float64(out.received), coreNS: float64(f1-f0) / n}
	if run.cpu != nil {
		ns := float64(cpu1-cpu0) / n
		m.cpu = &ns
	}
	return m, nil
}

type txMeasure struct {
	rate, said, coreNS float64
	cpu                *float64
}

// runTX measures the transmitters at 1 queue and at n, interleaved round
// by round, and prints their table.
func runTX(p *testnet.Pair, pd *podDaemon, cfg Config, n int, place func(pod bool) error) ([]*txResult, error) {
	var rows []receiver
	for _, q := range slices.Compact([]int{1, n}) {
		rows = append(rows, pd.transmitters(cfg, q)...)
	}
	results := make([]*txResult, len(rows))
	for i, r := range rows {
		results[i] = &txResult{Name: r.name, Queues: r.queues}
	}
	fmt.Fprintf(cfg.Out, "\ntransmit: the transmitter on A's queues 0..N-1, on the receivers' core, sends %d-byte frames as fast as it can (testpmd --forward-mode=txonly on one lcore; the pod from a pool with allowTX); an XDP program on B counts what arrives over %v\n",
		cfg.FrameSize, cfg.Duration)
	for round := range cfg.Rounds {
		for i, r := range rows {
			if err := place(r.pod); err != nil {
				return nil, err
			}
			m, err := measureTX(p, r, cfg)
			if err != nil {
				return nil, fmt.Errorf("transmit: %s, %d queues, round %d: %w", r.name, r.queues, round+1, err)
			}
			res := results[i]
			res.Rate, res.CoreNS = append(res.Rate, m.rate), append(res.CoreNS, m.coreNS)
			cpu := "-"
			if m.cpu != nil {
				res.CPUNS = append(res.CPUNS, *m.cpu)
				cpu = fmt.Sprintf("%.0f", *m.cpu)
			}
			fmt.Fprintf(cfg.Out, "  round %d  %-34s q%d %8.3f Mpps at B, %d frames in all by its count, core %5.0f ns/frame, transmitter %s\n",
				round+1, r.name, r.queues, m.rate/1e6, uint64(m.said), m.coreNS, cpu)
		}
	}
	printTX(cfg.Out, results)
	return results, nil
}

func printTX(w io.Writer, rs []*txResult) {
	fmt.Fprintf(w, "\ntransmit, medians of the rounds: Mpps at B; ns per frame at B: the transmitter's core busy (with B's receive side, on veth), and the transmitter's own CPU\n")
	fmt.Fprintf(w, "%-34s %2s %9s %10s %12s %10s\n", "transmitter (median)", "q", "Mpps at B", "core ns", "transmitter", "vs DPDK")
	for _, r := range rs {
		vs := "-"
		for _, d := range rs {
			if d != r && d.Queues == r.Queues && d.Name == "DPDK af_xdp PMD txonly" {
				vs = fmt.Sprintf("%.2f, %.2f", Ratio(r.Rate, d.Rate), Ratio(r.CPUNS, d.CPUNS))
			}
		}
		cpu := "-"
		if r.CPUNS != nil {
			cpu = fmt.Sprintf("%.0f", Median(r.CPUNS))
		}
		fmt.Fprintf(w, "%-34s %2d %9.3f %10.0f %12s %10s\n", r.Name, r.Queues, Median(r.Rate)/1e6, Median(r.CoreNS), cpu, vs)
	}
	fmt.Fprintln(w, "(vs DPDK: rate, and own CPU per frame, each the median of the rounds' ratios to DPDK's row at the same queue count; DPDK spins)")
}
