// Package nri runs xdpq's NRI plugin: the container runtime (containerd
// 2, CRI-O) tells it when a pod's sandbox runs and stops, with the pod's
// network namespace, so that the daemon moves a netdev a DRA claim holds
// into the pod before its containers start and back out before the
// namespace goes. This is the hook DRANET and the SR-IOV DRA driver use:
// unlike a CNI attachment it needs no network configuration (no Multus),
// and unlike kubelet's Prepare it comes when the namespace exists.
package nri

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	nriapi "github.com/containerd/nri/pkg/api"
	nrilog "github.com/containerd/nri/pkg/log"
	"github.com/containerd/nri/pkg/stub"
)

// DefaultSocket is where containerd and CRI-O listen for NRI plugins.
const DefaultSocket = nriapi.DefaultSocketPath

// PluginName and PluginIndex are how the runtime knows the plugin, and
// where it runs among others (lower first).
const (
	PluginName  = "xdpq"
	PluginIndex = "50"
)

// Pod is a pod sandbox as the runtime tells it.
type Pod struct {
	UID, Namespace, Name string
	// Sandbox is the runtime's id of the pod's sandbox.
	Sandbox string
	// Netns is the path of the pod's network namespace, "" for a pod
	// in the host's.
	Netns string
	// Pid is the sandbox's process (0 if the runtime does not say).
	Pid uint32
}

func (p Pod) String() string { return p.Namespace + "/" + p.Name }

// Handler is what the runtime's events are for.
type Handler interface {
	// RunPod is called when a pod's sandbox has its network namespace,
	// before its containers are created; an error fails the sandbox
	// (kubelet tries again).
	RunPod(ctx context.Context, p Pod) error
	// StopPod is called when a pod's sandbox stops, before its network
	// namespace goes (once more when it is removed).
	StopPod(ctx context.Context, p Pod) error
	// Synchronize is called with the pods running when the plugin
	// connects: what happened while it was not connected. Its error is
	// only logged (the runtime would drop the plugin).
	Synchronize(ctx context.Context, pods []Pod) error
}

// Run connects to the runtime's NRI socket and serves h until ctx ends,
// connecting again (after retry) whenever the connection is lost or
// cannot be made: the runtime restarts, or starts after the daemon.
// connected, if not nil, is called each time the plugin has registered
// and synchronized.
func Run(ctx context.Context, socket string, h Handler, log *slog.Logger, retry time.Duration, connected func()) error {
	said := ""
	for {
		err := runOnce(ctx, socket, h, log, connected)
		if ctx.Err() != nil {
			return nil
		}
		if err.Error() != said { // a runtime without NRI: said once
			said = err.Error()
			log.Warn("NRI: not connected to the runtime; trying again", "socket", socket, "every", retry, "err", err)
		}
		t := time.NewTimer(retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// dial connects to the runtime (a test sees the connection through it).
var dial = func(path string) (net.Conn, error) { return net.Dial("unix", path) }

func runOnce(ctx context.Context, socket string, h Handler, log *slog.Logger, connected func()) error {
	p := &plugin{h: h, log: log, connected: connected}
	s, err := stub.New(p, stub.WithPluginName(PluginName), stub.WithPluginIdx(PluginIndex), stub.WithSocketPath(socket),
		stub.WithDialer(dial), stub.WithLogger(logger{log}))
	if err != nil {
		return err
	}
	err = s.Run(ctx)
	if err == nil {
		err = errors.New("the runtime closed the connection")
	}
	return err
}

// plugin adapts the stub's interfaces to a Handler.
type plugin struct {
	h         Handler
	log       *slog.Logger
	connected func()
}

func (p *plugin) Configure(_ context.Context, _, runtime, version string) (nriapi.EventMask, error) {
	p.log.Info("NRI: registered with the runtime", "runtime", runtime, "version", version)
	return nriapi.MustParseEventMask("RunPodSandbox,StopPodSandbox,RemovePodSandbox"), nil
}

func (p *plugin) Synchronize(ctx context.Context, pods []*nriapi.PodSandbox, _ []*nriapi.Container) ([]*nriapi.ContainerUpdate, error) {
	out := make([]Pod, 0, len(pods))
	for _, s := range pods {
		out = append(out, podOf(s))
	}
	// An error here would have the runtime drop the plugin: what could
	// not be done is the handler's to say and to try again.
	if err := p.h.Synchronize(ctx, out); err != nil {
		p.log.Warn("NRI: synchronizing with the runtime's pods", "err", err)
	}
	if p.connected != nil {
		p.connected()
	}
	return nil, nil
}

func (p *plugin) RunPodSandbox(ctx context.Context, s *nriapi.PodSandbox) error {
	pod := podOf(s)
	if err := p.h.RunPod(ctx, pod); err != nil {
		return fmt.Errorf("pod %s: %w", pod, err)
	}
	return nil
}

func (p *plugin) StopPodSandbox(ctx context.Context, s *nriapi.PodSandbox) error {
	return p.h.StopPod(ctx, podOf(s))
}

func (p *plugin) RemovePodSandbox(ctx context.Context, s *nriapi.PodSandbox) error {
	return p.h.StopPod(ctx, podOf(s))
}

// podOf is the pod of a sandbox.
func podOf(s *nriapi.PodSandbox) Pod {
	p := Pod{UID: s.GetUid(), Namespace: s.GetNamespace(), Name: s.GetName(), Sandbox: s.GetId(), Pid: s.GetPid()}
	for _, ns := range s.GetLinux().GetNamespaces() {
		if ns.GetType() == "network" {
			p.Netns = ns.GetPath()
		}
	}
	return p
}

// logger is NRI's logger on the daemon's.
type logger struct{ l *slog.Logger }

func (l logger) Debugf(ctx context.Context, f string, a ...any) {
	l.l.DebugContext(ctx, "NRI: "+fmt.Sprintf(f, a...))
}
func (l logger) Infof(ctx context.Context, f string, a ...any) {
	l.l.DebugContext(ctx, "NRI: "+fmt.Sprintf(f, a...))
}
func (l logger) Warnf(ctx context.Context, f string, a ...any) {
	l.l.WarnContext(ctx, "NRI: "+fmt.Sprintf(f, a...))
}
func (l logger) Errorf(ctx context.Context, f string, a ...any) {
	l.l.ErrorContext(ctx, "NRI: "+fmt.Sprintf(f, a...))
}

var _ nrilog.Logger = logger{}
