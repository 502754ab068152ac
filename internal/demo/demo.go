// Package demo is what `make demo` runs: one xdpq node in a network
// namespace with a veth "NIC" of 4 queues; the node agent and the socket
// broker serving an allocation of two queues; and xdpqperf as the pod,
// running as uid 65534 with no capabilities in a network namespace that
// holds only lo, taking its sockets from the broker and printing what it
// receives each second while a traffic source sends to its queues. Then
// the pod exits, its lease ends, the program goes, and nothing is left.
package demo

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/handover"
	"github.com/xdpq/xdpq/internal/node"
	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/xdp"
	"github.com/xdpq/xdpq/pkg/xsk"
)

const frameBytes = 64

// Run runs the demo with the xdpqperf binary at perf for seconds seconds
// of traffic, writing to out.
func Run(out io.Writer, perf string, seconds int) (err error) {
	if os.Geteuid() != 0 {
		return errors.New("the demo needs root: it creates a network namespace and attaches XDP programs (sudo make demo)")
	}
	if _, err := os.Stat(perf); err != nil {
		return fmt.Errorf("xdpqperf: %w (make demo builds it)", err)
	}
	var mu sync.Mutex // out is written by the pod's output copier too
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, format+"\n", args...)
	}
	var uname unix.Utsname
	unix.Uname(&uname)
	say("xdpq demo on Linux %s", unix.ByteSliceToString(uname.Release[:]))

	podUID := uint32(65534)
	n, err := node.Start(node.Config{Queues: 4, Alloc: []uint32{0, 1}, Owner: broker.Owner{UID: &podUID},
		Policy: agent.Policy{Steering: agent.SteerHardware}, Linger: time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return err
	}
	nsPath := n.Pair.NSPath()
	defer func() {
		if cerr := n.Close(); cerr != nil && err == nil {
			err = cerr
		}
		if err != nil {
			return
		}
		if _, serr := os.Stat(nsPath); !os.IsNotExist(serr) {
			err = fmt.Errorf("netns %s still there after cleanup: %v", nsPath, serr)
			return
		}
		say("[6/6] node stopped: netns, veth pair, pins and the allocation's socket removed; nothing left behind")
	}()
	say("[1/6] netns %s: veth %q (the NIC, 4 queues, %s) <-> %q (the traffic source)", nsPath, "xa", n.Pair.A.Addr, "xb")
	say("[2/6] agent manages xa (%s); broker serves allocation %s: xa queues %v, owner uid %d, socket %s",
		describe(nsPath, n.Pair.A.Index), n.Alloc.ID, n.Alloc.Queues, podUID, n.Alloc.SocketPath())

	var podErr bytes.Buffer
	pr, pw := io.Pipe()
	pod, err := handover.StartProgram(perf, []string{"-mode", "rxdrop", "-duration", strconv.Itoa(seconds+1) + "s", "-ring", "2048"},
		[]string{"XDPQ_SOCKET=" + n.Alloc.SocketPath()}, pw, &podErr)
	if err != nil {
		return err
	}
	defer pod.Kill()
	copied := make(chan struct{})
	var received uint64 // from xdpqperf's "total qN: rx M tx K" lines
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var q, rx, tx uint64
			if _, err := fmt.Sscanf(sc.Text(), "total q%d: rx %d tx %d", &q, &rx, &tx); err == nil {
				received += rx
			}
			say("   pod | %s", sc.Text())
		}
	}()
	if err := n.WaitSockets(2, 10*time.Second); err != nil {
		pod.Kill()
		return fmt.Errorf("%w\npod stderr:\n%s", err, podErr.String())
	}
	var id handover.Msg
	if err := handover.IdentityOf(strconv.Itoa(pod.Cmd.Process.Pid), &id); err != nil {
		return err
	}
	say("[3/6] pod: xdpqperf as uid %s, CapEff %s, netns links %v; it sent its own memfd as UMEM",
		id.UID, id.CapEff, id.Links)
	say("[4/6] its lease is active: xa queues %v in the XSKMAP; %s", n.Sockets(), describe(nsPath, n.Pair.A.Index))

	say("[5/6] the source sends %d-byte UDP frames to %s:5000 on its queues 0 and 1 for %ds", frameBytes, n.Pair.A.Addr, seconds)
	src, err := newSource(n)
	if err != nil {
		return err
	}
	defer src.close()
	var stop atomic.Bool
	var wg sync.WaitGroup
	sent := make([]uint64, 2)
	sendErr := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sent[i], sendErr[i] = traffic.Flood(src.socks[i], src.addrs[i], uint32(len(src.frame)), 256, stop.Load)
		}()
	}
	time.Sleep(time.Duration(seconds) * time.Second)
	stop.Store(true)
	wg.Wait()
	if err := errors.Join(sendErr...); err != nil {
		return err
	}
	err = pod.Wait()
	pw.Close()
	<-copied
	if err != nil {
		return fmt.Errorf("pod: %w\n%s", err, podErr.String())
	}
	total := sent[0] + sent[1]
	say("      the source sent %d frames, the pod received %d (%.0f%%); the kernel dropped the rest when the pod",
		total, received, 100*float64(received)/float64(max(total, 1)))
	say("      fell behind (fill-empty): pod, source and softirq share this machine's 2 cores")
	say("      the pod exited and its lease ended")
	if err := n.WaitSockets(0, 5*time.Second); err != nil {
		return err
	}
	say("      no socket left on xa: after the 1s linger, %s", waitDetached(nsPath, n.Pair.A.Index))
	return nil
}

func waitDetached(nsPath string, ifindex int) string {
	deadline := time.Now().Add(5 * time.Second)
	for {
		a, err := xdp.Query(nsPath, ifindex)
		if (err == nil && a == nil) || time.Now().After(deadline) {
			return describe(nsPath, ifindex)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func describe(nsPath string, ifindex int) string {
	a, err := xdp.Query(nsPath, ifindex)
	switch {
	case err != nil:
		return "query failed: " + err.Error()
	case a == nil:
		return "no XDP program on xa"
	case a.Ours:
		return fmt.Sprintf("%s (id %d) attached in %s mode", a.Name, a.ID, a.Mode)
	}
	return fmt.Sprintf("foreign program %s (id %d) in %s mode", a.Name, a.ID, a.Mode)
}

// source is the traffic source: one socket per queue on xb, sharing a
// UMEM whose frames all hold the same UDP frame.
type source struct {
	umem  *xsk.UMEM
	socks []*xsk.Socket
	addrs [][]uint64
	frame []byte
}

func newSource(n *node.Node) (*source, error) {
	p := n.Pair
	dev := xsk.Netdev{Name: p.B.Name, Ifindex: p.B.Index, NetNS: p.NSPath()}
	const per = 1024
	umem, socks, err := xsk.Open(dev, []uint32{0, 1}, 2*per, xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048},
		Rings: xsk.Rings{Fill: 64, Completion: 1024, TX: 1024}})
	if err != nil {
		return nil, err
	}
	f, err := frame.Spec{SrcMAC: p.B.MAC, DstMAC: p.A.MAC, Src: p.B.Addr, Dst: p.A.Addr, Protocol: 17,
		SrcPort: 4000, DstPort: 5000, Payload: frame.Payload(0, 0, frameBytes-42)}.Build()
	if err != nil {
		return nil, err
	}
	s := &source{umem: umem, socks: socks, frame: f}
	for i := range 2 {
		var addrs []uint64
		for j := range per {
			a := umem.FrameAddr(i*per + j)
			copy(umem.Bytes(a, uint32(len(f))), f)
			addrs = append(addrs, a)
		}
		s.addrs = append(s.addrs, addrs)
	}
	return s, nil
}

func (s *source) close() {
	for _, k := range s.socks {
		k.Close()
	}
	s.umem.Close()
}
