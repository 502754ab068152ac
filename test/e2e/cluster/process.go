package cluster

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// stopTimeout is how long a program has to exit after SIGTERM before its
// process group is killed.
const stopTimeout = 10 * time.Second

// process is a program of the cluster, run in a process group of its own
// so that stopping it stops what it started, with its output in a log
// file.
type process struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{} // closed when it has exited
	err  error         // how it exited, once done is closed
}

// spawns runs the functions sent to it on one OS thread that no other
// goroutine runs on and that lives as long as the test binary.
//
// A process started with Pdeathsig is killed when the thread that forked
// it exits, not the process. Go ends a thread when a goroutine locked to
// it returns without unlocking it, which is how a goroutine leaves a
// network namespace it entered for good (testutils.NewNS does this). Any
// goroutine can be scheduled on the thread that forked a cluster process
// a moment before, so forking from an arbitrary goroutine let a later
// NewNS kill etcd, the apiserver or containerd seconds after the cluster
// was Ready. Forking from this thread, which is locked and never exits
// before the binary does, cannot.
var spawns = sync.OnceValue(func() chan<- func() {
	ch := make(chan func())
	go func() {
		runtime.LockOSThread() // never unlocked: the thread is this goroutine's alone
		for f := range ch {
			f()
		}
	}()
	return ch
})

// startOnSpawnThread starts cmd from the spawn thread.
func startOnSpawnThread(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	spawns() <- func() { errc <- cmd.Start() }
	return <-errc
}

// start runs path with args in a new process group, its output appended
// to dir/<name>.log. The process is killed if the test binary dies (a
// test timeout's panic runs no cleanup): Pdeathsig, which the kernel
// sends when the thread that started the process exits, here the spawn
// thread (see spawns), which exits only with the binary.
func start(name, dir, path string, args []string, env []string) (*process, error) {
	log := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	defer func() { _ = f.Close() }() // the child has its own copy; ours is never written
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := startOnSpawnThread(cmd); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, log: log, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// stop ends the process group with SIGTERM, then SIGKILL after
// stopTimeout, and waits for the process. It returns an error only when
// the process outlived SIGKILL's wait.
func (p *process) stop() error {
	select {
	case <-p.done:
		p.killGroup(syscall.SIGKILL) // what it left in its group
		return nil
	default:
	}
	p.killGroup(syscall.SIGTERM)
	select {
	case <-p.done:
		p.killGroup(syscall.SIGKILL)
		return nil
	case <-time.After(stopTimeout):
	}
	p.killGroup(syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(stopTimeout):
		return fmt.Errorf("stop %s (pid %d): still running %s after SIGKILL", p.name, p.cmd.Process.Pid, stopTimeout)
	}
}

func (p *process) killGroup(sig syscall.Signal) {
	// The group's id is the leader's pid, which no other group takes
	// while the group has a member.
	// A group gone already (ESRCH) is what the caller waits for.
	_ = syscall.Kill(-p.cmd.Process.Pid, sig)
}

// exitError describes the exit of a process that should still run, with
// the end of its log.
func (p *process) exitError() error {
	return fmt.Errorf("%s exited: %v\n%s", p.name, p.err, p.tail(30))
}

// tail returns the last n lines of the process's log.
func (p *process) tail(n int) string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	b = bytes.TrimRight(b, "\n")
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == '\n' {
			if n--; n == 0 {
				b = b[i+1:]
				break
			}
		}
	}
	return fmt.Sprintf("--- last lines of %s:\n%s", p.log, b)
}

// onSignal runs stop when the process receives SIGINT or SIGTERM, then
// raises the signal again so that the process ends as it would have
// without the handler (once every harness that waits for it is done).
// cancel unregisters the handler.
func onSignal(stop func()) (cancel func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	quit := make(chan struct{})
	go func() {
		select {
		case sig := <-ch:
			fmt.Fprintf(os.Stderr, "e2e: %v: tearing the cluster down\n", sig)
			stop()
			signal.Stop(ch)
			// To ourselves, with a signal just received: it cannot fail.
			_ = syscall.Kill(os.Getpid(), sig.(syscall.Signal))
		case <-quit:
			signal.Stop(ch)
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(quit) }) }
}

// freePorts returns n distinct TCP ports free on 127.0.0.1 now. Another
// process may take one before the program that is given it binds it;
// that program then fails to start and says so.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []io.Closer
	defer func() {
		for _, l := range ls {
			_ = l.Close() // held only to keep the ports distinct, never accepted on
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func hostPort(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
