package testproc_test

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/testing/testproc"
)

// TestStop: a process that exits on SIGTERM is waited for, with its
// output; one that ignores it is killed after the grace period; Stop
// again returns the same exit.
func TestStop(t *testing.T) {
	p, err := testproc.Start(exec.Command("sh", "-c", `trap 'echo bye; exit 0' TERM; echo hi; while :; do sleep 0.01; done`))
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(p.Out.String(), "hi"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no output: %q", p.Out.String())
		}
	}
	if exited, _ := p.Exited(); exited {
		t.Fatal("exited before Stop")
	}
	if err := p.Stop(10 * time.Second); err != nil || !strings.Contains(p.Out.String(), "bye") {
		t.Fatalf("stop: %v, output %q", err, p.Out.String())
	}
	if exited, err := p.Exited(); !exited || err != nil {
		t.Fatalf("after Stop: exited %v, %v", exited, err)
	}

	stuck, err := testproc.Start(exec.Command("sh", "-c", `trap '' TERM; echo hi; while :; do sleep 0.01; done`))
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(stuck.Out.String(), "hi"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no output: %q", stuck.Out.String())
		}
	}
	err = stuck.Stop(100 * time.Millisecond)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.String() != "signal: killed" {
		t.Fatalf("a process that ignores SIGTERM: %v; want it killed", err)
	}
	if again := stuck.Stop(time.Second); again != err {
		t.Fatalf("Stop again: %v, want %v", again, err)
	}
}
