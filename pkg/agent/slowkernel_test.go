package agent_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/xdp"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// slowHook is the kernel's XDP hook, but an attach to one netdev
// (ifindex) first calls slow: a NIC whose attach reconfigures its rings
// (hundreds of milliseconds on i40e, ice, mlx5), which veth cannot be.
type slowHook struct {
	agent.KernelHook
	ifindex int
	slow    func()
}

func (h slowHook) Attach(netns string, ifindex int, prog *ebpf.Program, mode xdp.Mode) (xdp.Mode, error) {
	if ifindex == h.ifindex {
		h.slow()
	}
	return h.KernelHook.Attach(netns, ifindex, prog, mode)
}

// rxSocket opens a receiving socket on queue of l, closed when the test
// ends.
func rxSocket(t testing.TB, p *testnet.Pair, l testnet.Link, queue uint32) *xsk.Socket {
	t.Helper()
	s, _ := openXSK(t, p, l, queue, 64, xsk.Rings{Fill: 64, Completion: 16, RX: 64})
	return s
}

// TestSlowAttachStallsNoOtherNetdev: while the attach on one netdev is
// under way in the kernel (held here until the test lets it go), Status
// answers, and a socket is added on another netdev, whose program is
// attached: the kernel work of one netdev is done outside the agent's
// lock. (Before, reconcile ran under it: every lease and status on every
// netdev waited for the slowest NIC.)
func TestSlowAttachStallsNoOtherNetdev(t *testing.T) {
	p := testnet.NewPair(t, 4)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	a := startWith(t, agent.Config{NetNS: p.NSPath(), PinDir: pinDir(t), Linger: time.Hour, StateDir: t.TempDir(),
		Hook: slowHook{ifindex: p.A.Index, slow: func() { once.Do(func() { close(entered) }); <-release }}})
	for _, n := range []string{p.A.Name, p.B.Name} {
		if err := a.Set(n, agent.Policy{Steering: agent.SteerHardware}); err != nil {
			t.Fatal(err)
		}
	}
	var sa, sb = rxSocket(t, p, p.A, 0), rxSocket(t, p, p.B, 0)
	slowDone := make(chan error, 1)
	go func() { slowDone <- a.AddSocket(p.A.Name, 0, sa.FD()) }()
	<-entered
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()

	// hang fails the test if f has not returned after a while: it waits
	// for the slow attach to end (which never comes before release).
	hang := func(what string, f func()) {
		t.Helper()
		done := make(chan struct{})
		go func() { f(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s waits for the attach on another netdev", what)
		}
	}
	hang("Status", func() { a.Status() })
	hang("AddSocket on another netdev", func() {
		if err := a.AddSocket(p.B.Name, 0, sb.FD()); err != nil {
			t.Error(err)
		}
	})
	if st := status(a, p.B.Name); st.State != agent.StateDirect {
		t.Errorf("%s: %+v; want its program attached", p.B.Name, st)
	}
	select {
	case err := <-slowDone:
		t.Fatalf("the slow attach returned before it was let go: %v", err)
	default:
	}
	close(release)
	if err := <-slowDone; err != nil {
		t.Fatal(err)
	}
	waitState(t, a, p.A.Name, agent.StateDirect)
}

// BenchmarkSlowAttach: the p50 and p99 of Status and of adding and
// removing a socket on one netdev, side by side: with the other netdev
// idle, with xdpq's program attached and detached on it over and over
// (veth's attach, a few hundred µs), and the same with an attach that
// takes 300 ms (a NIC reconfiguring its rings). Run it with
// -benchtime 200x.
func BenchmarkSlowAttach(b *testing.B) {
	for _, row := range []struct {
		churn bool
		delay time.Duration
	}{{false, 0}, {true, 0}, {true, 300 * time.Millisecond}} {
		name := "other-netdev-idle"
		switch {
		case row.delay > 0:
			name = fmt.Sprintf("other-netdev-attach-%v-churn", row.delay)
		case row.churn:
			name = "other-netdev-attach-churn"
		}
		delay := row.delay
		b.Run(name, func(b *testing.B) {
			p := testnet.NewPair(b, 4)
			a := startWith(b, agent.Config{NetNS: p.NSPath(), PinDir: pinDir(b), Linger: time.Nanosecond, StateDir: b.TempDir(),
				Hook: slowHook{ifindex: p.A.Index, slow: func() { time.Sleep(delay) }}})
			if err := a.Set(p.A.Name, agent.Policy{Steering: agent.SteerHardware}); err != nil {
				b.Fatal(err)
			}
			// The measured netdev keeps its program: its sockets come and
			// go without an attach of its own.
			if err := a.Set(p.B.Name, agent.Policy{Steering: agent.SteerHardware, Linger: time.Hour}); err != nil {
				b.Fatal(err)
			}
			sa, sb := rxSocket(b, p, p.A, 0), rxSocket(b, p, p.B, 0)
			// The other netdev: a socket added (an attach) and removed (a
			// detach, the linger being a nanosecond), over and over.
			stop := make(chan struct{})
			var wg sync.WaitGroup
			if row.churn {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						if err := a.AddSocket(p.A.Name, 0, sa.FD()); err != nil {
							b.Error(err)
							return
						}
						if err := a.RemoveSocket(p.A.Name, 0, 0); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			defer func() { close(stop); wg.Wait() }()
			var status, sockets []time.Duration
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				a.Status()
				t1 := time.Now()
				if err := a.AddSocket(p.B.Name, 0, sb.FD()); err != nil {
					b.Fatal(err)
				}
				if err := a.RemoveSocket(p.B.Name, 0, 0); err != nil {
					b.Fatal(err)
				}
				t2 := time.Now()
				status, sockets = append(status, t1.Sub(t0)), append(sockets, t2.Sub(t1))
			}
			b.StopTimer()
			for _, m := range []struct {
				what string
				d    []time.Duration
			}{{"status", status}, {"addremove", sockets}} {
				slices.Sort(m.d)
				b.ReportMetric(float64(m.d[len(m.d)/2].Microseconds()), m.what+"-p50-µs")
				b.ReportMetric(float64(m.d[len(m.d)*99/100].Microseconds()), m.what+"-p99-µs")
			}
		})
	}
}
