package agent_test

import (
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/testnet"
	"github.com/xdpq/xdpq/pkg/agent"
)

// TestNetdevChanges: down and up, rename, delete. The agent notices each
// from link notifications, reports it and converges; nothing panics.
func TestNetdevChanges(t *testing.T) {
	p := testnet.NewPair(t, 4)
	a := start(t, p, time.Second)
	if err := a.Manage(p.A.Name, agent.Policy{Steering: agent.SteerHardware}); err != nil {
		t.Fatal(err)
	}
	s0, r0 := socket(t, p, 0)
	if err := a.AddSocket(p.A.Name, 0, s0.FD()); err != nil {
		t.Fatal(err)
	}
	prog := waitState(t, a, p.A.Name, agent.StateDirect).Program
	send := sender(t, p, 0)

	// Down and up: the program stays, traffic flows again.
	ip(t, p, "link", "set", "dev", p.A.Name, "down")
	ip(t, p, "link", "set", "dev", p.A.Name, "up")
	if st := waitState(t, a, p.A.Name, agent.StateDirect); st.Program != prog {
		t.Errorf("after down/up: program %d, want %d", st.Program, prog)
	}
	if err := r0.Expect(send.UDP(20), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}

	// Rename: the agent follows the ifindex and reports the new name.
	ip(t, p, "link", "set", "dev", p.A.Name, "down")
	ip(t, p, "link", "set", "dev", p.A.Name, "name", "xr")
	ip(t, p, "link", "set", "dev", "xr", "up")
	deadline := time.Now().Add(5 * time.Second)
	for status(a, "xr").State != agent.StateDirect {
		if time.Now().After(deadline) {
			t.Fatalf("after rename: %+v", a.Status())
		}
		time.Sleep(time.Millisecond)
	}
	if err := r0.Expect(send.UDP(20), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}

	// Delete: reported missing; the managed name still answers.
	ip(t, p, "link", "del", "dev", "xr")
	deadline = time.Now().Add(5 * time.Second)
	for {
		all := a.Status()
		if len(all) == 1 && all[0].State == agent.StateMissing {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after delete: %+v", all)
		}
		time.Sleep(time.Millisecond)
	}
	if err := a.RemoveSocket(p.A.Name, 0); err != nil {
		t.Fatal(err)
	}
	if err := a.Unmanage(p.A.Name); err != nil {
		t.Fatal(err)
	}
}
