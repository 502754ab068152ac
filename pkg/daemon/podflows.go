package daemon

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/apis/xdpq/v1alpha1"
	"github.com/xdpq/xdpq/pkg/flow"
	"github.com/xdpq/xdpq/pkg/kubepods"
	"github.com/xdpq/xdpq/pkg/ledger"
)

// FlowsAnnotation is the pod annotation whose flows the daemon steers to
// the pod's allocation (Kubernetes mode, with an API server): a JSON list
// with the schema of the CNI configuration's "flows", so that a pod needs
// no NetworkAttachmentDefinition of its own. A pod holding allocations of
// several pools names each pool's: FlowsAnnotation + "." + pool. A flow's
// destination must be one of the pod's own addresses (empty or "ipam":
// all of them): a pod steers its own traffic, never another's, and never
// the node's (a hostNetwork pod's addresses are the node's: refused,
// unless the pool's sharedDestinations grant them).
const FlowsAnnotation = "xdpq.io/flows"

// podFlowsRef is the attachment that holds the annotated flows of a pod's
// allocation of pool: not a CNI attachment, it has no netns and goes with
// its allocation.
func podFlowsRef(podUID, pool string) api.AttachmentRef {
	return api.AttachmentRef{ContainerID: podFlowsPrefix + podUID, IfName: "flows." + pool}
}

// podFlowsLoop applies the flows annotations of the node's pods whenever
// a pod changes or its allocation is bound to it.
func (d *Daemon) podFlowsLoop(ctx context.Context) error {
	for {
		uid, ok := d.opts.Pods.Next(ctx)
		if !ok {
			return ctx.Err()
		}
		d.syncPodFlows(ctx, uid)
		d.opts.Pods.Done(uid)
	}
}

// syncPodFlows makes the annotated-flows attachments of the pod's
// allocations what its annotations say now.
func (d *Daemon) syncPodFlows(ctx context.Context, uid string) {
	var allocs []ledger.Allocation
	for _, a := range d.ledger.Allocations() {
		if a.Owner.PodUID == uid {
			allocs = append(allocs, a)
		}
	}
	pod, known := d.opts.Pods.Cached(uid)
	if !known || len(allocs) == 0 {
		return // a pod gone takes its flows with its allocations
	}
	ref := v1alpha1.PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: uid}
	for _, a := range allocs {
		key := podFlowsRef(uid, a.Pool)
		want, refused, wait := d.annotatedFlows(pod, a, len(allocs))
		if wait {
			continue // the pod has no address yet: its next update
		}
		cur, has := d.ledger.Attachment(key.ContainerID + "/" + key.IfName)
		if refused == "" && (has && slices.Equal(cur.Flows, want) || !has && len(want) == 0) {
			continue
		}
		if has {
			if err := d.del(ctx, key); err != nil {
				d.log.Warn("the pod's annotated flows could not be removed", "pod", pod.Namespace+"/"+pod.Name, "allocation", a.ID, "err", err)
				continue
			}
		}
		if refused == "" && len(want) > 0 {
			if _, err := d.add(ctx, api.CNIAddRequest{ContainerID: key.ContainerID, IfName: key.IfName, Allocation: a.ID,
				PodUID: uid, PodNamespace: pod.Namespace, PodName: pod.Name, Flows: want, Addresses: pod.IPs}); err != nil {
				refused = err.Error()
			}
		}
		if d.podFlowsSaid(key, want, refused) {
			continue
		}
		switch {
		case refused != "":
			d.log.Warn("the pod's annotated flows are refused", "pod", pod.Namespace+"/"+pod.Name, "allocation", a.ID, "reason", refused)
		case len(want) == 0:
			d.log.Info("the pod's annotated flows are removed", "pod", pod.Namespace+"/"+pod.Name, "allocation", a.ID)
		default:
			d.log.Info("the pod's annotated flows are steered", "pod", pod.Namespace+"/"+pod.Name, "allocation", a.ID, "flows", len(want))
		}
		if refused != "" || len(want) > 0 {
			flows := make([]string, len(want))
			for i, f := range want {
				flows[i] = flow.Format(f)
			}
			d.node.PodFlows(ref, a.ID, flows, refused)
		}
	}
}

// podFlowsSaid says whether the outcome for key was already told (logged
// and an Event); else it records it as told.
func (d *Daemon) podFlowsSaid(key api.AttachmentRef, flows []api.CNIFlow, refused string) bool {
	said := fmt.Sprint(flows, refused)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.flowsSaid == nil {
		d.flowsSaid = map[api.AttachmentRef]string{}
	}
	if d.flowsSaid[key] == said {
		return true
	}
	d.flowsSaid[key] = said
	return false
}

// forgetPodFlows forgets what was told of the annotated flows of key,
// whose allocation is gone: flowsSaid holds the pods that hold
// allocations, not every pod the node ever ran.
func (d *Daemon) forgetPodFlows(key api.AttachmentRef) {
	d.mu.Lock()
	delete(d.flowsSaid, key)
	d.mu.Unlock()
}

// annotatedFlows are the flows the pod's annotations give allocation a
// (of n the pod holds), or why they are refused; wait when they name the
// pod's addresses and it has none yet.
func (d *Daemon) annotatedFlows(pod kubepods.Pod, a ledger.Allocation, n int) (flows []api.CNIFlow, refused string, wait bool) {
	name := FlowsAnnotation + "." + a.Pool
	var val string
	var ok bool
	if a.Claim != nil && a.Claim.Flows != nil {
		// A claim's flows are its configuration's. A claim without (the
		// one the scheduler makes for a pod that asks for the extended
		// resource) leaves them to the pod's annotations, as with the
		// device plugin.
		name = fmt.Sprintf("claim %s/%s: flows", a.Claim.Namespace, a.Claim.Name)
		val, ok = string(a.Claim.Flows), true
	} else if val, ok = pod.Annotations[name]; !ok {
		if val, ok = pod.Annotations[FlowsAnnotation]; ok && n > 1 {
			return nil, fmt.Sprintf("the pod holds allocations of %d pools: annotate each pool's flows as %s.<pool>", n, FlowsAnnotation), false
		}
		name = FlowsAnnotation
	}
	if !ok || strings.TrimSpace(val) == "" {
		return nil, "", false
	}
	p, _ := d.ledger.Meta(a.Pool)
	if p.Mode() == api.ModeNetdev && a.Claim != nil {
		return nil, "", false // its flows come with the move into the pod (nri.go)
	}
	if p.Mode() == api.ModeNetdev {
		return nil, fmt.Sprintf("pool %s hands out whole netdevs: its flows come with its CNI attachment", a.Pool), false
	}
	parsed, err := flow.ParseList([]byte(val), name)
	if err != nil {
		return nil, err.Error(), false
	}
	if len(pod.IPs) == 0 {
		return nil, "", true
	}
	flows, err = flow.Resolve(parsed, pod.IPs)
	if err != nil {
		return nil, err.Error(), false
	}
	if err := flow.CheckOwn(flows, pod.IPs, p.Config.SharedPrefixes()); err != nil {
		return nil, fmt.Sprintf("%s: %v", name, err), false
	}
	return flows, "", false
}
