// Package handover is the small exchange the datapath test and demo use
// to hand bound AF_XDP sockets to an unprivileged "pod" process: JSON
// messages with descriptors over SOCK_SEQPACKET, and starting the pod as
// uid 65534 with no capabilities in a network namespace holding only lo.
// The product's protocol is the broker's (pkg/broker); this is the least
// that shows the mechanism.
package handover

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/pkg/xsk"
)

// Msg is every message of the exchange; Step says which.
type Msg struct {
	Step   string
	Path   string    `json:",omitempty"` // a socket path to connect to
	Queues []uint32  `json:",omitempty"`
	Rings  xsk.Rings `json:",omitempty"`
	// Addressing of the test traffic, both ways.
	AMAC, BMAC   net.HardwareAddr `json:",omitempty"`
	AAddr, BAddr netip.Addr       `json:",omitempty"`
	Counts       []uint64         `json:",omitempty"`
	Dropped      []uint64         `json:",omitempty"` // XDP_STATISTICS rx_ring_full + rx_dropped
	RebindErr    string           `json:",omitempty"`
	SocketErr    string           `json:",omitempty"`
	CapEff, UID  string           `json:",omitempty"`
	Links        []string         `json:",omitempty"`
	Reason       string           `json:",omitempty"` // why something was refused, as data
	Pinned       string           `json:",omitempty"` // a pinned map's path
	Results      []string         `json:",omitempty"` // what a probe tried, one line each
	Error        string           `json:",omitempty"`
}

// Send sends m with fds attached.
func Send(c *net.UnixConn, m Msg, fds ...int) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return xsk.SendFDs(c, b, fds)
}

// Recv receives one message with at most maxFDs descriptors. A message
// carrying Error is returned as an error (with its descriptors closed).
func Recv(c *net.UnixConn, maxFDs int) (Msg, []int, error) {
	buf := make([]byte, 64<<10)
	n, fds, err := xsk.RecvFDs(c, buf, maxFDs)
	if err != nil {
		return Msg{}, nil, err
	}
	var m Msg
	err = json.Unmarshal(buf[:n], &m)
	if err == nil && m.Error != "" {
		err = fmt.Errorf("peer: %s", m.Error)
	} else if err != nil {
		err = fmt.Errorf("decode %q: %w", buf[:n], err)
	}
	if err != nil {
		closeFDs(fds)
		return m, nil, err
	}
	return m, fds, nil
}

// Expect receives a message and checks its step.
func Expect(c *net.UnixConn, step string, maxFDs int) (Msg, []int, error) {
	m, fds, err := Recv(c, maxFDs)
	if err != nil {
		return m, nil, fmt.Errorf("waiting for %q: %w", step, err)
	}
	if m.Step != step {
		closeFDs(fds)
		return m, nil, fmt.Errorf("got %q, want %q", m.Step, step)
	}
	return m, fds, nil
}

// closeFDs closes descriptors received and not kept: Linux frees a
// descriptor even when close reports an error, and nothing was written
// through them.
func closeFDs(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

// Pod is a running pod process and the parent's end of its connection.
type Pod struct {
	Cmd  *exec.Cmd
	Conn *net.UnixConn
	dir  string
}

// StartPod runs this program again as the pod: uid and gid 65534, no
// capabilities, in a new network namespace, with env set (to tell it to
// act as the pod) and its end of the connection on fd 3.
func StartPod(args []string, env string, stdout, stderr io.Writer) (*Pod, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return StartProgram(self, args, []string{env}, stdout, stderr)
}

// StartProgram runs the program at path as a pod would run: uid and gid
// 65534, no capabilities, in a new network namespace holding only lo, with
// env added to this process's environment and a connection on fd 3.
func StartProgram(path string, args, env []string, stdout, stderr io.Writer) (*Pod, error) {
	return StartProgramIn("", path, args, env, stdout, stderr)
}

// StartProgramIn is StartProgram in the network namespace at netns (the
// one a CNI ADD wired, as a runtime starts a pod's containers in its
// sandbox's); "" makes a new one.
func StartProgramIn(netns, path string, args, env []string, stdout, stderr io.Writer) (*Pod, error) {
	// The go tool builds binaries where only root may enter: copy it.
	dir, err := os.MkdirTemp("", "xdpq-pod-")
	if err != nil {
		return nil, err
	}
	p := &Pod{dir: dir}
	exe, err := p.copy(path)
	if err != nil {
		return nil, removeDir(dir, err)
	}
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, removeDir(dir, err)
	}
	parent, child := os.NewFile(uintptr(sp[0]), "pod-conn"), os.NewFile(uintptr(sp[1]), "pod-conn")
	defer func() { _ = child.Close() }() // the pod has its own copy once started
	fc, err := net.FileConn(parent)
	_ = parent.Close() // FileConn holds a duplicate
	if err != nil {
		return nil, removeDir(dir, err)
	}
	p.Conn = fc.(*net.UnixConn)
	p.Cmd = exec.Command(exe, args...)
	p.Cmd.Env = append(os.Environ(), env...)
	p.Cmd.ExtraFiles = []*os.File{child}
	p.Cmd.Stdout, p.Cmd.Stderr = stdout, stderr
	p.Cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNET,
		Credential: &syscall.Credential{Uid: 65534, Gid: 65534},
		Pdeathsig:  syscall.SIGKILL,
	}
	start := p.Cmd.Start
	if netns != "" {
		// The child is forked from a thread inside netns; WithNetNSPath
		// puts the thread back (an exiting thread would take the child
		// with it: Pdeathsig is per thread).
		p.Cmd.SysProcAttr.Cloneflags = 0
		start = func() error { return ns.WithNetNSPath(netns, func(ns.NetNS) error { return p.Cmd.Start() }) }
	}
	if err := start(); err != nil {
		_ = p.Conn.Close() // never used
		return nil, removeDir(dir, fmt.Errorf("start pod: %w", err))
	}
	return p, nil
}

// removeDir removes the pod's directory after err, adding to err a
// failure to.
func removeDir(dir string, err error) error {
	if rerr := os.RemoveAll(dir); rerr != nil {
		return errors.Join(err, rerr)
	}
	return err
}

func (p *Pod) copy(path string) (string, error) {
	if err := os.Chmod(p.dir, 0o755); err != nil {
		return "", err
	}
	in, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer func() { _ = in.Close() }() // read-only
	exe := filepath.Join(p.dir, filepath.Base(path))
	out, err := os.OpenFile(exe, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		return "", err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close() // a copy that failed already
		return "", err
	}
	return exe, out.Close()
}

// Wait waits for the pod to exit and cleans up.
func (p *Pod) Wait() error {
	err := p.Cmd.Wait()
	_ = p.Conn.Close() // the pod has exited: its end is gone
	// A copy of a binary in the temporary directory: the pod's outcome is
	// what the caller waits for.
	_ = os.RemoveAll(p.dir)
	return err
}

// Kill ends the pod if it still runs, and cleans up.
func (p *Pod) Kill() {
	if p.Cmd.ProcessState == nil {
		_ = p.Cmd.Process.Kill() // it may have exited on its own: Wait reaps it either way
		_ = p.Wait()             // killed: its exit status is the kill's
	}
}

// PodConn returns the pod's end of the connection (fd 3).
func PodConn() (*net.UnixConn, error) {
	f := os.NewFile(3, "pod-conn")
	defer func() { _ = f.Close() }() // FileConn holds a duplicate
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("pod connection on fd 3: %w", err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		_ = c.Close() // not ours to use
		return nil, fmt.Errorf("fd 3 is not a unix socket")
	}
	return uc, nil
}

// Identity fills in who the pod runs as: uid, effective capabilities and
// the links of its network namespace.
func Identity(m *Msg) error {
	return IdentityOf("self", m)
}

// IdentityOf reads the identity of process pid ("self" for this one) from
// procfs: uid, effective capabilities, and the links of its network
// namespace.
func IdentityOf(pid string, m *Msg) error {
	status, err := os.ReadFile(filepath.Join("/proc", pid, "status"))
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			m.CapEff = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(line, "Uid:"); ok {
			if f := strings.Fields(v); len(f) > 1 {
				m.UID = f[1] // effective
			}
		}
	}
	// /proc/<pid>/net/dev lists the links of the process's netns.
	dev, err := os.ReadFile(filepath.Join("/proc", pid, "net/dev"))
	if err != nil {
		return err
	}
	m.Links = nil
	for _, line := range strings.Split(string(dev), "\n")[2:] {
		if name, _, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			m.Links = append(m.Links, name)
		}
	}
	return nil
}

// RunPod is the main of a pod process: it runs pod on the connection of
// fd 3 (with a deadline for the whole exchange), reports a failure to the
// parent and by exit code, and returns the exit code.
func RunPod(timeout time.Duration, pod func(*net.UnixConn) error) int {
	conn, err := PodConn()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer func() { _ = conn.Close() }() // the process exits next
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := pod(conn); err != nil {
		fmt.Fprintln(os.Stderr, "pod:", err)
		_ = Send(conn, Msg{Error: err.Error()}) // the exit code and stderr say it too
		return 1
	}
	return 0
}

// PodCgroup creates the cgroup of a pod's container (cgroupfs layout on cgroup
// v1, systemd layout on cgroup v2), as kubelet lays them out, and returns
// its cgroup.procs file; it is removed when the test ends.
func PodCgroup(t testing.TB, container, podUID string) string {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err != nil {
		t.Fatal(err)
	}
	var root string
	var rel []string
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		root = "/sys/fs/cgroup"
		rel = []string{"kubepods.slice", "kubepods-besteffort.slice",
			"kubepods-besteffort-pod" + strings.ReplaceAll(podUID, "-", "_") + ".slice", "cri-containerd-" + container + ".scope"}
	} else {
		root = "/sys/fs/cgroup/pids"
		rel = []string{"kubepods", "besteffort", "pod" + podUID, container}
	}
	var made []string
	dir := root
	for _, r := range rel {
		dir = filepath.Join(dir, r)
		if err := os.Mkdir(dir, 0o755); err == nil {
			made = append(made, dir)
		} else if !os.IsExist(err) {
			t.Fatalf("cgroup %s: %v", dir, err)
		}
	}
	t.Cleanup(func() {
		for i := len(made) - 1; i >= 0; i-- {
			if err := os.Remove(made[i]); err != nil {
				t.Logf("cgroup %s left behind: %v", made[i], err)
			}
		}
	})
	return filepath.Join(dir, "cgroup.procs")
}
