package nri

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
)

// recorder is a Handler that records what it is told.
type recorder struct {
	mu     sync.Mutex
	events []string
	fail   error
}

func (r *recorder) add(e string) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *recorder) RunPod(_ context.Context, p Pod) error {
	r.add("run " + p.String() + " " + p.UID + " " + p.Sandbox + " " + p.Netns)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fail
}

func (r *recorder) StopPod(_ context.Context, p Pod) error {
	r.add("stop " + p.String() + " " + p.Sandbox)
	return nil
}

func (r *recorder) Synchronize(_ context.Context, pods []Pod) error {
	names := []string{}
	for _, p := range pods {
		names = append(names, p.String()+" "+p.Netns)
	}
	r.add("sync [" + strings.Join(names, ",") + "]")
	return errors.New("a failed synchronization is only logged")
}

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.events
	r.events = nil
	return e
}

// runtime is NRI's own runtime side (what containerd embeds) on a
// socket, with pods it synchronizes a plugin with.
func runtime(t *testing.T, dir string, pods ...*adaptation.PodSandbox) *adaptation.Adaptation {
	t.Helper()
	sync := func(ctx context.Context, cb adaptation.SyncCB) error {
		_, err := cb(ctx, pods, nil)
		return err
	}
	update := func(context.Context, []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		return nil, nil
	}
	r, err := adaptation.New("test-runtime", "v0", sync, update, adaptation.WithSocketPath(filepath.Join(dir, "nri.sock")),
		adaptation.WithPluginPath(filepath.Join(dir, "plugins")), adaptation.WithPluginConfigPath(filepath.Join(dir, "conf.d")))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	return r
}

func sandbox(name, netns string) *adaptation.PodSandbox {
	return &adaptation.PodSandbox{Id: "sb-" + name, Uid: "uid-" + name, Namespace: "default", Name: name,
		Linux: &adaptation.LinuxPodSandbox{Namespaces: []*adaptation.LinuxNamespace{
			{Type: "ipc"}, {Type: "network", Path: netns}}}}
}

// TestPlugin: against NRI's own runtime side, the plugin synchronizes
// with the pods there when it connects (a failed synchronization keeps
// it connected), hears a sandbox run and stop with the pod's netns, and
// a RunPod error fails the runtime's RunPodSandbox (kubelet tries
// again); when the runtime restarts, the plugin connects again and
// synchronizes with the pods the new runtime has.
func TestPlugin(t *testing.T) {
	dir := t.TempDir()
	conns := make(chan net.Conn, 4)
	dial = func(path string) (net.Conn, error) {
		c, err := net.Dial("unix", path)
		if err == nil {
			conns <- c
		}
		return c, err
	}
	rt := runtime(t, dir, sandbox("old", "/var/run/netns/old"))
	rec := &recorder{}
	connected := make(chan struct{}, 4)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, filepath.Join(dir, "nri.sock"), rec, slog.New(slog.DiscardHandler), 10*time.Millisecond,
			func() { connected <- struct{}{} })
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	<-connected
	if got := rec.take(); !slices.Equal(got, []string{"sync [default/old /var/run/netns/old]"}) {
		t.Fatalf("events at connection: %q", got)
	}

	// The runtime adds the plugin to its list after the synchronization
	// (its own goroutine): a RunPodSandbox before that reaches no one.
	pod := sandbox("web", "/var/run/netns/web")
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := rt.RunPodSandbox(ctx, &adaptation.RunPodSandboxRequest{Pod: pod}); err != nil {
			t.Fatal(err)
		}
		if got := rec.take(); len(got) > 0 {
			if !slices.Equal(got, []string{"run default/web uid-web sb-web /var/run/netns/web"}) {
				t.Fatalf("events at RunPodSandbox: %q", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the plugin heard no RunPodSandbox in 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	rec.mu.Lock()
	rec.fail = errors.New("netdev eth9 is gone")
	rec.mu.Unlock()
	err := rt.RunPodSandbox(ctx, &adaptation.RunPodSandboxRequest{Pod: pod})
	if err == nil || !strings.Contains(err.Error(), "pod default/web: netdev eth9 is gone") {
		t.Errorf("RunPodSandbox with a failing handler: %v", err)
	}
	if err := rt.StopPodSandbox(ctx, &adaptation.StopPodSandboxRequest{Pod: pod}); err != nil {
		t.Fatal(err)
	}
	if err := rt.RemovePodSandbox(ctx, &adaptation.RemovePodSandboxRequest{Pod: pod}); err != nil {
		t.Fatal(err)
	}
	if got := rec.take(); !slices.Equal(got, []string{"run default/web uid-web sb-web /var/run/netns/web", "stop default/web sb-web", "stop default/web sb-web"}) {
		t.Errorf("events: %q", got)
	}

	// The runtime restarts with other pods: the plugin is back, told.
	// (Stop leaves external plugins connected: the runtime's process
	// ending closes the connection.)
	rt.Stop()
	(<-conns).Close()
	rt = runtime(t, dir, sandbox("web", "/var/run/netns/web"), sandbox("dns", "/var/run/netns/dns"))
	defer rt.Stop()
	<-connected
	if got := rec.take(); !slices.Equal(got, []string{"sync [default/web /var/run/netns/web,default/dns /var/run/netns/dns]"}) {
		t.Errorf("events after the runtime's restart: %q", got)
	}
}
