// Package ctest_test tests the C client of the socket broker
// (clients/c, whose C sources keep Go out of that directory): it builds the library, the examples (xdpq-rxdrop,
// xdpq-l2fwd) and the parser's test with clang through the Makefile, runs the parser's test, runs
// xdpq-rxdrop against malformed daemons, and, as root, runs it as an
// unprivileged pod against a real broker on a veth pair and checks every
// frame it received byte for byte. It also builds the C program of
// docs/protocol.md with the command line the docs show, and runs it so.
package ctest_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/testing/handover"
	"github.com/xdpq/xdpq/internal/testing/node"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/wire"
	"github.com/xdpq/xdpq/pkg/xsk"
)

func TestMain(m *testing.M) { os.Exit(testnet.MainWithLeakCheck(m)) }

// build builds the C client with the Makefile into a fresh directory and
// returns it. Without clang it skips, except under CI=true, where clang-14
// is installed and the test must run.
func build(t *testing.T, targets ...string) string {
	t.Helper()
	dir := t.TempDir()
	buildIn(t, dir, targets...)
	return dir
}

// buildIn is build into dir, which make creates if need be.
func buildIn(t *testing.T, dir string, targets ...string) {
	t.Helper()
	cc := testnet.RequireTool(t, "clang-14", "clang", "clang-14")
	args := []string{"-s", "-C", "..", "O=" + dir, "CC=" + cc}
	for _, target := range targets {
		args = append(args, filepath.Join(dir, target))
	}
	out, err := exec.Command("make", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// TestMessageParser runs msg_test: the parser of the daemon's messages on
// valid, malformed and hostile input and 200000 mutants of it, built with
// AddressSanitizer and UBSan so that a read past a message aborts it.
func TestMessageParser(t *testing.T) {
	dir := build(t, "msg_test")
	out, err := exec.Command(filepath.Join(dir, "msg_test")).CombinedOutput()
	if err != nil {
		t.Fatalf("msg_test: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

// TestRxdropArguments: xdpq-rxdrop refuses what it does not know, before
// it connects anywhere.
func TestRxdropArguments(t *testing.T) {
	bin := filepath.Join(build(t, "xdpq-rxdrop"), "xdpq-rxdrop")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-z"}, "unknown option -z"},
		{[]string{"-x", "extra"}, "unexpected argument extra"},
		{[]string{"-m", "-x", "jumbo"}, "unexpected argument jumbo"},
		{[]string{"-d"}, "-d needs a value"},
		{[]string{"-d", "0"}, "-d 0: want a number of seconds"},
		{[]string{"-n", "-5"}, "-n -5: want a number of frames"},
		{[]string{"-q", "1,x"}, "-q 1,x: want queue numbers"},
		{[]string{"-r", "99999999"}, "-r 99999999: want a ring size"},
		{[]string{"--verbose"}, "unknown option --"},
	} {
		cmd := exec.Command(bin, c.args...)
		cmd.Env = append(os.Environ(), "XDPQ_SOCKET=/nonexistent")
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("%v: %v, want exit status 2\n%s", c.args, err, out)
		}
		if !strings.Contains(string(out), c.want) {
			t.Errorf("%v: output lacks %q:\n%s", c.args, c.want, out)
		}
	}
	// With no socket anywhere, it says so.
	cmd := exec.Command(bin)
	cmd.Env = slices.DeleteFunc(os.Environ(), func(s string) bool { return strings.HasPrefix(s, "XDPQ_SOCKET=") })
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "no socket path given and XDPQ_SOCKET is not set") {
		t.Errorf("without XDPQ_SOCKET: %v\n%s", err, out)
	}
}

// A daemon's welcome for the fake daemons: queues 8 and 9, and a field
// this client does not know, which it must skip.
const fakeWelcome = `{"type":"welcome","version":1,"allocation":"alloc-x","netdev":"eth1","queues":[8,9],` +
	`"limits":{"max_umem_bytes":268435456,"max_ring":8192,"tx_allowed":false,"max_queues":64},` +
	`"future":{"field":[1,{"of":null}]}}`

const fakeSockets = `{"type":"sockets","frame_size":2048,"rings":{"fill":2048,"completion":2048,"rx":2048,"tx":0},` +
	`"queues":[8,9],"zero_copy":false}`

// TestRxdropMalformedDaemon runs xdpq-rxdrop against daemons that answer
// wrong, and checks that it exits with one clear line saying what was
// wrong. The fake daemon also checks what the client sends with the
// daemon's own strict parser (unknown fields, trailing data refused) and
// the memfd as the daemon checks it.
func TestRxdropMalformedDaemon(t *testing.T) {
	bin := filepath.Join(build(t, "xdpq-rxdrop"), "xdpq-rxdrop")
	pipeFDs := func(t *testing.T, n int) []int {
		var fds []int
		for len(fds) < n {
			var p [2]int
			if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
				t.Fatal(err)
			}
			fds = append(fds, p[0])
			unix.Close(p[1])
		}
		return fds
	}
	for _, c := range []struct {
		name   string
		args   []string                            // xdpq-rxdrop's, besides -s and -d
		answer func(t *testing.T, c *net.UnixConn) // after the hello
		want   string
	}{
		{"not json", nil, say("welcome!"),
			"xdpq: waiting for welcome: not a protocol message: at byte 0: want an object, found 'w'"},
		{"refused", nil, say(`{"type":"error","code":"forbidden","reason":"not yours\u001b[2J"}`),
			"xdpq: refused: forbidden: not yours?[2J"},
		{"version", nil, say(`{"type":"welcome","version":2,"allocation":"a","queues":[1]}`),
			"the daemon speaks protocol version 2, this client 1"},
		{"no queues", nil, say(`{"type":"welcome","version":1,"allocation":"a","queues":[]}`),
			"the daemon's welcome names no allocation or no queues"},
		{"wrong type", nil, say(`{"type":"sockets"}`), `got a "sockets" message, want "welcome"`},
		{"too long", nil, say(strings.Repeat(" ", 5000) + "{}"), "a message longer than 4096 bytes"},
		{"bad field", nil, say(`{"type":"welcome","version":1,"allocation":"a","queues":[1],"limits":{"max_ring":-1}}`),
			"xdpq: waiting for welcome: not a protocol message: at byte 81: limits.max_ring: -1 is not a non-negative integer"},
		{"closed", nil, func(*testing.T, *net.UnixConn) {}, "the daemon closed the connection before welcome"},
		{"no sockets", nil, request(fakeSockets), "the daemon sent 0 sockets for 2 queues"},
		{"too many sockets", nil, request(fakeSockets, func(t *testing.T) []int { return pipeFDs(t, 3) }),
			"waiting for sockets: the daemon sent more than 2 descriptors"},
		{"not sockets", nil, request(fakeSockets, func(t *testing.T) []int { return pipeFDs(t, 2) }),
			"xdpq: queue 8: read ring offsets: Socket operation on non-socket"},
		{"other rings", nil, request(strings.Replace(fakeSockets, `"fill":2048`, `"fill":4096`, 1),
			func(t *testing.T) []int { return pipeFDs(t, 2) }),
			"the daemon's sockets are not the ones asked for"},
		{"refused request", nil, request(`{"type":"error","code":"limit","reason":"umem too big"}`),
			"xdpq: refused: limit: umem too big"},
		// A daemon that does not echo multi_buffer bound the sockets
		// without it (an older one would have refused the field): the
		// client must not take them; nor sockets bound with it unasked.
		// -m asks with the Go client's defaults, 4 KiB frames and rings
		// of 4096.
		{"multi-buffer not echoed", []string{"-m"},
			requestWith(wantRequest{frame: 4096, ring: 4096, multiBuffer: true}, fakeSocketsMB(false),
				func(t *testing.T) []int { return pipeFDs(t, 2) }),
			"xdpq: asked for multi-buffer true, the daemon bound the sockets with false"},
		{"multi-buffer unasked", nil, request(fakeSockets[:len(fakeSockets)-1]+`,"multi_buffer":true}`,
			func(t *testing.T) []int { return pipeFDs(t, 2) }),
			"xdpq: asked for multi-buffer false, the daemon bound the sockets with true"},
		{"multi-buffer not a bool", []string{"-m"},
			requestWith(wantRequest{frame: 4096, ring: 4096, multiBuffer: true},
				strings.Replace(fakeSocketsMB(true), "true}", `"yes"}`, 1)),
			`xdpq: waiting for sockets: not a protocol message: at byte 141: multi_buffer: want true or false`},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := fakeDaemon(t, c.answer)
			cmd := exec.Command(bin, append([]string{"-s", path, "-d", "5"}, c.args...)...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Errorf("%v, want exit status 1", err)
			}
			if !strings.Contains(stderr.String(), "xdpq-rxdrop: ") || !strings.Contains(stderr.String(), c.want) ||
				strings.Count(stderr.String(), "\n") != 1 {
				t.Errorf("stderr:\n%s\nwant one line with %q", stderr.String(), c.want)
			}
		})
	}
}

// say answers the hello with msg.
func say(msg string) func(*testing.T, *net.UnixConn) {
	return func(t *testing.T, c *net.UnixConn) {
		if err := xsk.SendFDs(c, []byte(msg), nil); err != nil {
			t.Error(err)
		}
	}
}

// fakeSocketsMB is the sockets message for -m's request, with
// multi_buffer true, or without it.
func fakeSocketsMB(mb bool) string {
	s := `{"type":"sockets","frame_size":4096,"rings":{"fill":4096,"completion":4096,"rx":4096,"tx":0},` +
		`"queues":[8,9],"zero_copy":false`
	if mb {
		s += `,"multi_buffer":true`
	}
	return s + "}"
}

// wantRequest is what a fake daemon expects of the request: the frame
// size, every ring's size (tx 0), and multi_buffer.
type wantRequest struct {
	frame, ring uint32
	multiBuffer bool
}

// request welcomes the client, checks its request (xdpq-rxdrop's defaults
// without -m) and memfd as the daemon would, and answers with msg and the
// descriptors fds makes.
func request(msg string, fds ...func(*testing.T) []int) func(*testing.T, *net.UnixConn) {
	return requestWith(wantRequest{frame: 2048, ring: 2048}, msg, fds...)
}

// requestWith is request for a request of w.
func requestWith(w wantRequest, msg string, fds ...func(*testing.T) []int) func(*testing.T, *net.UnixConn) {
	return func(t *testing.T, c *net.UnixConn) {
		if err := xsk.SendFDs(c, []byte(fakeWelcome), nil); err != nil {
			t.Error(err)
			return
		}
		buf := make([]byte, wire.MaxMessage+1)
		n, got, err := xsk.RecvFDs(c, buf, 2)
		if err != nil {
			t.Errorf("request: %v", err)
			return
		}
		defer closeFDs(got)
		m, err := wire.ParseMessage(buf[:n], wire.TypeRequest)
		if err != nil {
			t.Errorf("request %s: %v", buf[:n], err)
			return
		}
		want := wire.Rings{Fill: w.ring, Completion: w.ring, RX: w.ring}
		if m.FrameSize != w.frame || m.Rings == nil || *m.Rings != want || !slices.Equal(m.Queues, []uint32{8, 9}) ||
			m.MultiBuffer != w.multiBuffer {
			t.Errorf("request %s, want %+v", buf[:n], w)
		}
		if len(got) != 1 {
			t.Errorf("request with %d descriptors, want the memfd", len(got))
			return
		}
		size, err := xsk.CheckMemfd(got[0])
		if err != nil {
			t.Error(err)
		}
		// Per socket a fill ring's and an RX ring's worth of frames.
		if want := int64(2 * 2 * w.ring * w.frame); size != want {
			t.Errorf("umem of %d bytes, want %d", size, want)
		}
		var send []int
		if len(fds) > 0 {
			send = fds[0](t)
			defer closeFDs(send)
		}
		if err := xsk.SendFDs(c, []byte(msg), send); err != nil {
			t.Error(err)
		}
	}
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// fakeDaemon serves one connection at a socket in a fresh directory: it
// reads the hello with the daemon's own parser, then answers.
func fakeDaemon(t *testing.T, answer func(*testing.T, *net.UnixConn)) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "xdpq.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		c, err := ln.AcceptUnix()
		if err != nil {
			t.Errorf("accept: %v", err)
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, wire.MaxMessage+1)
		n, fds, err := xsk.RecvFDs(c, buf, 1)
		closeFDs(fds)
		if err != nil {
			t.Errorf("hello: %v", err)
			return
		}
		m, err := wire.ParseMessage(buf[:n], wire.TypeHello)
		if err != nil || m.Version != wire.Version || m.Client != "xdpq-rxdrop" || len(fds) != 0 {
			t.Errorf("hello %s: %v", buf[:n], err)
		}
		answer(t, c)
	})
	return path
}

// output collects what a process writes, line by line, for a test to
// wait on.
type output struct {
	mu    sync.Mutex
	part  []byte // the line being written
	lines []string
	wake  chan struct{} // closed and replaced on every write
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.part = append(o.part, p...)
	for {
		i := bytes.IndexByte(o.part, '\n')
		if i < 0 {
			break
		}
		o.lines = append(o.lines, string(o.part[:i]))
		o.part = o.part[i+1:]
	}
	if o.wake != nil {
		close(o.wake)
		o.wake = nil
	}
	return len(p), nil
}

func (o *output) snapshot() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.lines)
}

// rxdrop is xdpq-rxdrop running as a pod.
type rxdrop struct {
	pod            *handover.Pod
	stdout, stderr *output
	done           chan struct{} // closed when it exited
	err            error         // how it exited, once done
}

// startRxdrop runs xdpq-rxdrop as a pod's process would run: uid 65534,
// no capabilities, in a network namespace holding only lo, with
// XDPQ_SOCKET set.
func startRxdrop(t *testing.T, bin, socket string, args ...string) *rxdrop {
	t.Helper()
	r := &rxdrop{stdout: &output{}, stderr: &output{}, done: make(chan struct{})}
	pod, err := handover.StartProgram(bin, args, []string{"XDPQ_SOCKET=" + socket}, r.stdout, r.stderr)
	if err != nil {
		t.Fatal(err)
	}
	r.pod = pod
	go func() {
		r.err = pod.Wait()
		close(r.done)
	}()
	t.Cleanup(func() {
		pod.Cmd.Process.Kill()
		<-r.done
	})
	return r
}

// waitFor waits up to 20 s for cond to hold of what the process wrote to
// out; it fails at once if the process exits first.
func (r *rxdrop) waitFor(t *testing.T, out *output, what string, cond func([]string) bool) {
	t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for {
		out.mu.Lock()
		ok := cond(out.lines)
		if out.wake == nil {
			out.wake = make(chan struct{})
		}
		wake := out.wake
		out.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-wake:
		case <-r.done:
			if !cond(out.snapshot()) {
				t.Fatalf("waiting for %s: xdpq-rxdrop exited (%v)\nstderr:\n%s", what, r.err,
					strings.Join(r.stderr.snapshot(), "\n"))
			}
			return
		case <-deadline.C:
			t.Fatalf("waiting for %s: not within 20s\nstderr:\n%s", what, strings.Join(r.stderr.snapshot(), "\n"))
		}
	}
}

// waitLine waits for a line of stderr that holds s.
func (r *rxdrop) waitLine(t *testing.T, s string) {
	t.Helper()
	r.waitFor(t, r.stderr, fmt.Sprintf("%q on stderr", s), func(lines []string) bool {
		return slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, s) })
	})
}

// waitFrames waits until stdout holds n frames of each queue.
func (r *rxdrop) waitFrames(t *testing.T, queues []uint32, n int) {
	t.Helper()
	r.waitFor(t, r.stdout, fmt.Sprintf("%d frames on each queue", n), func(lines []string) bool {
		got := map[uint32]int{}
		for _, l := range lines {
			q, _, _ := strings.Cut(l, " ")
			v, _ := strconv.ParseUint(q, 10, 32)
			got[uint32(v)]++
		}
		for _, q := range queues {
			if got[q] < n {
				return false
			}
		}
		return true
	})
}

// received parses the frames of stdout by queue.
func (r *rxdrop) received(t *testing.T) map[uint32][][]byte {
	t.Helper()
	out := map[uint32][][]byte{}
	for i, l := range r.stdout.snapshot() {
		q, h, ok := strings.Cut(l, " ")
		v, err := strconv.ParseUint(q, 10, 32)
		b, herr := hex.DecodeString(h)
		if !ok || err != nil || herr != nil {
			t.Fatalf("stdout line %d is not \"<queue> <hex>\": %.80q", i+1, l)
		}
		out[uint32(v)] = append(out[uint32(v)], b)
	}
	return out
}

// checkFrames compares what each queue received with what was sent, byte
// for byte and in order.
func checkFrames(t *testing.T, got map[uint32][][]byte, want map[uint32][][]byte) {
	t.Helper()
	for q, w := range want {
		g := got[q]
		good := 0
		for i := range min(len(g), len(w)) {
			if bytes.Equal(g[i], w[i]) {
				good++
			} else if good == i {
				t.Errorf("queue %d: frame %d differs:\n got %x\nwant %x", q, i, g[i], w[i])
			}
		}
		if good != len(w) || len(g) != len(w) {
			t.Errorf("queue %d: %d frames received, %d of %d byte for byte", q, len(g), good, len(w))
		}
	}
	for q := range got {
		if _, ok := want[q]; !ok {
			t.Errorf("queue %d: %d frames received, none sent", q, len(got[q]))
		}
	}
}

// frames builds n numbered UDP frames to A for queue q, starting at seq.
func frames(p *testnet.Pair, q uint32, seq, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		f, err := frame.Spec{SrcMAC: p.B.MAC, DstMAC: p.A.MAC, Src: p.B.Addr, Dst: p.A.Addr, Protocol: 17,
			SrcPort: 9, DstPort: uint16(7000 + q), Payload: frame.Payload(q, uint64(seq+i), 100)}.Build()
		if err != nil {
			panic(err)
		}
		out[i] = f
	}
	return out
}

// startNode runs a node whose allocation alloc-1 of xa's queues 0 and 1
// belongs to uid owner, with the sender on the far side; mtu, if not 0,
// is the veth pair's.
func startNode(t *testing.T, owner uint32, onLease func(string, []broker.LeaseSocket), mtu int) (*node.Node, *node.Peer) {
	t.Helper()
	return startNodeWith(t, node.Config{Owner: broker.Owner{UID: &owner}, OnLease: onLease, MTU: mtu})
}

// startNodeWith is startNode with cfg's other fields (its queues,
// allocation, policy and logger are startNode's).
func startNodeWith(t *testing.T, cfg node.Config) (*node.Node, *node.Peer) {
	t.Helper()
	testnet.RequireRoot(t)
	cfg.Queues, cfg.Alloc, cfg.Policy = 4, []uint32{0, 1}, agent.Policy{Steering: agent.SteerHardware}
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	n, err := node.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Error(err)
		}
	})
	p, err := n.Peer([]uint32{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	return n, p
}

const nobody = 65534

// send sends n frames from seq on to each of queues 0 and 1, and adds
// them to sent.
func send(t *testing.T, n *node.Node, p *node.Peer, seq, count int, sent map[uint32][][]byte) {
	t.Helper()
	for q := range uint32(2) {
		f := frames(n.Pair, q, seq, count)
		if err := p.Send[q].Send(f, time.Now().Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
		sent[q] = append(sent[q], f...)
	}
}

// TestRxdropUnprivileged is the C client's zero-capability path: the
// example, as uid 65534 with no capabilities in a namespace of its own,
// leases both queues of the allocation through the real broker and
// receives every frame sent to them byte for byte, through rings of 512
// entries that wrap twice. When it exits, its lease ends.
func TestRxdropUnprivileged(t *testing.T) {
	n, p := startNode(t, nobody, nil, 0)
	bin := filepath.Join(build(t, "xdpq-rxdrop"), "xdpq-rxdrop")
	const perQueue, half = 1000, 500 // half fits a ring of 512
	r := startRxdrop(t, bin, n.Alloc.SocketPath(), "-x", "-r", "512", "-n", strconv.Itoa(2*perQueue), "-d", "60")
	r.waitLine(t, "xdpq-rxdrop: allocation alloc-1 netdev xa queues 0,1: active (copy)")

	var id handover.Msg
	if err := handover.IdentityOf(strconv.Itoa(r.pod.Cmd.Process.Pid), &id); err != nil {
		t.Fatal(err)
	}
	if id.UID != strconv.Itoa(nobody) || strings.Trim(id.CapEff, "0") != "" || !slices.Equal(id.Links, []string{"lo"}) {
		t.Errorf("xdpq-rxdrop was not unprivileged: uid %s CapEff %s links %v", id.UID, id.CapEff, id.Links)
	}
	// The daemon put the sockets into the XSKMAP before it said active.
	if s := n.Sockets(); !slices.Equal(s, []uint32{0, 1}) {
		t.Errorf("sockets in the XSKMAP: %v", s)
	}

	sent := map[uint32][][]byte{}
	send(t, n, p, 0, half, sent)
	r.waitFrames(t, []uint32{0, 1}, half)
	send(t, n, p, half, perQueue-half, sent)
	<-r.done
	if r.err != nil {
		t.Fatalf("xdpq-rxdrop: %v\nstderr:\n%s", r.err, strings.Join(r.stderr.snapshot(), "\n"))
	}
	checkFrames(t, r.received(t), sent)
	var size int
	for _, f := range sent[0] {
		size += len(f)
	}
	for _, want := range []string{
		fmt.Sprintf("queue 0: %d frames, %d bytes", perQueue, size),
		fmt.Sprintf("queue 1: %d frames, %d bytes", perQueue, size),
		fmt.Sprintf("total: %d frames, %d bytes in ", 2*perQueue, 2*size),
		"away: longest ", // the loop's longest absence from its rings while frames came
	} {
		if !slices.ContainsFunc(r.stderr.snapshot(), func(l string) bool { return strings.HasPrefix(l, want) }) {
			t.Errorf("summary lacks %q:\n%s", want, strings.Join(r.stderr.snapshot(), "\n"))
		}
	}
	// Its sockets closed with it: the lease ended and they left the
	// XSKMAP.
	if err := n.WaitSockets(0, 5*time.Second); err != nil {
		t.Error(err)
	}
}

// TestRxdropRefused: a process that is not the allocation's owner gets no
// socket, and xdpq-rxdrop says why in one line. An owner known by uid has
// its socket to itself: the kernel refuses the connection. Where the
// socket is open to others (Kubernetes, where the container's uid is not
// known) the daemon refuses, and xdpq-rxdrop prints its code and reason.
func TestRxdropRefused(t *testing.T) {
	n, _ := startNode(t, nobody-1, nil, 0)
	bin := filepath.Join(build(t, "xdpq-rxdrop"), "xdpq-rxdrop")
	refused := func(want string) {
		t.Helper()
		r := startRxdrop(t, bin, n.Alloc.SocketPath(), "-d", "10")
		<-r.done
		var ee *exec.ExitError
		if !errors.As(r.err, &ee) || ee.ExitCode() != 1 {
			t.Errorf("xdpq-rxdrop: %v, want exit status 1", r.err)
		}
		want = strings.ReplaceAll(want, "PID", strconv.Itoa(r.pod.Cmd.Process.Pid))
		if lines := r.stderr.snapshot(); len(lines) != 1 || lines[0] != want {
			t.Errorf("stderr:\n%s\nwant the one line\n%s", strings.Join(lines, "\n"), want)
		}
		if s := n.Sockets(); len(s) != 0 {
			t.Errorf("sockets in the XSKMAP: %v", s)
		}
	}
	refused(fmt.Sprintf("xdpq-rxdrop: xdpq: connect %s: Permission denied", n.Alloc.SocketPath()))
	if err := os.Chmod(n.Alloc.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(n.Alloc.SocketPath(), 0o666); err != nil {
		t.Fatal(err)
	}
	refused(fmt.Sprintf("xdpq-rxdrop: xdpq: refused: forbidden: this allocation belongs to uid %d, not to pid PID uid %d", nobody-1, nobody))
}

// TestRxdropResumes: the daemon restarts under a running xdpq-rxdrop.
// Frames keep arriving while it is gone (the sockets stay in the
// XSKMAP); xdpq-rxdrop resumes the lease with the next daemon, which
// tracks it again; every frame of the three rounds arrives byte for byte.
func TestRxdropResumes(t *testing.T) {
	var mu sync.Mutex
	var leases [][]broker.LeaseSocket
	onLease := func(alloc string, socks []broker.LeaseSocket) {
		mu.Lock()
		defer mu.Unlock()
		leases = append(leases, socks)
	}
	n, p := startNode(t, nobody, onLease, 0)
	bin := filepath.Join(build(t, "xdpq-rxdrop"), "xdpq-rxdrop")
	r := startRxdrop(t, bin, n.Alloc.SocketPath(), "-x", "-d", "60")
	r.waitLine(t, ": active (copy)")
	mu.Lock()
	if len(leases) != 1 || len(leases[0]) != 2 {
		t.Fatalf("leases reported: %v", leases)
	}
	recorded := leases[0]
	mu.Unlock()

	sent := map[uint32][][]byte{}
	const round = 300
	send(t, n, p, 0, round, sent)
	r.waitFrames(t, []uint32{0, 1}, round)

	n.Broker.Close() // the daemon stops; the lease stays in the kernel
	r.waitLine(t, "xdpq-rxdrop: lease lost (xdpq: the daemon closed the connection); resuming")
	send(t, n, p, round, round, sent)
	r.waitFrames(t, []uint32{0, 1}, 2*round)

	srv := broker.NewServer(broker.Config{OnLease: onLease, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}, n.Agent)
	n.Broker = srv // Close closes it
	al := n.Alloc
	al.Resumable = recorded
	if err := srv.Add(al); err != nil {
		t.Fatal(err)
	}
	r.waitLine(t, "xdpq-rxdrop: lease resumed")
	mu.Lock()
	if len(leases) != 2 || !slices.Equal(leases[1], recorded) {
		t.Errorf("leases reported: %v, want %v again", leases, recorded)
	}
	mu.Unlock()
	send(t, n, p, 2*round, round, sent)
	r.waitFrames(t, []uint32{0, 1}, 3*round)

	r.pod.Cmd.Process.Signal(syscall.SIGTERM)
	<-r.done
	if r.err != nil {
		t.Fatalf("xdpq-rxdrop: %v\nstderr:\n%s", r.err, strings.Join(r.stderr.snapshot(), "\n"))
	}
	checkFrames(t, r.received(t), sent)
	if !slices.ContainsFunc(r.stderr.snapshot(), func(l string) bool {
		return strings.HasPrefix(l, fmt.Sprintf("total: %d frames", 6*round))
	}) {
		t.Errorf("summary:\n%s", strings.Join(r.stderr.snapshot(), "\n"))
	}
	// The next daemon ends the lease when the connection closes.
	if err := n.WaitSockets(0, 5*time.Second); err != nil {
		t.Error(err)
	}
}

// jumboFrames builds n numbered UDP frames to A for queue q, starting
// at seq, of the sizes of pkg/client's TestReceiverJumbo: payloads from
// 18 bytes to 8972 (a 9014-byte frame, the most a 9000-byte MTU takes),
// around the edges of one, two and three 4 KiB UMEM frames less the
// kernel's 256 bytes of headroom.
func jumboFrames(p *testnet.Pair, q uint32, seq, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		size := []int{18, 1400, 2006, 2007, 3798, 3799, 4054, 4055, 6000, 7597, 7598, 8972}[(seq+i)%12]
		f, err := frame.Spec{SrcMAC: p.B.MAC, DstMAC: p.A.MAC, Src: p.B.Addr, Dst: p.A.Addr, Protocol: 17,
			SrcPort: 9, DstPort: uint16(7000 + q), Payload: frame.Payload(q, uint64(seq+i), size)}.Build()
		if err != nil {
			panic(err)
		}
		out[i] = f
	}
	return out
}

// sendFrames sends fs[q] to each queue q and adds them to sent.
func sendFrames(t *testing.T, p *node.Peer, fs map[uint32][][]byte, sent map[uint32][][]byte) {
	t.Helper()
	for q := range uint32(2) {
		if err := p.Send[q].Send(fs[q], time.Now().Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
		sent[q] = append(sent[q], fs[q]...)
	}
}

// summary checks xdpq-rxdrop's summary: frames and bytes of each of
// queues 0 and 1 as sent, and the total.
func (r *rxdrop) summary(t *testing.T, sent map[uint32][][]byte) {
	t.Helper()
	var frames, bytes int
	var want []string
	for q := range uint32(2) {
		size := 0
		for _, f := range sent[q] {
			size += len(f)
		}
		want = append(want, fmt.Sprintf("queue %d: %d frames, %d bytes", q, len(sent[q]), size))
		frames += len(sent[q])
		bytes += size
	}
	want = append(want, fmt.Sprintf("total: %d frames, %d bytes in ", frames, bytes))
	for _, w := range want {
		if !slices.ContainsFunc(r.stderr.snapshot(), func(l string) bool { return strings.HasPrefix(l, w) }) {
			t.Errorf("summary lacks %q:\n%s", w, strings.Join(r.stderr.snapshot(), "\n"))
		}
	}
}

// TestRxdropJumbo: at a 9000-byte MTU, xdpq-rxdrop -m leases
// multi-buffer sockets with the Go client's defaults (4 KiB frames, rings
// of 4096) and receives frames of up to 9014 bytes, each in as many
// descriptors as it takes, whole: it counts frames, not descriptors (-n
// stops it after exactly as many as were sent), and writes each one byte
// for byte. Without -m the kernel drops the frames larger than a UMEM
// frame and xdpq-rxdrop gets only the others.
func TestRxdropJumbo(t *testing.T) {
	t.Run("multi-buffer", func(t *testing.T) {
		n, p := startNode(t, nobody, nil, 9000)
		bin := filepath.Join(build(t, "xdpq-rxdrop"), "xdpq-rxdrop")
		const perQueue = 300
		r := startRxdrop(t, bin, n.Alloc.SocketPath(), "-m", "-x", "-n", strconv.Itoa(2*perQueue), "-d", "60")
		r.waitLine(t, "xdpq-rxdrop: allocation alloc-1 netdev xa queues 0,1: active (copy, multi-buffer)")
		sent := map[uint32][][]byte{}
		sendFrames(t, p, map[uint32][][]byte{0: jumboFrames(n.Pair, 0, 0, perQueue), 1: jumboFrames(n.Pair, 1, 0, perQueue)}, sent)
		<-r.done
		if r.err != nil {
			t.Fatalf("xdpq-rxdrop: %v\nstderr:\n%s", r.err, strings.Join(r.stderr.snapshot(), "\n"))
		}
		checkFrames(t, r.received(t), sent)
		r.summary(t, sent)
		if err := n.WaitSockets(0, 5*time.Second); err != nil {
			t.Error(err)
		}
	})

	t.Run("without multi-buffer", func(t *testing.T) {
		n, p := startNode(t, nobody, nil, 9000)
		bin := filepath.Join(build(t, "xdpq-rxdrop"), "xdpq-rxdrop")
		r := startRxdrop(t, bin, n.Alloc.SocketPath(), "-x", "-d", "60")
		r.waitLine(t, "xdpq-rxdrop: allocation alloc-1 netdev xa queues 0,1: active (copy)")
		// Big, small, big, small: once the last small one is there, the
		// kernel has dealt with both big ones.
		all := map[uint32][][]byte{}
		small := map[uint32][][]byte{}
		for q := range uint32(2) {
			one := func(seq int) []byte { return jumboFrames(n.Pair, q, seq, 1)[0] }
			all[q] = [][]byte{one(11), one(0), one(10), one(12)} // payloads of 8972, 18, 7598, 18 bytes
			small[q] = [][]byte{all[q][1], all[q][3]}
		}
		sendFrames(t, p, all, map[uint32][][]byte{})
		r.waitFrames(t, []uint32{0, 1}, 2)
		stats := n.Broker.Stats()
		if len(stats) != 2 {
			t.Errorf("statistics of %d sockets, want 2: %+v", len(stats), stats)
		}
		for _, st := range stats {
			if st.RXDropped != 2 {
				t.Errorf("queue %d: %d frames dropped, want 2 (%+v)", st.Queue, st.RXDropped, st.Statistics)
			}
		}
		r.pod.Cmd.Process.Signal(syscall.SIGTERM)
		<-r.done
		if r.err != nil {
			t.Fatalf("xdpq-rxdrop: %v\nstderr:\n%s", r.err, strings.Join(r.stderr.snapshot(), "\n"))
		}
		checkFrames(t, r.received(t), small)
		r.summary(t, small)
	})
}

var _ io.Writer = (*output)(nil)
