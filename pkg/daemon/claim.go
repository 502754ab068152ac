package daemon

import (
	"context"
	"errors"
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

// claimPod is the broker's Config.ClaimPod: an allocation made for a pod
// not named yet is bound to the pod of the first process that connects,
// if that pod holds it: kubelet's Allocate (the device plugin) names no
// pod, and kubelet's PodResources says which pod holds the devices; a
// claim shared by several pods (DRA) is prepared once for all of them,
// and its status.reservedFor says which pods may use it. Its queues
// serve one of them: the first to connect, until it is gone
// (dra.Face.Collect); the others are refused, naming it. The owner is
// recorded before the broker takes it, so a restarted daemon keeps it.
func (d *Daemon) claimPod(ctx context.Context, id string, pod broker.PodIdentity) error {
	a, ok := d.core.ledger.Get(id)
	if !ok {
		return api.Errorf(api.ErrNotFound, "no allocation %q", id)
	}
	if a.Owner.PodUID != "" && a.Owner.PodUID != pod.PodUID {
		return d.ownedBy(ctx, a)
	}
	kp, err := d.opts.Pods.PodByUID(ctx, pod.PodUID)
	if err != nil {
		return err
	}
	namespace, name := kp.Namespace, kp.Name
	if a.Claim != nil {
		if err := d.dra.ReservedFor(ctx, a, pod.PodUID); err != nil {
			return err
		}
	} else {
		devs, err := d.core.kubelet.podDevices(ctx, namespace, name)
		if err != nil {
			return err
		}
		p, _ := d.core.ledger.Meta(a.Pool)
		res := resourceOf(a, p)
		for _, dev := range a.Devices {
			if !slices.Contains(devs[res], dev) {
				return fmt.Errorf("kubelet says pod %s/%s does not hold %s %s of this allocation", namespace, name, res, dev)
			}
		}
	}
	if err := d.core.ledger.BindOwner(id, pod.PodUID); err != nil {
		if errors.Is(err, api.ErrConflict) { // another pod came first
			a, _ = d.core.ledger.Get(id)
			return d.ownedBy(ctx, a)
		}
		return err
	}
	d.log.Info("allocation bound to its pod", "allocation", id, "pod", namespace+"/"+name, "pod_uid", pod.PodUID)
	d.opts.Pods.Touch(pod.PodUID) // its flows annotation applies now
	return nil
}

// ownedBy is the refusal of a pod that is not allocation a's owner,
// naming the owner (and the claim it shares, if any).
func (d *Daemon) ownedBy(ctx context.Context, a ledger.Allocation) error {
	owner := "pod " + a.Owner.PodUID
	if kp, err := d.opts.Pods.PodByUID(ctx, a.Owner.PodUID); err == nil {
		owner = fmt.Sprintf("pod %s/%s (%s)", kp.Namespace, kp.Name, a.Owner.PodUID)
	}
	if a.Claim != nil {
		return fmt.Errorf("claim %s/%s is shared, and its queues serve one pod at a time: %s connected first and holds them until it is gone; "+
			"give each pod a claim of its own (a ResourceClaimTemplate) to give each its queues", a.Claim.Namespace, a.Claim.Name, owner)
	}
	return fmt.Errorf("the allocation belongs to %s", owner)
}
