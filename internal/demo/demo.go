// Package demo is the datapath demo that `make demo` runs: a veth "NIC"
// with 4 queues in its own network namespace, xdpq's direct program on it,
// and an unprivileged pod (uid 65534, no capabilities, a netns with only
// lo) that receives two bound AF_XDP sockets over a Unix socket and counts
// the traffic a source sends to its queues, printing a line per second.
// It leaves nothing behind.
package demo

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/handover"
	"github.com/xdpq/xdpq/internal/testnet"
	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/xdp"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// PodEnv, set in the environment, makes the demo binary act as the pod.
const PodEnv = "XDPQ_DEMO_POD=1"

const (
	nicQueues  = 4
	podFrames  = 4096 // 8 MiB of UMEM in 2 KiB frames
	podPerSock = podFrames / 2
	frameBytes = 64
)

var podRings = xsk.Rings{Fill: 2048, Completion: 64, RX: 2048}

// Run runs the demo for seconds seconds of traffic, writing to out.
func Run(out io.Writer, seconds int) (err error) {
	if os.Geteuid() != 0 {
		return errors.New("the demo needs root: it creates a network namespace and attaches XDP programs (sudo make demo)")
	}
	say := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }
	var uname unix.Utsname
	unix.Uname(&uname)
	say("xdpq datapath demo on Linux %s", unix.ByteSliceToString(uname.Release[:]))

	p, err := testnet.Create(nicQueues)
	if err != nil {
		return err
	}
	defer func() {
		p.Close()
		if err != nil {
			return
		}
		if _, serr := os.Stat(p.NS.Path()); !os.IsNotExist(serr) {
			err = fmt.Errorf("netns %s still there after cleanup: %v", p.NS.Path(), serr)
			return
		}
		say("[6/6] netns and veth pair removed; nothing left behind")
	}()
	nsPath := p.NSPath()
	say("[1/6] netns %s: veth %q (the NIC, %d queues, %s) <-> %q (the traffic source)",
		p.NS.Path(), p.A.Name, nicQueues, p.A.Addr, p.B.Name)

	prog, err := xdp.Load(xdp.Direct, xdp.LoadOptions{Queues: nicQueues})
	if err != nil {
		return err
	}
	defer prog.Close()
	mode, err := xdp.Attach(nsPath, p.A.Index, prog.Prog(), xdp.ModeAuto)
	if err != nil {
		return err
	}
	defer xdp.Detach(nsPath, p.A.Index, mode, prog.Prog())
	say("[2/6] %s attached to %s: %s", xdp.DirectName, p.A.Name, describe(nsPath, p.A.Index))

	var podErr bytes.Buffer
	pod, err := handover.StartPod(nil, PodEnv, nil, &podErr)
	if err != nil {
		return err
	}
	defer pod.Kill()
	conn := pod.Conn
	conn.SetDeadline(time.Now().Add(time.Duration(seconds+30) * time.Second))
	podFail := func(err error) error {
		pod.Kill() // waits, so podErr is complete and no longer written
		return fmt.Errorf("%w\npod stderr:\n%s", err, podErr.String())
	}
	_, fds, err := handover.Expect(conn, "umem", 1)
	if err != nil {
		return podFail(err)
	}
	queues := []uint32{0, 1}
	dev := xsk.Netdev{Name: p.A.Name, Ifindex: p.A.Index, NetNS: nsPath}
	bound, err := xsk.Bind(dev, fds[0], queues, xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048}, Rings: podRings})
	unix.Close(fds[0])
	if err != nil {
		return err
	}
	var sockFDs []int
	for _, b := range bound {
		sockFDs = append(sockFDs, b.FD)
	}
	err = handover.Send(conn, handover.Msg{Step: "sockets", Queues: queues, Rings: podRings}, sockFDs...)
	if err != nil {
		return podFail(err)
	}
	ready, _, err := handover.Expect(conn, "ready", 0)
	if err != nil {
		return podFail(err)
	}
	say("[3/6] pod started: uid %s, CapEff %s, netns links %v; it allocated an %d MiB memfd UMEM",
		ready.UID, ready.CapEff, ready.Links, podFrames*2048>>20)
	for _, b := range bound {
		if err := prog.SetSocket(b.Queue, b.FD); err != nil {
			return err
		}
		unix.Close(b.FD) // the pod holds the only reference now
	}
	zc := map[bool]string{true: "zero-copy", false: "copy mode"}[bound[0].ZeroCopy]
	say("[4/6] bound %s/q0 and %s/q1 (%s) sharing the pod's UMEM; handed over; in the XSKMAP once the pod's fill rings were full",
		p.A.Name, p.A.Name, zc)

	say("[5/6] source sends %d-byte UDP frames to %s:5000 on its queues 0 and 1 for %ds", frameBytes, p.A.Addr, seconds)
	senders, err := newSource(p, queues)
	if err != nil {
		return err
	}
	defer senders.close()
	var stop atomic.Bool
	var wg sync.WaitGroup
	sent := make([]uint64, len(queues))
	sendErr := make([]error, len(queues))
	for i := range queues {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sent[i], sendErr[i] = traffic.Flood(senders.socks[i], senders.addrs[i], uint32(len(senders.frame)), 256, stop.Load)
		}()
	}
	var last []uint64
	lastAt := time.Now()
	for tick := 1; tick <= seconds; tick++ {
		m, _, err := handover.Expect(conn, "stats", 0)
		if err != nil {
			stop.Store(true)
			wg.Wait()
			return podFail(err)
		}
		now := time.Now()
		line := fmt.Sprintf("  %2ds ", tick)
		for i, c := range m.Counts {
			prev := uint64(0)
			if last != nil {
				prev = last[i]
			}
			line += fmt.Sprintf("  q%d %7.1f kpps", queues[i], float64(c-prev)/now.Sub(lastAt).Seconds()/1e3)
		}
		say("%s   | %s", line, describe(nsPath, p.A.Index))
		last, lastAt = m.Counts, now
	}
	stop.Store(true)
	wg.Wait()
	if err := errors.Join(sendErr...); err != nil {
		return err
	}
	if err := handover.Send(conn, handover.Msg{Step: "exit"}); err != nil {
		return podFail(err)
	}
	final, _, err := handover.Expect(conn, "final", 0)
	if err != nil {
		return podFail(err)
	}
	if err := pod.Wait(); err != nil {
		return podFail(fmt.Errorf("pod: %w", err))
	}
	var total, got, dropped uint64
	for i := range queues {
		total += sent[i]
		got += final.Counts[i]
		dropped += final.Dropped[i]
	}
	say("      source sent %d frames: the pod received %d, the kernel dropped %d for a full RX ring (the pod shares 2 cores with the source)",
		total, got, dropped)

	// The pod is gone, so are its sockets and XSKMAP entries: the direct
	// program passes the queue's frames to the kernel stack again.
	n, err := toKernel(p, senders)
	if err != nil {
		return err
	}
	say("      pod exited: its XSKMAP entries went with its sockets; %d of 10 frames on q0 now reach a kernel UDP socket", n)
	if err := xdp.Detach(nsPath, p.A.Index, mode, prog.Prog()); err != nil {
		return err
	}
	say("      no socket left: %s detached (%s)", xdp.DirectName, describe(nsPath, p.A.Index))
	return nil
}

func describe(nsPath string, ifindex int) string {
	a, err := xdp.Query(nsPath, ifindex)
	switch {
	case err != nil:
		return "query failed: " + err.Error()
	case a == nil:
		return "no XDP program"
	case a.Ours:
		return fmt.Sprintf("%s id %d, %s mode, xdpq's", a.Name, a.ID, a.Mode)
	}
	return fmt.Sprintf("%s id %d, %s mode, foreign", a.Name, a.ID, a.Mode)
}

// source is the traffic source: one socket per queue on B, sharing a UMEM
// whose frames all hold the same UDP frame.
type source struct {
	umem  *xsk.UMEM
	socks []*xsk.Socket
	addrs [][]uint64
	frame []byte
}

func newSource(p *testnet.Pair, queues []uint32) (*source, error) {
	dev := xsk.Netdev{Name: p.B.Name, Ifindex: p.B.Index, NetNS: p.NSPath()}
	per := 1024
	umem, socks, err := xsk.Open(dev, queues, per*len(queues), xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048},
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
	for i := range queues {
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

// toKernel sends 10 frames on the source's queue 0 and counts how many a
// kernel UDP socket on the NIC receives.
func toKernel(p *testnet.Pair, s *source) (int, error) {
	var c *net.UDPConn
	err := p.NS.Do(func(ns.NetNS) (err error) {
		c, err = net.ListenUDP("udp4", &net.UDPAddr{IP: p.A.Addr.AsSlice(), Port: 5000})
		return err
	})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	frames := make([][]byte, 10)
	for i := range frames {
		frames[i] = s.frame
	}
	if err := traffic.NewSender(s.socks[0], s.addrs[0], 0).Send(frames, time.Now().Add(5*time.Second)); err != nil {
		return 0, err
	}
	n := 0
	buf := make([]byte, 2048)
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	for n < len(frames) {
		if _, err := c.Read(buf); err != nil {
			break
		}
		n++
	}
	return n, nil
}

// Pod is the pod side: run by the demo binary when PodEnv is set.
func Pod() error {
	conn, err := handover.PodConn()
	if err != nil {
		return err
	}
	defer conn.Close()
	mf, err := xsk.NewMemfd("pod-umem", podFrames*2048, false)
	if err != nil {
		return err
	}
	umem, err := xsk.MapUMEM(int(mf.Fd()), xsk.UMEMConfig{FrameSize: 2048})
	if err != nil {
		mf.Close()
		return err
	}
	defer umem.Close()
	err = handover.Send(conn, handover.Msg{Step: "umem"}, int(mf.Fd()))
	mf.Close()
	if err != nil {
		return err
	}
	m, fds, err := handover.Expect(conn, "sockets", 2)
	if err != nil {
		return err
	}
	var recvs []*traffic.Receiver
	var socks []*xsk.Socket
	for i, fd := range fds {
		s, err := xsk.Adopt(fd, umem, m.Rings)
		if err != nil {
			for _, fd := range fds[i:] {
				unix.Close(fd)
			}
			return err
		}
		defer s.Close()
		socks = append(socks, s)
		addrs := make([]uint64, podPerSock)
		for j := range addrs {
			addrs[j] = umem.FrameAddr(i*podPerSock + j)
		}
		r, err := traffic.NewReceiver(s, addrs)
		if err != nil {
			return err
		}
		recvs = append(recvs, r)
	}
	ready := handover.Msg{Step: "ready"}
	if err := handover.Identity(&ready); err != nil {
		return err
	}
	if err := handover.Send(conn, ready); err != nil {
		return err
	}

	counts := make([]atomic.Uint64, len(recvs))
	var stop atomic.Bool
	var wg sync.WaitGroup
	for i, r := range recvs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				r.Receive(-1, time.Now().Add(100*time.Millisecond), func([]byte) error {
					counts[i].Add(1)
					return nil
				})
			}
		}()
	}
	snapshot := func(step string) handover.Msg {
		m := handover.Msg{Step: step}
		for i := range counts {
			m.Counts = append(m.Counts, counts[i].Load())
			st, _ := socks[i].Statistics()
			m.Dropped = append(m.Dropped, st.RXRingFull+st.RXDropped)
		}
		return m
	}
	exit := make(chan error, 1)
	go func() {
		_, _, err := handover.Expect(conn, "exit", 0)
		exit <- err
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case err := <-exit:
			stop.Store(true)
			wg.Wait()
			if err != nil {
				return err
			}
			return handover.Send(conn, snapshot("final"))
		case <-tick.C:
			if err := handover.Send(conn, snapshot("stats")); err != nil {
				stop.Store(true)
				wg.Wait()
				return err
			}
		}
	}
}
