package agent_test

import (
	"slices"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/agent"
)

// BenchmarkReattach measures the time from the removal of a foreign
// program to xdpq's program being attached again, as the kernel reports it
// (RTM_NEWLINK with xdpq's program id). Run it with -benchtime 100x for
// 100 trials; it reports the median and 99th percentile.
func BenchmarkReattach(b *testing.B) {
	p := testnet.NewPair(b, 4)
	a := start(b, p, time.Second)
	if err := a.Set(p.A.Name, agent.Policy{Steering: agent.SteerHardware}); err != nil {
		b.Fatal(err)
	}
	s0, _ := socket(b, p, 0)
	if err := a.AddSocket(p.A.Name, 0, s0.FD()); err != nil {
		b.Fatal(err)
	}
	ours := waitState(b, a, p.A.Name, agent.StateDirect).Program

	h, err := netns.GetFromPath(p.NSPath())
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	updates := make(chan netlink.LinkUpdate, 256)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{Namespace: &h}); err != nil {
		b.Fatal(err)
	}
	// waitProg waits for a notification that prog id is attached to A.
	waitProg := func(pred func(id uint32) bool) time.Time {
		timeout := time.After(5 * time.Second)
		for {
			select {
			case u := <-updates:
				if u.Attrs().Index == p.A.Index && u.Attrs().Xdp != nil && pred(u.Attrs().Xdp.ProgId) {
					return time.Now()
				}
			case <-timeout:
				b.Fatal("no notification of the expected program")
			}
		}
	}
	var d []time.Duration
	b.ResetTimer()
	for range b.N {
		ip(b, p, "-force", "link", "set", "dev", p.A.Name, "xdpdrv", "obj", operatorObj, "sec", "xdp")
		waitProg(func(id uint32) bool { return id != 0 && id != uint32(ours) })
		waitState(b, a, p.A.Name, agent.StateOverridden)
		var t0 time.Time
		err := p.NS.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByIndex(p.A.Index)
			if err != nil {
				return err
			}
			t0 = time.Now()
			return netlink.LinkSetXdpFdWithFlags(l, -1, unix.XDP_FLAGS_DRV_MODE)
		})
		if err != nil {
			b.Fatal(err)
		}
		t1 := waitProg(func(id uint32) bool { return id == uint32(ours) })
		d = append(d, t1.Sub(t0))
	}
	b.StopTimer()
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(d[(len(d)*99)/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(d[len(d)-1].Microseconds()), "max-µs")
}
