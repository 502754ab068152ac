package ctest_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/testing/node"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/wire"
)

// TestL2fwdForwards is the C client's forwarder as a pod runs it: uid
// 65534, no capabilities, leasing queues 0 and 1 of a pool that allows
// TX through the real broker. Every frame sent to each queue comes back
// to the sender on the same queue with its MAC addresses swapped and
// nothing else changed, in order, through rings of 512 entries that wrap
// several times; its summary counts them.
func TestL2fwdForwards(t *testing.T) {
	owner := uint32(nobody)
	limits := wire.DefaultLimits
	limits.AllowTX = true
	n, p := startNodeWith(t, node.Config{Owner: broker.Owner{UID: &owner}, Limits: limits})
	bin := filepath.Join(build(t, "xdpq-l2fwd"), "xdpq-l2fwd")
	r := startRxdrop(t, bin, n.Alloc.SocketPath(), "-r", "512", "-d", "60")
	r.waitLine(t, "xdpq-l2fwd: allocation alloc-1 netdev xa queues 0,1: forwarding (copy)")

	const rounds, per = 4, 400 // a round fits a ring of 512
	for round := range rounds {
		for q := range uint32(2) {
			sent := frames(n.Pair, q, round*per, per)
			if err := p.Send[q].Send(sent, time.Now().Add(5*time.Second)); err != nil {
				t.Fatal(err)
			}
			want := make([][]byte, len(sent))
			for i, f := range sent {
				w := slices.Clone(f)
				copy(w[0:6], f[6:12])
				copy(w[6:12], f[0:6])
				want[i] = w
			}
			if err := p.Recv[q].Expect(want, time.Now().Add(10*time.Second)); err != nil {
				t.Fatalf("round %d, queue %d: %v\nstderr:\n%s", round, q, err, strings.Join(r.stderr.snapshot(), "\n"))
			}
		}
	}
	r.pod.Cmd.Process.Signal(syscall.SIGTERM)
	<-r.done
	if r.err != nil {
		t.Fatalf("xdpq-l2fwd: %v\nstderr:\n%s", r.err, strings.Join(r.stderr.snapshot(), "\n"))
	}
	for _, want := range []string{
		fmt.Sprintf("queue 0: %d frames received, %d forwarded", rounds*per, rounds*per),
		fmt.Sprintf("queue 1: %d frames received, %d forwarded", rounds*per, rounds*per),
		fmt.Sprintf("total: %d frames forwarded, %d received in ", 2*rounds*per, 2*rounds*per),
	} {
		if !slices.ContainsFunc(r.stderr.snapshot(), func(l string) bool { return strings.HasPrefix(l, want) }) {
			t.Errorf("summary lacks %q:\n%s", want, strings.Join(r.stderr.snapshot(), "\n"))
		}
	}
	if err := n.WaitSockets(0, 5*time.Second); err != nil {
		t.Error(err)
	}
}

// TestL2fwdNeedsTX: a pool that does not allow TX refuses the
// forwarder's lease, and it says so in one line.
func TestL2fwdNeedsTX(t *testing.T) {
	n, _ := startNode(t, nobody, nil, 0)
	bin := filepath.Join(build(t, "xdpq-l2fwd"), "xdpq-l2fwd")
	r := startRxdrop(t, bin, n.Alloc.SocketPath(), "-d", "10")
	<-r.done
	if r.err == nil {
		t.Fatalf("xdpq-l2fwd leased a pool without TX:\n%s", strings.Join(r.stderr.snapshot(), "\n"))
	}
	got := strings.Join(r.stderr.snapshot(), "\n")
	if !strings.HasPrefix(got, "xdpq-l2fwd: xdpq: refused: ") || !strings.Contains(got, "TX") {
		t.Errorf("stderr: %q, want one line of the daemon's refusal naming TX", got)
	}
}
