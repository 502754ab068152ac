package daemon

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/kubepods"
	"github.com/xdpq/xdpq/pkg/ledger"
)

// PodDirectory is this node's pods by UID (Kubernetes mode). The broker
// learns a peer's pod UID from its cgroup; kubelet's PodResources API
// knows pods by namespace and name; a pod's xdpq.io/flows annotation is
// on its object. An informer on the API server's pods of this node
// (pkg/kubepods) joins them.
type PodDirectory interface {
	// PodByUID returns the pod of this node with uid, asking the API
	// server if need be, or an error saying why there is none.
	PodByUID(ctx context.Context, uid string) (kubepods.Pod, error)
	// Cached returns the pod of this node with uid, as last seen.
	Cached(uid string) (kubepods.Pod, bool)
	// Next waits for a pod that changed (or was touched) and returns its
	// UID; false when ctx ends. Done says it is dealt with.
	Next(ctx context.Context) (uid string, ok bool)
	Done(uid string)
	// Touch has Next return uid again: its allocation changed.
	Touch(uid string)
	// ByIP returns the node's pods that hold address a as their own
	// (status.podIPs; not hostNetwork pods, nor pods that ended), as
	// last seen.
	ByIP(a netip.Addr) []kubepods.Pod
}

// claimPod is the broker's Config.ClaimPod: an allocation kubelet's
// Allocate made for a pod it did not name is bound to the pod of the
// first process that connects, if kubelet says that pod holds the
// allocation's devices. The owner is recorded before the broker takes it,
// so a restarted daemon keeps it.
func (d *Daemon) claimPod(ctx context.Context, id string, pod broker.PodIdentity) error {
	a, ok := d.ledger.Get(id)
	if !ok {
		return api.Errorf(api.ErrNotFound, "no allocation %q", id)
	}
	if a.Owner.PodUID != "" && a.Owner.PodUID != pod.PodUID {
		return fmt.Errorf("the allocation belongs to pod %s", a.Owner.PodUID)
	}
	kp, err := d.opts.Pods.PodByUID(ctx, pod.PodUID)
	if err != nil {
		return err
	}
	namespace, name := kp.Namespace, kp.Name
	devs, err := d.kubelet.podDevices(ctx, namespace, name)
	if err != nil {
		return err
	}
	p, _ := d.ledger.Meta(a.Pool)
	res := resourceOf(a, p)
	for _, dev := range a.Devices {
		if !slices.Contains(devs[res], dev) {
			return fmt.Errorf("kubelet says pod %s/%s does not hold %s %s of this allocation", namespace, name, res, dev)
		}
	}
	if err := d.ledger.SetOwner(id, ledger.Owner{PodUID: pod.PodUID}); err != nil {
		return err
	}
	d.log.Info("allocation bound to its pod", "allocation", id, "pod", namespace+"/"+name, "pod_uid", pod.PodUID)
	d.opts.Pods.Touch(pod.PodUID) // its flows annotation applies now
	return nil
}
