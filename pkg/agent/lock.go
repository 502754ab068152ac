package agent

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// ErrNetdevHeld is what Set and Manage wrap when another agent (another
// xdpq daemon) manages the netdev.
var ErrNetdevHeld = errors.New("another xdpq daemon manages the netdev")

// lockName is the abstract Unix socket name of a netdev's lock.
func lockName(netdev string) string { return "@xdpq.io/netdev/" + netdev }

// netdevLock makes an agent the only one on a netdev, whatever its pin,
// state and allocation directories: two daemons with directories of
// their own on one netdev take each other's program back and remove
// each other's flows as stale, so the resource locked is the netdev, not
// a path. The lock is an abstract Unix socket named after the netdev,
// bound in the netdev's network namespace: abstract names belong to the
// network namespace, not to a file system, so every daemon that sees
// the netdev sees the lock, whatever its mounts; the kernel frees it
// with the socket, however its holder ends. The holder listens, and
// accepts only to close, so that another can ask the kernel who holds it
// (SO_PEERCRED of its connection).
type netdevLock struct {
	ln   *net.UnixListener
	stop chan struct{} // closed by release
	done chan struct{} // closed when the accept loop returned
}

// lockNetdev takes the lock of the netdev name in the network namespace
// at netnsPath ("" for the caller's). Held by another process, the error
// wraps ErrNetdevHeld and names that process.
func lockNetdev(netnsPath, name string) (*netdevLock, error) {
	var ln *net.UnixListener
	err := inNS(netnsPath, func() (err error) {
		ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: lockName(name), Net: "unix"})
		return err
	})
	if errors.Is(err, unix.EADDRINUSE) {
		return nil, fmt.Errorf("%w (%s, holding %s): one daemon per netdev, whatever their directories; "+
			"stop that one, or take %s out of this one's pools", ErrNetdevHeld, netdevHolder(netnsPath, name), lockName(name), name)
	}
	if err != nil {
		return nil, fmt.Errorf("lock the netdev: %w", err)
	}
	l := &netdevLock{ln: ln, stop: make(chan struct{}), done: make(chan struct{})}
	go l.serve()
	return l, nil
}

// serve accepts the connections of those who ask who holds the lock,
// and closes them: the kernel told them at connect. An accept that fails
// (out of descriptors: a flood) is tried again after a pause that grows
// to a second, not at once: the lock holds whether it accepts or not.
func (l *netdevLock) serve() {
	defer close(l.done)
	pause := 5 * time.Millisecond
	for {
		c, err := l.ln.Accept()
		if err == nil {
			_ = c.Close() // its peer asked only who holds the lock
			pause = 5 * time.Millisecond
			continue
		}
		select {
		case <-l.stop:
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
	}
}

// release frees the lock; a nil lock is none.
func (l *netdevLock) release() {
	if l == nil {
		return
	}
	close(l.stop)
	_ = l.ln.Close() // an abstract socket: nothing to unlink; closing frees the name
	<-l.done
}

// netdevHolder says which process holds the netdev's lock: its pid and
// command line, as the kernel gives the credentials of the socket's
// listener to a connection.
func netdevHolder(netnsPath, name string) string {
	var cred *unix.Ucred
	err := inNS(netnsPath, func() error {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: lockName(name), Net: "unix"})
		if err != nil {
			return err
		}
		defer func() { _ = c.Close() }() // only its credentials were read
		raw, err := c.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := raw.Control(func(fd uintptr) { cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
			return err
		}
		return serr
	})
	switch {
	case err != nil:
		return "a process that does not answer: " + err.Error()
	case cred.Pid == 0:
		return fmt.Sprintf("a process of another pid namespace, uid %d", cred.Uid)
	}
	holder := fmt.Sprintf("pid %d", cred.Pid)
	if cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", cred.Pid)); err == nil && len(cmd) > 0 {
		holder += ": " + strings.TrimSpace(string(bytes.ReplaceAll(cmd, []byte{0}, []byte{' '})))
	}
	return holder
}

// inNS runs f on a thread in the network namespace at path ("" for the
// caller's): a socket belongs to the namespace it is made in.
func inNS(path string, f func() error) error {
	if path == "" {
		return f()
	}
	return ns.WithNetNSPath(path, func(ns.NetNS) error { return f() })
}
