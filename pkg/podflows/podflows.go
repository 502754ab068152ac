// Package podflows is the daemon's face for the xdpq.io/flows pod
// annotation: a pod that holds an allocation names the flows to steer to
// its queues in an annotation, with no NetworkAttachmentDefinition and
// no CNI ADD of its own. Whenever a pod of the node changes, or its
// allocation is bound to it, the face makes the daemon's own attachment
// of each of the pod's allocations (Ref) hold what the annotations say
// now, through the allocation core's CNI verbs, and tells the cluster
// (once per outcome) what it steered or why it refused.
//
// It holds no state of its own but what it last told; the attachments
// are the core's, and go with their allocations.
package podflows

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/apis/xdpq/v1alpha1"
	"github.com/xdpq/xdpq/pkg/flow"
	"github.com/xdpq/xdpq/pkg/kubepods"
)

// Annotation is the pod annotation whose flows the daemon steers to the
// pod's allocation (Kubernetes mode, with an API server): a JSON list
// with the schema of the CNI configuration's "flows". A pod holding
// allocations of several pools names each pool's: Annotation + "." +
// pool. A flow's destination must be one of the pod's own addresses
// (empty or "ipam": all of them): a pod steers its own traffic, never
// another's, and never the node's (a hostNetwork pod's addresses are the
// node's: refused, unless the pool's sharedDestinations grant them).
const Annotation = "xdpq.io/flows"

// Prefix begins the container id of the attachments that hold a pod's
// annotated flows (Ref): the daemon's own, never a runtime's (whose ids
// are hex), so the CNI verbs refuse it.
const Prefix = "pod-"

// Ref is the attachment that holds the annotated flows of a pod's
// allocation of pool: not a CNI attachment, it has no netns and goes
// with its allocation.
func Ref(podUID, pool string) api.AttachmentRef {
	return api.AttachmentRef{ContainerID: Prefix + podUID, IfName: "flows." + pool}
}

// IsPodFlows says whether containerID names the attachments of a pod's
// annotated flows.
func IsPodFlows(containerID string) bool { return strings.HasPrefix(containerID, Prefix) }

// Allocation is one of a pod's allocations as the face needs it.
type Allocation struct {
	ID, Pool string
	// Netdev: the pool hands out whole netdevs (their flows come with
	// the CNI attachment or the claim's move into the pod, never an
	// annotation).
	Netdev bool
	// Claim is the DRA claim the allocation was made for, "ns/name"; ""
	// for the device plugin's. ClaimFlows are its configuration's flows
	// (nil: the claim leaves them to the pod's annotations, as the one
	// the scheduler makes for a pod asking the extended resource does).
	Claim      string
	ClaimFlows []byte
	// Shared are the destinations the pool grants every pod
	// (sharedDestinations).
	Shared []netip.Prefix
	// Flows are the flows its annotated-flows attachment (Ref) holds
	// now; Attached says whether it has one.
	Flows    []api.CNIFlow
	Attached bool
}

// Core is the allocation core as the face uses it.
type Core interface {
	// PodAllocations are the allocations bound to the pod with uid.
	PodAllocations(uid string) []Allocation
	// Add makes an attachment of the daemon's own (a Ref), as a CNI ADD.
	Add(ctx context.Context, req api.CNIAddRequest) error
	// Del ends one, as a CNI DEL.
	Del(ctx context.Context, ref api.AttachmentRef) error
}

// Pods are the node's pods: kubepods.Directory.
type Pods interface {
	// Cached returns the pod of this node with uid, as last seen.
	Cached(uid string) (kubepods.Pod, bool)
	// Next waits for a pod that changed (or was touched) and returns its
	// UID; false when ctx ends. Done says it is dealt with.
	Next(ctx context.Context) (uid string, ok bool)
	Done(uid string)
}

// Reporter tells the cluster a pod's annotated flows were steered
// (refused "") or refused: an Event on the pod.
type Reporter interface {
	PodFlows(pod v1alpha1.PodRef, alloc string, flows []string, refused string)
}

// Face applies the node's pods' flows annotations.
type Face struct {
	core   Core
	pods   Pods
	report Reporter
	log    *slog.Logger

	mu   sync.Mutex                   // guards said; never held across a call out
	said map[api.AttachmentRef]string // what was last told of each attachment's flows
}

// New returns the face over core, for the pods of pods.
func New(core Core, pods Pods, report Reporter, log *slog.Logger) *Face {
	return &Face{core: core, pods: pods, report: report, log: log, said: map[api.AttachmentRef]string{}}
}

// Run applies the flows annotations of the node's pods whenever a pod
// changes or its allocation is bound to it, until ctx ends.
func (f *Face) Run(ctx context.Context) error {
	for {
		uid, ok := f.pods.Next(ctx)
		if !ok {
			return ctx.Err()
		}
		f.Sync(ctx, uid)
		f.pods.Done(uid)
	}
}

// Sync makes the annotated-flows attachments of the pod's allocations
// what its annotations say now.
func (f *Face) Sync(ctx context.Context, uid string) {
	allocs := f.core.PodAllocations(uid)
	pod, known := f.pods.Cached(uid)
	if !known || len(allocs) == 0 {
		return // a pod gone takes its flows with its allocations
	}
	ref := v1alpha1.PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: uid}
	for _, a := range allocs {
		key := Ref(uid, a.Pool)
		want, refused, wait := Annotated(pod, a, len(allocs))
		if wait {
			continue // the pod has no address yet: its next update
		}
		if refused == "" && (a.Attached && slices.Equal(a.Flows, want) || !a.Attached && len(want) == 0) {
			continue
		}
		if a.Attached {
			if err := f.core.Del(ctx, key); err != nil {
				f.log.Warn("the pod's annotated flows could not be removed", "pod", pod.Namespace+"/"+pod.Name, "allocation", a.ID, "err", err)
				continue
			}
		}
		if refused == "" && len(want) > 0 {
			if err := f.core.Add(ctx, api.CNIAddRequest{ContainerID: key.ContainerID, IfName: key.IfName, Allocation: a.ID,
				PodUID: uid, PodNamespace: pod.Namespace, PodName: pod.Name, Flows: want, Addresses: pod.IPs}); err != nil {
				refused = err.Error()
			}
		}
		if f.told(key, want, refused) {
			continue
		}
		switch {
		case refused != "":
			f.log.Warn("the pod's annotated flows are refused", "pod", pod.Namespace+"/"+pod.Name, "allocation", a.ID, "reason", refused)
		case len(want) == 0:
			f.log.Info("the pod's annotated flows are removed", "pod", pod.Namespace+"/"+pod.Name, "allocation", a.ID)
		default:
			f.log.Info("the pod's annotated flows are steered", "pod", pod.Namespace+"/"+pod.Name, "allocation", a.ID, "flows", len(want))
		}
		if refused != "" || len(want) > 0 {
			flows := make([]string, len(want))
			for i, fl := range want {
				flows[i] = flow.Format(fl)
			}
			f.report.PodFlows(ref, a.ID, flows, refused)
		}
	}
}

// told says whether the outcome for key was already told (logged and an
// Event); else it records it as told.
func (f *Face) told(key api.AttachmentRef, flows []api.CNIFlow, refused string) bool {
	said := fmt.Sprint(flows, refused)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.said[key] == said {
		return true
	}
	f.said[key] = said
	return false
}

// Forget forgets what was told of the annotated flows of the pod's
// allocation of pool, which is gone: the face remembers the pods that
// hold allocations, not every pod the node ever ran.
func (f *Face) Forget(podUID, pool string) {
	f.mu.Lock()
	delete(f.said, Ref(podUID, pool))
	f.mu.Unlock()
}

// Remembered is how many attachments' outcomes the face remembers.
func (f *Face) Remembered() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.said)
}

// Annotated are the flows the pod's annotations give allocation a (of n
// the pod holds), or why they are refused; wait when they name the pod's
// addresses and it has none yet.
func Annotated(pod kubepods.Pod, a Allocation, n int) (flows []api.CNIFlow, refused string, wait bool) {
	name := Annotation + "." + a.Pool
	var val string
	var ok bool
	if a.Claim != "" && a.ClaimFlows != nil {
		// A claim's flows are its configuration's.
		name = fmt.Sprintf("claim %s: flows", a.Claim)
		val, ok = string(a.ClaimFlows), true
	} else if val, ok = pod.Annotations[name]; !ok {
		if val, ok = pod.Annotations[Annotation]; ok && n > 1 {
			return nil, fmt.Sprintf("the pod holds allocations of %d pools: annotate each pool's flows as %s.<pool>", n, Annotation), false
		}
		name = Annotation
	}
	if !ok || strings.TrimSpace(val) == "" {
		return nil, "", false
	}
	if a.Netdev && a.Claim != "" {
		return nil, "", false // its flows come with the move into the pod (the NRI face)
	}
	if a.Netdev {
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
	if err := flow.CheckOwn(flows, pod.IPs, a.Shared); err != nil {
		return nil, fmt.Sprintf("%s: %v", name, err), false
	}
	return flows, "", false
}
