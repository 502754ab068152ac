package broker

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// Peer is the process at the other end of a connection, as the kernel
// reports it when it connected.
type Peer struct {
	PID      int32
	UID, GID uint32
	Pod      PodIdentity // zero when the process is in no pod
	PodErr   error       // why Pod is zero
}

func (p Peer) String() string {
	s := fmt.Sprintf("pid %d uid %d", p.PID, p.UID)
	if p.Pod.PodUID != "" {
		s += " pod " + p.Pod.PodUID
	}
	return s
}

// peerOf reads the connection's peer credentials (SO_PEERCRED) and the
// peer's cgroup. A pidfd taken first pins the process: if it has exited
// by the time its cgroup is read, the pid may name another process, and
// the peer is refused.
func peerOf(c *net.UnixConn, procRoot string) (Peer, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return Peer{}, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Peer{}, err
	}
	if cerr != nil {
		return Peer{}, fmt.Errorf("peer credentials: %w", cerr)
	}
	p := Peer{PID: cred.Pid, UID: cred.Uid, GID: cred.Gid}
	pidfd, err := unix.PidfdOpen(int(cred.Pid), 0)
	if err != nil {
		return p, fmt.Errorf("peer pid %d: %w", cred.Pid, err)
	}
	defer func() { _ = unix.Close(pidfd) }() // a pidfd only held, never written
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(int(cred.Pid)), "cgroup"))
	if err != nil {
		return p, fmt.Errorf("peer pid %d: cgroup: %w", cred.Pid, err)
	}
	p.Pod, p.PodErr = ParsePodCgroup(string(b))
	// A pidfd is readable once its process has exited. (Signal 0 would
	// tell too, but needs CAP_KILL for another uid's process, which the
	// DaemonSet does not give the daemon.)
	if exited, err := pidExited(pidfd); err != nil || exited {
		return p, fmt.Errorf("peer pid %d exited while being identified", cred.Pid)
	}
	return p, nil
}

// pidExited says whether the process of pidfd has exited, without
// waiting.
func pidExited(pidfd int) (bool, error) {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return false, err
		}
		return n > 0 && fds[0].Revents&(unix.POLLIN|unix.POLLHUP) != 0, nil
	}
}

// Owner is who may use an allocation.
type Owner struct {
	// PodUID is the pod (Kubernetes): the peer's cgroup must name it.
	PodUID string
	// ContainerID, if set, narrows it to one container of the pod.
	ContainerID string
	// UID is the local user (standalone mode): the peer must run as it.
	UID *uint32
	// AnyPod accepts a process of any kubelet pod. It is for allocations
	// whose pod is not known yet: kubelet's Allocate does not say; the
	// allocation's directory, mounted only into its container, is then
	// what keeps others out.
	AnyPod bool
}

func (o Owner) check(p Peer) error {
	switch {
	case o.PodUID != "":
		if p.Pod.PodUID == "" {
			return fmt.Errorf("this allocation belongs to pod %s; %v is in no pod (%v)", o.PodUID, p, p.PodErr)
		}
		if p.Pod.PodUID != o.PodUID {
			return fmt.Errorf("this allocation belongs to pod %s, not to pod %s (%v)", o.PodUID, p.Pod.PodUID, p)
		}
		if o.ContainerID != "" && p.Pod.ContainerID != o.ContainerID {
			return fmt.Errorf("this allocation belongs to container %s of its pod, not %s", o.ContainerID, p.Pod.ContainerID)
		}
		return nil
	case o.UID != nil:
		if p.UID != *o.UID {
			return fmt.Errorf("this allocation belongs to uid %d, not to %v", *o.UID, p)
		}
		return nil
	case o.AnyPod:
		if p.Pod.PodUID == "" {
			return fmt.Errorf("this allocation is for a pod; %v is in no pod (%v)", p, p.PodErr)
		}
		return nil
	}
	return errors.New("this allocation has no owner, so nobody may use it")
}
