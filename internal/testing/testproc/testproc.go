// Package testproc runs a program as a test's process: its output kept
// (readable while it runs), and stopped with SIGTERM, then SIGKILL if it
// does not exit in time, and waited for. promtest's Prometheus server,
// the e2e's kubesd and pkg/daemon's daemon processes run through it.
package testproc

import (
	"fmt"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/xdpq/xdpq/internal/testing/syncbuf"
	"github.com/xdpq/xdpq/pkg/api"
)

// Proc is a started process.
type Proc struct {
	Cmd *exec.Cmd
	// Out is its standard output and error.
	Out *syncbuf.Buffer

	exited chan struct{} // closed when Wait returned
	exit   error         // Wait's, once exited is closed
	stop   sync.Once
}

// Start starts cmd with its output in Out.
func Start(cmd *exec.Cmd) (*Proc, error) {
	p := &Proc{Cmd: cmd, Out: new(syncbuf.Buffer), exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.Out, p.Out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		p.exit = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// Exited reports whether the process has exited, and how.
func (p *Proc) Exited() (exited bool, err error) {
	select {
	case <-p.exited:
		return true, p.exit
	default:
		return false, nil
	}
}

// Stop sends SIGTERM (if it runs), kills the process if it has not
// exited within grace, and returns how it exited. Again, it returns the
// same.
func (p *Proc) Stop(grace time.Duration) error {
	p.stop.Do(func() {
		_ = p.Cmd.Process.Signal(syscall.SIGTERM) // it may have exited already: Wait says
		select {
		case <-p.exited:
		case <-time.After(grace):
			_ = p.Cmd.Process.Kill() // stuck: its exit is what matters
			<-p.exited
		}
	})
	return p.exit
}

// WaitAPI waits up to timeout for the daemon p (run standalone with its
// local API at socket) to answer with its config's pools. It fails at
// once, with the daemon's output, if p exits or its status reports a
// config or state error. The API has no event to wait on: it is polled.
func WaitAPI(p *Proc, socket string, timeout time.Duration) error {
	c := api.NewClient(socket)
	deadline := time.Now().Add(timeout)
	for {
		if s, err := c.Status(); err == nil && len(s.Pools) > 0 {
			if s.ConfigError != "" || len(s.StateErrors) > 0 {
				return fmt.Errorf("status: %s %v\n%s", s.ConfigError, s.StateErrors, p.Out)
			}
			return nil
		}
		if exited, err := p.Exited(); exited {
			return fmt.Errorf("exited: %v\n%s", err, p.Out)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready in %v\n%s", timeout, p.Out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
