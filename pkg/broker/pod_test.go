package broker_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/testing/handover"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/client"
)

// The pod tests run this test binary again as a pod's process: uid 65534,
// no capabilities, its own network namespace, in a cgroup laid out as the
// kubelet lays out a container's.
const podEnv = "XDPQ_BROKER_TEST_POD"

const (
	podA       = "0c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5f"
	podB       = "11111111-2222-3333-4444-555555555555"
	container  = "4b825dc642cb6eb9a060e54bf8d69288fbee4904abcdef0123456789abcdef01"
	perQueue   = 1000
	frameBytes = 100
)

// startPod starts the pod process, puts it in the cgroup (if any) and
// tells it where the allocation's socket is.
func startPod(t *testing.T, e *env, procs string) (*handover.Pod, *bytes.Buffer) {
	t.Helper()
	var stderr bytes.Buffer
	pod, err := handover.StartPod([]string{"-test.run=^$"}, podEnv+"=pod", nil, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pod.Kill)
	if procs != "" {
		if err := os.WriteFile(procs, []byte(strconv.Itoa(pod.Cmd.Process.Pid)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pod.Conn.SetDeadline(time.Now().Add(30 * time.Second))
	err = handover.Send(pod.Conn, handover.Msg{Step: "go", Path: e.alloc.SocketPath(),
		AMAC: e.p.A.MAC, BMAC: e.p.B.MAC, AAddr: e.p.A.Addr, BAddr: e.p.B.Addr})
	if err != nil {
		t.Fatal(err)
	}
	return pod, &stderr
}

// TestUnprivilegedPod: a pod's process with no privileges gets its two
// queues through the broker and receives and transmits byte-exact; when
// it exits, its lease ends.
func TestUnprivilegedPod(t *testing.T) {
	e := newEnv(t, broker.Owner{PodUID: podA, ContainerID: container}, allowTX)
	pr := e.peer(t)
	pod, stderr := startPod(t, e, handover.PodCgroup(t, container, podA))
	m, _, err := handover.Expect(pod.Conn, "leased", 0)
	if err != nil {
		t.Fatalf("%v\npod stderr:\n%s", err, stderr)
	}
	if m.UID != "65534" || strings.Trim(m.CapEff, "0") != "" || len(m.Links) != 1 || m.Links[0] != "lo" {
		t.Errorf("the pod was not unprivileged: uid %s CapEff %s links %v", m.UID, m.CapEff, m.Links)
	}
	e.waitActive(t, e.alloc.ID)
	if s := e.sockets(); !slices.Equal(s, []uint32{0, 1}) {
		t.Errorf("sockets in the XSKMAP: %v", s)
	}
	for i := range 2 {
		if err := pr.Send[i].Send(frames(e.p.B, e.p.A, uint32(i), perQueue), time.Now().Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if err := handover.Send(pod.Conn, handover.Msg{Step: "sent"}); err != nil {
		t.Fatal(err)
	}
	rep, _, err := handover.Expect(pod.Conn, "report", 0)
	if err != nil {
		t.Fatalf("%v\npod stderr:\n%s", err, stderr)
	}
	for i, n := range rep.Counts {
		if n != perQueue {
			t.Errorf("pod queue %d: %d of %d frames byte-exact", i, n, perQueue)
		}
	}
	for i := range 2 {
		if err := pr.Recv[i].Expect(frames(e.p.A, e.p.B, uint32(100+i), perQueue), time.Now().Add(5*time.Second)); err != nil {
			t.Fatalf("from the pod on queue %d: %v", i, err)
		}
	}
	if err := handover.Send(pod.Conn, handover.Msg{Step: "exit"}); err != nil {
		t.Fatal(err)
	}
	if err := pod.Wait(); err != nil {
		t.Fatalf("pod: %v\n%s", err, stderr)
	}
	e.waitEnded(t, e.alloc.ID)
	if s := e.sockets(); len(s) != 0 {
		t.Errorf("sockets in the XSKMAP after the pod exited: %v", s)
	}
}

// TestOtherPodRefused: a process of another pod, or of no pod, is refused
// with a reason, and gets nothing.
func TestOtherPodRefused(t *testing.T) {
	e := newEnv(t, broker.Owner{PodUID: podA}, allowTX)
	for _, c := range []struct {
		name   string
		procs  string
		reason string
	}{
		{"another pod", handover.PodCgroup(t, container, podB), "not to pod " + podB},
		{"no pod", "", "is in no pod"},
	} {
		pod, stderr := startPod(t, e, c.procs)
		m, _, err := handover.Expect(pod.Conn, "refused", 0)
		if err != nil {
			t.Fatalf("%s: %v\npod stderr:\n%s", c.name, err, stderr)
		}
		if !strings.Contains(m.Reason, "forbidden") || !strings.Contains(m.Reason, c.reason) {
			t.Errorf("%s: refused with %q", c.name, m.Reason)
		}
		pod.Wait()
		if s := e.sockets(); len(s) != 0 {
			t.Errorf("%s: sockets %v", c.name, s)
		}
	}
}

// TestClaimPod: an allocation made for whichever pod kubelet gives it
// (Allocate does not say which) is bound to the first pod whose process
// connects and that the daemon says holds it (Config.ClaimPod). A process
// of a pod that does not hold it is refused, before and after; once
// bound, so is a process of any pod but that one, without asking. (Before,
// any process of any pod that reached the socket got the queues.)
func TestClaimPod(t *testing.T) {
	var asked []string
	var mu sync.Mutex
	e := newEnvWith(t, envConfig{owner: broker.Owner{AnyPod: true}, limits: allowTX, stepTimeout: 5 * time.Second,
		claimPod: func(_ context.Context, alloc string, pod broker.PodIdentity) error {
			mu.Lock()
			asked = append(asked, pod.PodUID)
			mu.Unlock()
			if alloc != "alloc-1" || pod.PodUID != podA {
				return errors.New("kubelet says it holds none of xa-q0, xa-q1")
			}
			return nil
		}})
	podACgroup, podBCgroup := handover.PodCgroup(t, container, podA), handover.PodCgroup(t, container, podB)
	refused := func(procs, reason string) {
		t.Helper()
		pod, stderr := startPod(t, e, procs)
		m, _, err := handover.Expect(pod.Conn, "refused", 0)
		if err != nil {
			t.Fatalf("%v\npod stderr:\n%s", err, stderr)
		}
		if !strings.Contains(m.Reason, "forbidden") || !strings.Contains(m.Reason, reason) {
			t.Errorf("refused with %q, want %q", m.Reason, reason)
		}
		pod.Wait()
	}
	refused(podBCgroup, "pod "+podB+": kubelet says it holds none of xa-q0, xa-q1")
	refused("", "is in no pod")

	pod, stderr := startPod(t, e, podACgroup)
	if _, _, err := handover.Expect(pod.Conn, "leased", 0); err != nil {
		t.Fatalf("the pod that holds it: %v\n%s", err, stderr)
	}
	pod.Kill()
	pod.Wait()
	mu.Lock()
	n := len(asked)
	mu.Unlock()
	refused(podBCgroup, "belongs to pod "+podA+", not to pod "+podB)
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != n || n != 2 {
		t.Errorf("claims asked %v: want one for pod B and one for pod A, none once bound", asked)
	}
}

// podMain is the pod process: a client of the broker, or (role flood) a
// hostile local user flooding an allocation's socket.
func podMain(role string) int {
	switch role {
	case "flood":
		return handover.RunPod(2*time.Minute, flood)
	case "mapprobe":
		return handover.RunPod(30*time.Second, mapProbe)
	}
	return handover.RunPod(30*time.Second, pod)
}

func pod(c *net.UnixConn) error {
	m, _, err := handover.Expect(c, "go", 0)
	if err != nil {
		return err
	}
	l, err := client.Connect(m.Path, client.Options{Name: "broker-test-pod", TX: true, Ring: 1024})
	if err != nil {
		return handover.Send(c, handover.Msg{Step: "refused", Reason: err.Error()})
	}
	defer l.Close()
	leased := handover.Msg{Step: "leased", Queues: l.Queues}
	if err := handover.Identity(&leased); err != nil {
		return err
	}
	if err := handover.Send(c, leased); err != nil {
		return err
	}
	if _, _, err := handover.Expect(c, "sent", 0); err != nil {
		return err
	}
	a := testnet.Link{MAC: m.AMAC, Addr: m.AAddr}
	b := testnet.Link{MAC: m.BMAC, Addr: m.BAddr}
	rep := handover.Msg{Step: "report"}
	for i := range l.Sockets {
		want := frames(b, a, uint32(i), perQueue)
		r, err := traffic.NewReceiver(l.Sockets[i], nil)
		if err != nil {
			return err
		}
		good := 0
		r.Receive(perQueue, time.Now().Add(5*time.Second), func(f []byte) error {
			if good < len(want) && bytes.Equal(f, want[good]) {
				good++
			}
			return nil
		})
		rep.Counts = append(rep.Counts, uint64(good))
		if err := traffic.NewSender(l.Sockets[i], l.TXFrames(i), 0).Send(frames(a, b, uint32(100+i), perQueue), time.Now().Add(5*time.Second)); err != nil {
			return err
		}
	}
	if err := handover.Send(c, rep); err != nil {
		return err
	}
	_, _, err = handover.Expect(c, "exit", 0)
	return err
}
