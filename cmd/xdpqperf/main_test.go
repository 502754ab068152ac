package main

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/testing/node"
	"github.com/xdpq/xdpq/internal/testing/syncbuf"
	"github.com/xdpq/xdpq/internal/testing/testbin"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/client"
)

func TestMain(m *testing.M) { os.Exit(testnet.MainWithLeakCheck(m)) }

func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "xdpqperf")
	testbin.Build(t, bin, ".")
	return bin
}

// TestArguments: what xdpqperf does not know is refused, naming it, before
// it connects anywhere.
func TestArguments(t *testing.T) {
	bin := build(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"rxdrop"}, `unexpected argument "rxdrop": the mode is a flag, -mode rxdrop`},
		{[]string{"-mode", "rxdrop", "extra"}, `unexpected argument "extra": xdpqperf takes flags only`},
		{[]string{"-bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"-ring", "4294967296"}, "-ring 4294967296: at most 2147483648"},
	} {
		cmd := exec.Command(bin, tc.args...)
		cmd.Env = append(os.Environ(), "XDPQ_SOCKET=/nonexistent")
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), tc.want) {
			t.Errorf("xdpqperf %v: %v\n%s\nwant exit 2 saying %q", tc.args, err, out, tc.want)
		}
	}
}

var totalLine = regexp.MustCompile(`(?m)^total q0: rx (\d+) tx 0$`)

// TestEnds: xdpqperf ends on -duration and on SIGTERM every time, while
// frames flow to its queue, and prints its totals: ten runs of each. A
// run that does not end within 20 s is a hang (the test says so and
// kills it).
func TestEnds(t *testing.T) {
	bin := build(t)
	n, p := node.StartTB(t, node.Config{})
	// Frames flow all along.
	f, err := frame.Spec{SrcMAC: n.Pair.B.MAC, DstMAC: n.Pair.A.MAC, Src: n.Pair.B.Addr, Dst: n.Pair.A.Addr, Protocol: 17,
		SrcPort: 1, DstPort: 5000, Payload: frame.Payload(0, 0, 60)}.Build()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		batch := [][]byte{f, f, f, f, f, f, f, f}
		for ctx.Err() == nil {
			if err := p.Send[0].Send(batch, time.Now().Add(time.Second)); err != nil && ctx.Err() == nil {
				t.Errorf("send: %v", err)
				return
			}
		}
	})
	defer func() { cancel(); wg.Wait() }()

	run := func(t *testing.T, args []string, signal bool) {
		var out syncbuf.Buffer
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "XDPQ_SOCKET="+n.Alloc.SocketPath())
		cmd.Stderr = &out
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Its first report line that counts frames: it receives.
		receiving := make(chan struct{})
		copied := make(chan struct{})
		go func() {
			defer close(copied)
			sc := bufio.NewScanner(stdout)
			said := false
			for sc.Scan() {
				_, _ = out.Write(append(sc.Bytes(), '\n')) // a buffer in memory
				if !said && receivingLine.Match(sc.Bytes()) {
					close(receiving)
					said = true
				}
			}
		}()
		done := make(chan error, 1)
		go func() { <-copied; done <- cmd.Wait() }()
		if signal {
			select {
			case <-receiving:
				cmd.Process.Signal(syscall.SIGTERM)
			case err := <-done:
				t.Fatalf("ended before it received: %v\n%s", err, out.String())
			}
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
		case <-time.After(20 * time.Second):
			cmd.Process.Signal(syscall.SIGQUIT) // its goroutines, into out
			<-done
			t.Fatalf("still running after 20 s:\n%s", out.String())
		}
		if m := totalLine.FindStringSubmatch(out.String()); m == nil || m[1] == "0" {
			t.Fatalf("no total of received frames:\n%s", out.String())
		}
	}
	for range 10 {
		run(t, []string{"-mode", "rxdrop", "-duration", "1200ms"}, false)
		run(t, []string{"-mode", "rxdrop"}, true)
	}

	// The duration counts from the start: a run that waits for its
	// allocation (another process holds it) still ends on time, saying
	// why it got nothing.
	holder, err := client.Connect(n.Alloc.SocketPath(), client.Options{Name: "holder"})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	cmd := exec.Command(bin, "-mode", "rxdrop", "-duration", "1200ms")
	cmd.Env = append(os.Environ(), "XDPQ_SOCKET="+n.Alloc.SocketPath())
	var out syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		// It names the deadline, and the busy allocation when the
		// broker's refusal came before the deadline (on a loaded machine
		// the attempt under way may be what the deadline cuts).
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(out.String(), "gave up: context deadline exceeded") {
			t.Errorf("a run whose allocation is held: %v\n%s\nwant exit 1 saying it gave up at the deadline", err, out.String())
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Signal(syscall.SIGQUIT)
		<-done
		t.Fatalf("a run whose allocation is held still runs after 20 s (its -duration is 1.2 s):\n%s", out.String())
	}
}

var receivingLine = regexp.MustCompile(`q0 rx +[1-9]`)
