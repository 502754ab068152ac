package agent_test

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/xdpq/xdpq/bpf"
	"github.com/xdpq/xdpq/internal/testing/syncbuf"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/xdp"
)

// packets is the xdpq_agent_program_packets_total exposition of netdev
// xa with the counts given per queue: redirected, passed (and
// redirect_failed 0).
func packets(perQueue ...[2]int) string {
	var b strings.Builder
	b.WriteString(`# HELP xdpq_agent_program_packets_total Frames xdpq's program saw, per queue and result: redirected to the queue's socket; passed to the kernel (the filter program: no flow matched; the direct program: the queue had no socket); redirect_failed (the filter program's only: a flow matched but its queue had no socket).
# TYPE xdpq_agent_program_packets_total counter
`)
	for q, c := range perQueue {
		fmt.Fprintf(&b, "xdpq_agent_program_packets_total{netdev=\"xa\",queue=\"%d\",result=\"passed\"} %d\n", q, c[1])
		fmt.Fprintf(&b, "xdpq_agent_program_packets_total{netdev=\"xa\",queue=\"%d\",result=\"redirect_failed\"} 0\n", q)
		fmt.Fprintf(&b, "xdpq_agent_program_packets_total{netdev=\"xa\",queue=\"%d\",result=\"redirected\"} %d\n", q, c[0])
	}
	return b.String()
}

// waitPackets waits until the agent's collector reports want of
// xdpq_agent_program_packets_total: the program counts a frame in the
// receiver's NAPI poll, a moment after it was sent.
func waitPackets(t *testing.T, a *agent.Agent, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		err := testutil.CollectAndCompare(a.Collector(), strings.NewReader(want), "xdpq_agent_program_packets_total")
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		<-tick.C
	}
}

// TestDirectCounters: in direct mode the agent reports the direct
// program's per-queue counters as the filter's are reported (frames
// redirected to a queue's socket, frames passed on a queue without one),
// and a restarted agent goes on counting in the pinned counters.
func TestDirectCounters(t *testing.T) {
	p := testnet.NewPair(t, 2)
	pins, state := pinDir(t), t.TempDir()
	policy := agent.Policy{Steering: agent.SteerHardware}
	a1, err := agent.New(agent.Config{NetNS: p.NSPath(), PinDir: pins, StateDir: state,
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := a1.Set("xa", policy); err != nil {
		t.Fatal(err)
	}
	s0, r0 := socket(t, p, 0)
	if err := a1.AddSocket("xa", 0, s0.FD()); err != nil {
		t.Fatal(err)
	}
	if st := status(a1, "xa"); st.State != agent.StateDirect {
		t.Fatalf("xa: %+v, want Direct", st)
	}
	send0, send1 := sender(t, p, 0), sender(t, p, 1)
	if err := r0.Expect(send0.UDP(25), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	send1.UDP(10) // queue 1 has no socket: to the kernel
	waitPackets(t, a1, packets([2]int{25, 0}, [2]int{0, 10}))
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(a1.Collector()); err != nil {
		t.Fatal(err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
	if err := a1.Close(); err != nil {
		t.Fatal(err)
	}

	a2 := startWith(t, agent.Config{NetNS: p.NSPath(), PinDir: pins, StateDir: state})
	if err := a2.Set("xa", policy); err != nil {
		t.Fatal(err)
	}
	waitState(t, a2, "xa", agent.StateDirect)
	if err := r0.Expect(send0.UDP(5), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	waitPackets(t, a2.Agent, packets([2]int{30, 0}, [2]int{0, 10}))
}

// loadDirectV0 loads the direct program of earlier versions (which
// counted nothing) as their daemons did, sized for queues, with its new
// XSKMAP; both go when the test ends.
func loadDirectV0(t *testing.T, queues int) (*ebpf.Program, *ebpf.Map) {
	t.Helper()
	cs, err := bpf.LoadDirectV0()
	if err != nil {
		t.Fatal(err)
	}
	cs.Maps["xsks"].MaxEntries = uint32(queues)
	cs.Maps["xsks"].Key, cs.Maps["xsks"].Value = nil, nil
	coll, err := ebpf.NewCollection(cs)
	if err != nil {
		t.Fatal(err)
	}
	prog, xsks := coll.DetachProgram(xdp.DirectName), coll.DetachMap("xsks")
	coll.Close()
	t.Cleanup(func() { prog.Close(); xsks.Close() })
	return prog, xsks
}

// TestReplaceDirectV0: a daemon of an earlier version left its direct
// program, which counted nothing, attached with a pod's socket in its
// XSKMAP, its pins there or lost. The agent takes it as xdpq's, replaces
// it in one step with this version's program on the same XSKMAP (the
// socket keeps receiving), pins the counters beside it, and counts from
// then on.
func TestReplaceDirectV0(t *testing.T) {
	for _, pinned := range []bool{true, false} {
		t.Run(map[bool]string{true: "pinned", false: "pins lost"}[pinned], func(t *testing.T) {
			p := testnet.NewPair(t, 2)
			pins := pinDir(t)
			v0, xsks := loadDirectV0(t, p.A.Queues())
			if pinned {
				if err := os.MkdirAll(filepath.Join(pins, "xa"), 0o700); err != nil {
					t.Fatal(err)
				}
				if err := xsks.Pin(filepath.Join(pins, "xa", "xsks")); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := xdp.Attach(p.NSPath(), p.A.Index, v0, xdp.ModeNative); err != nil {
				t.Fatal(err)
			}
			s0, r0 := socket(t, p, 0)
			if err := xsks.Update(uint32(0), uint32(s0.FD()), ebpf.UpdateAny); err != nil {
				t.Fatal(err)
			}
			send := sender(t, p, 0)
			if err := r0.Expect(send.UDP(20), time.Now().Add(5*time.Second)); err != nil {
				t.Fatal(err)
			}
			info, err := v0.Info()
			if err != nil {
				t.Fatal(err)
			}
			v0ID, _ := info.ID()

			logs := &syncbuf.Buffer{}
			a := startWith(t, agent.Config{NetNS: p.NSPath(), PinDir: pins, StateDir: t.TempDir(),
				Logger: slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), logs), nil))})
			if err := a.Set("xa", agent.Policy{Steering: agent.SteerHardware}); err != nil {
				t.Fatal(err)
			}
			st := waitState(t, a, "xa", agent.StateDirect)
			att, err := xdp.Query(p.NSPath(), p.A.Index)
			if err != nil || att == nil || !att.Ours || att.Outdated || att.ID != st.Program || att.ID == v0ID {
				t.Fatalf("attached %+v (%v), status %+v; want this version's direct program in place of %d", att, err, st, v0ID)
			}
			if !strings.Contains(logs.String(), "replaced the attached program") {
				t.Errorf("the agent did not say it replaced the earlier program:\n%s", logs)
			}
			if err := r0.Expect(send.UDP(30), time.Now().Add(5*time.Second)); err != nil {
				t.Fatalf("the earlier daemon's socket after the replacement: %v", err)
			}
			waitPackets(t, a.Agent, packets([2]int{30, 0}, [2]int{0, 0}))
			for _, n := range []string{"xsks", "counters"} {
				m, err := ebpf.LoadPinnedMap(filepath.Join(pins, "xa", n), nil)
				if err != nil {
					t.Fatalf("%s not pinned: %v", n, err)
				}
				uses, err := xdp.UsesMap(mustProgram(t, st.Program), m)
				m.Close()
				if err != nil || !uses {
					t.Errorf("the pinned %s is not the program's: %v, %v", n, uses, err)
				}
			}
			if st := status(a, "xa"); st.State != agent.StateDirect {
				t.Errorf("xa: %+v, want Direct still", st)
			}
		})
	}
}

// mustProgram opens the program of id until the test ends.
func mustProgram(t *testing.T, id ebpf.ProgramID) *ebpf.Program {
	t.Helper()
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}
