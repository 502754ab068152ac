package daemon

import (
	"context"
	"fmt"
	"slices"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/ledger"
)

// PodDirectory finds a pod of this node by its UID (Kubernetes mode). The
// broker learns a peer's pod UID from its cgroup; kubelet's PodResources
// API knows pods by namespace and name. An informer on the API server's
// pods of this node (cmd/deviceplugin, pkg/kubepods) joins the two.
type PodDirectory interface {
	// PodByUID returns the namespace and name of the pod of this node with
	// uid, or an error saying why it has none.
	PodByUID(ctx context.Context, uid string) (namespace, name string, err error)
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
	namespace, name, err := d.opts.Pods.PodByUID(ctx, pod.PodUID)
	if err != nil {
		return err
	}
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
	return nil
}
