package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/testing/testbin"
	"github.com/xdpq/xdpq/internal/testing/testnet"
)

func TestMain(m *testing.M) { os.Exit(testnet.MainWithLeakCheck(m)) }

// TestInterrupt is a user's Ctrl-C in the middle of `make bench`: the
// run ends after the measurement under way, says so, exits non-zero
// without a table, and leaves no network namespace (with its veth pair)
// behind, where it used to leave one for every interrupted run.
func TestInterrupt(t *testing.T) {
	testnet.RequireRoot(t)
	bin := filepath.Join(t.TempDir(), "xdpqbench")
	testbin.Build(t, bin, ".")
	// A deadline, so that a run that stalls fails the test instead of
	// hanging it; and killed at the end whatever happens, so that it
	// cannot outlive the test (and die of SIGPIPE, leaving its netns).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-pods=false", "-testpmd=", "-duration", "500ms", "-rounds", "3")
	cmd.WaitDelay = 10 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := false
	t.Cleanup(func() {
		if !waited {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	netnsRE := regexp.MustCompile(`in netns (\S+),`)
	var netns string
	var lines []string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if m := netnsRE.FindStringSubmatch(sc.Text()); m != nil {
			netns = m[1]
		}
		if strings.Contains(sc.Text(), "round 1") {
			break // measuring: interrupt it
		}
	}
	if netns == "" {
		t.Fatalf("no netns named, or no round measured, in the output:\n%s\n%s", strings.Join(lines, "\n"), stderr.String())
	}
	if _, err := os.Stat(netns); err != nil {
		t.Fatalf("the run's netns %s while it runs: %v", netns, err)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	err = cmd.Wait()
	waited = true
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).ExitStatus() != 1 {
		t.Errorf("after the interrupt: %v; want exit status 1", err)
	}
	out := strings.Join(lines, "\n")
	if !strings.Contains(stderr.String(), "xdpqbench: interrupt: stopping after the measurement under way") ||
		!strings.Contains(stderr.String(), "xdpqbench: interrupted") {
		t.Errorf("stderr does not say it was interrupted:\n%s", stderr.String())
	}
	if strings.Contains(out, "medians of the rounds") {
		t.Errorf("a table after the interrupt:\n%s", out)
	}
	// It was interrupted in round 1 of 3 (the test's reading may lag
	// the run by a measurement or two, not by a round).
	if strings.Contains(out, "  round 3 ") {
		t.Errorf("it went on measuring after the interrupt:\n%s", out)
	}
	if _, err := os.Stat(netns); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the run's netns %s after it ended: %v; want it gone", netns, err)
	}
}
