package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/vishvananda/netlink"

	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// podNetdevs are the netdevs in pods (a netdev-mode pool's attachments,
// netdev.go) with the agents that manage them there, by node name. The
// daemon moves a netdev in and out and records it in the ledger;
// podNetdevs keeps what runs while it is away. Its mutex guards the map
// alone and is never held across a call out.
type podNetdevs struct {
	log      *slog.Logger
	pinRoot  string // the node agent's pin directory: the pod agents' pins are under it
	stateDir string // the daemon's: the pod agents' state is under it
	onChange func() // a pod agent's report changed

	mu   sync.Mutex
	pods map[string]*podNetdev
}

func newPodNetdevs(log *slog.Logger, pinRoot, stateDir string, onChange func()) *podNetdevs {
	return &podNetdevs{log: log, pinRoot: pinRoot, stateDir: stateDir, onChange: onChange, pods: map[string]*podNetdev{}}
}

// get is the netdev's entry, nil when it is not in a pod (or not adopted).
func (p *podNetdevs) get(netdev string) *podNetdev {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pods[netdev]
}

// add enters a netdev whose agent runs.
func (p *podNetdevs) add(pn *podNetdev) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pods[pn.rec.netdev()] = pn
}

// take removes and returns netdev's entry if it is attachment key's; else
// it returns nil and changes nothing.
func (p *podNetdevs) take(netdev, key string) *podNetdev {
	p.mu.Lock()
	defer p.mu.Unlock()
	pn := p.pods[netdev]
	if pn == nil || pn.key != key {
		return nil
	}
	delete(p.pods, netdev)
	return pn
}

// all is every entry, in no order.
func (p *podNetdevs) all() []*podNetdev {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Collect(maps.Values(p.pods))
}

func (p *podNetdevs) pinDir(netdev string) string {
	return filepath.Join(p.pinRoot, "pods", netdev)
}

func (p *podNetdevs) agentStateDir(netdev string) string {
	return filepath.Join(p.stateDir, "pods", netdev)
}

// start starts the agent of a netdev moved into its pod, with the
// record's policy and the attachment's flows.
func (p *podNetdevs) start(pn *podNetdev, flows []agent.Flow) error {
	ag, err := agent.New(agent.Config{NetNS: pn.nsPath(), PinDir: p.pinDir(pn.rec.netdev()), StateDir: p.agentStateDir(pn.rec.netdev()),
		Logger: p.log.With("pod_netdev", pn.rec.netdev()), OnChange: p.onChange})
	if err != nil {
		return err
	}
	pn.policy = pn.rec.Policy
	if err := ag.Set(pn.rec.ifName(), pn.policy); err != nil {
		return errors.Join(err, ag.Close())
	}
	if len(flows) > 0 {
		if err := ag.Steer(pn.rec.ifName(), pn.key, flows); err != nil {
			// What the undo leaves is said; the caller's undo (the
			// netdev back to the node) goes on.
			return errors.Join(err, ag.Unmanage(pn.rec.ifName()), ag.Close())
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	pn.agent, pn.stop, pn.done = ag, stop, make(chan struct{})
	go func() {
		defer close(pn.done)
		if err := ag.Run(ctx); err != nil {
			p.log.Error("pod netdev agent", "netdev", pn.rec.netdev(), "err", err)
		}
	}()
	return nil
}

// stop stops the pod's agent; with unmanage it takes xdpq's program and
// pins off the netdev, else they stay (the daemon stops).
func (p *podNetdevs) stop(pn *podNetdev, unmanage bool) error {
	var err error
	if pn.agent != nil {
		pn.stop()
		<-pn.done
		if unmanage {
			err = pn.agent.Unmanage(pn.rec.ifName())
		}
		err = errors.Join(err, pn.agent.Close())
	}
	// Without an agent (not adopted: a netdev found half moved, or its
	// pod gone at start) no agent of this daemon ran there, but a
	// previous one's pins and state are left.
	if unmanage {
		for _, dir := range []string{p.pinDir(pn.rec.netdev()), p.agentStateDir(pn.rec.netdev()), filepath.Dir(dpdkMapPin(p.pinRoot, pn.rec.netdev()))} {
			if rerr := os.RemoveAll(dir); rerr != nil {
				p.log.Warn("the pins or state of a netdev back from its pod are left", "dir", dir, "err", rerr)
			}
		}
	}
	return err
}

// target is where sockets bind on a netdev in a pod, and its entry.
func (p *podNetdevs) target(netdev string) (xsk.Netdev, *podNetdev, error) {
	pn := p.get(netdev)
	if pn == nil {
		return xsk.Netdev{}, nil, fmt.Errorf("netdev %s is not in a pod", netdev)
	}
	h, err := netlink.NewHandleAt(pn.ns)
	if err != nil {
		return xsk.Netdev{}, nil, err
	}
	defer h.Close()
	l, err := h.LinkByName(pn.rec.ifName())
	if err != nil {
		return xsk.Netdev{}, nil, fmt.Errorf("netdev %s in the pod as %s: %w", netdev, pn.rec.ifName(), err)
	}
	return xsk.Netdev{Name: pn.rec.ifName(), Ifindex: l.Attrs().Index, NetNS: pn.nsPath()}, pn, nil
}

// release lets go of every netdev when the daemon stops: the agents'
// handles close; what they attached stays (a restarted daemon adopts it),
// and so do the netdevs.
func (p *podNetdevs) release() {
	p.mu.Lock()
	pods := p.pods
	p.pods = map[string]*podNetdev{}
	p.mu.Unlock()
	for _, pn := range pods {
		if err := p.stop(pn, false); err != nil {
			p.log.Warn("release the agent of a netdev in a pod", "netdev", pn.rec.netdev(), "err", err)
		}
		_ = pn.ns.Close() // a namespace handle: the netdev stays in it, on record
	}
}
