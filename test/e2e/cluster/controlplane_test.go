package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// TestControlPlane starts etcd and kube-apiserver, creates a namespace
// with client-go, reads it with the real kubectl, checks what the
// authorizer allows a node and an anonymous client, and stops the
// cluster: its processes gone and its directory removed.
func TestControlPlane(t *testing.T) {
	cp := StartControlPlaneForTest(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	ns, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-cp", Labels: map[string]string{"xdpq.io/test": "control-plane"}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	out, err := cp.Kubectl(ctx, "get", "namespace", "e2e-cp", "-o", "jsonpath={.metadata.uid} {.metadata.labels.xdpq\\.io/test}")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(out), string(ns.UID)+" control-plane"; got != want {
		t.Errorf("kubectl get namespace: %q, want %q", got, want)
	}
	out, err = cp.Kubectl(ctx, "auth", "whoami", "-o", "jsonpath={.status.userInfo.groups}")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "system:masters") {
		t.Errorf("kubectl auth whoami: groups %s, want system:masters", out)
	}

	// The node's credentials: the Node authorizer lets it read its own
	// Node only, and RBAC gives it nothing else.
	node := rest.CopyConfig(cp.Config)
	node.BearerToken = cp.Token("system:node:" + cp.NodeName)
	nc, err := kubernetes.NewForConfig(node)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.CoreV1().Namespaces().Get(ctx, "e2e-cp", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node reads a namespace: %v, want forbidden", err)
	}
	if _, err := nc.CoreV1().Nodes().Get(ctx, cp.NodeName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("node reads its own Node before registering: %v, want not found", err)
	}
	anon := rest.AnonymousClientConfig(cp.Config)
	ac, err := kubernetes.NewForConfig(anon)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ac.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) && !apierrors.IsUnauthorized(err) {
		t.Errorf("anonymous list of namespaces: %v, want refused", err)
	}

	pids := cp.pids()
	if len(pids) != 2 {
		t.Fatalf("%d processes, want etcd and kube-apiserver", len(pids))
	}
	if err := cp.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("process %d after Stop: kill 0: %v, want ESRCH", pid, err)
		}
	}
	if _, err := os.Stat(cp.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s after Stop: %v, want removed", cp.Dir, err)
	}
	if err := cp.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

// pids returns the process ids of the running components.
func (cp *ControlPlane) pids() []int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	var pids []int
	for _, p := range cp.procs {
		pids = append(pids, p.cmd.Process.Pid)
	}
	return pids
}

// helperEnv makes the test binary run interruptChild for
// TestInterrupt instead of skipping it.
const helperEnv = "XDPQ_E2E_INTERRUPT_HELPER"

// TestInterrupt runs a control plane in a child test process, sends the
// child SIGINT (a Ctrl-C) and checks that the child tore it down before
// it died of the signal: processes gone, directory removed.
func TestInterrupt(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cp")
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.v")
	cmd.Env = append(os.Environ(), helperEnv+"="+dir)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var pids []int
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if f, ok := strings.CutPrefix(sc.Text(), "PIDS "); ok {
			for _, s := range strings.Fields(f) {
				pid, err := strconv.Atoi(s)
				if err != nil {
					t.Fatal(err)
				}
				pids = append(pids, pid)
			}
			break
		}
	}
	if len(pids) != 2 {
		t.Fatalf("the child printed pids %v, want etcd's and kube-apiserver's (scan: %v)", pids, sc.Err())
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, stdout)
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGINT {
		t.Errorf("child's exit: %v, want death by SIGINT", err)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("process %d after the child's SIGINT: kill 0: %v, want ESRCH", pid, err)
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s after the child's SIGINT: %v, want removed", dir, err)
	}
}

// interruptChild is TestInterrupt's child (TestMain runs it when
// helperEnv is set): it starts a control plane, prints its processes' ids
// and waits for a signal.
func interruptChild(dir string) error {
	cp, err := StartControlPlane(context.Background(), dir, Options{})
	if err != nil {
		return err
	}
	fmt.Printf("PIDS %d %d\n", cp.pids()[0], cp.pids()[1])
	select {}
}

// TestMain runs the test binary as one of the tests' children when their
// variable says so, else the tests.
func TestMain(m *testing.M) {
	var child func() error
	switch {
	case os.Getenv(helperEnv) != "":
		child = func() error { return interruptChild(os.Getenv(helperEnv)) }
	case os.Getenv(killedEnv) != "":
		child = nodeKilledChild
	default:
		os.Exit(m.Run())
	}
	if err := child(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// TestHelm runs the Helm CLI against a control plane: its version is
// the module's, and it lists the (no) releases of the cluster.
func TestHelm(t *testing.T) {
	cp := StartControlPlaneForTest(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute) // a fresh build of helm included
	defer cancel()
	out, err := cp.Helm(ctx, "version", "--template", "{{.Version}}")
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != "v4.3.2" {
		t.Errorf("helm version %q, want v4.3.2", out)
	}
	out, err = cp.Helm(ctx, "list", "--all-namespaces", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(out)) != "[]" {
		t.Errorf("helm list: %s, want no release", out)
	}
}
