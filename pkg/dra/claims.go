package dra

import (
	"context"
	"fmt"
	"slices"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/ledger"
)

// The claims as the API server has them: a claim gone or deallocated
// frees its allocation (Collect, and Prepare's releaseStale), and a pod
// may use a claim's queues only when the claim is reserved for it
// (ReservedFor).

// releaseStale frees the allocations of other claims that hold any of
// the devices ids claim c was given, if the API server no longer gives
// those claims the devices: a pod deleted at once (grace period 0) goes
// from the API server before kubelet has stopped it and unprepared its
// claim, and the scheduler gives its devices to the next claim, whose
// Prepare comes first. The API server's allocation is the truth: the
// old allocation goes now (its pod, if still running, loses the queues
// the cluster gave another), instead of kubelet retrying the new
// claim's Prepare for seconds. It says whether it freed any.
func (f *Face) releaseStale(ctx context.Context, c Claim, ids []string) bool {
	freed := false
	for _, a := range f.core.Allocations() {
		if a.Claim == nil || a.Claim.UID == c.UID || a.Pool != c.Pool || a.State != ledger.Active ||
			!slices.ContainsFunc(a.Devices, func(id string) bool { return slices.Contains(ids, id) }) {
			continue
		}
		why, err := f.claimReleased(ctx, a)
		if err != nil || why == "" {
			continue // still the other claim's: the conflict stands
		}
		if err := f.core.Free(ctx, a.ID, fmt.Sprintf("claim %s/%s was given its devices, and its claim %s/%s %s",
			c.Namespace, c.Name, a.Claim.Namespace, a.Claim.Name, why)); err != nil {
			f.log.Warn("free", "allocation", a.ID, "err", err)
			continue
		}
		freed = true
	}
	return freed
}

// claimReleased says how the API server no longer gives allocation a's
// claim its devices ("" if it does).
func (f *Face) claimReleased(ctx context.Context, a ledger.Allocation) (string, error) {
	c, gone, err := f.claimOf(ctx, a)
	switch {
	case err != nil:
		return "", err
	case gone != "":
		return "was " + gone, nil
	case c.Status.Allocation == nil:
		return "was deallocated", nil
	}
	held := map[string]bool{}
	p, _ := f.core.Pool(a.Pool)
	for _, dv := range p.Devices {
		if slices.Contains(a.Devices, dv.ID) {
			held[DeviceName(dv.Netdev, deviceQueue(dv))] = true
		}
	}
	pool := PoolName(f.cfg.NodeName, a.Pool)
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == DriverName && r.Pool == pool && held[r.Device] {
			return "", nil
		}
	}
	return "was given other devices", nil
}

// goneClaims are the claims whose allocations the collector found
// without a claim to serve, by claim UID: freed when found so again at
// the next collection.
type goneClaims struct {
	mu   sync.Mutex
	seen map[string]bool
}

// mark records what this collection found gone and says which of it
// the last one found gone too.
func (g *goneClaims) mark(gone []string) (twice []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	next := make(map[string]bool, len(gone))
	for _, uid := range gone {
		if g.seen[uid] {
			twice = append(twice, uid)
		}
		next[uid] = true
	}
	g.seen = next
	return twice
}

// Collect frees the allocations of claims kubelet will never
// unprepare: the claim was deleted (or replaced under its name) or is
// no longer reserved for the allocation's pod, and that pod is gone
// from this node; kubelet lost its checkpoint, or the claim went while
// kubelet was down. Found so at two collections in a row, so that a
// claim kubelet is unpreparing now is not freed under it. A claim whose
// pod is still on the node is kubelet's to unprepare.
func (f *Face) Collect(ctx context.Context) (freed []string) {
	if f.cfg.Kube == nil {
		return nil
	}
	byUID := map[string]ledger.Allocation{}
	var gone []string
	for _, a := range f.core.Allocations() {
		if a.Claim == nil || a.State != ledger.Active {
			continue
		}
		if a.Owner.PodUID != "" && f.cfg.Pods != nil {
			if _, ok := f.cfg.Pods.Cached(a.Owner.PodUID); ok {
				continue
			}
		}
		why, others, err := f.claimGone(ctx, a)
		if err != nil {
			f.log.Warn("cannot read the claim of an allocation whose pod is gone; kept", "allocation", a.ID,
				"claim", a.Claim.Namespace+"/"+a.Claim.Name, "err", err)
			continue
		}
		if others {
			// kubelet keeps the claim prepared for its other pods: the
			// queues wait for the first of them to connect.
			if err := f.core.SetOwner(a.ID, ledger.Owner{AnyPod: true}); err != nil {
				f.log.Warn("set owner", "allocation", a.ID, "err", err)
				continue
			}
			f.log.Info("the pod that held a shared claim's queues is gone; the next of the claim's pods to connect takes them",
				"allocation", a.ID, "claim", a.Claim.Namespace+"/"+a.Claim.Name, "pod_uid", a.Owner.PodUID)
			continue
		}
		if why != "" {
			byUID[a.Claim.UID] = a
			gone = append(gone, a.Claim.UID)
			f.log.Info("the claim of an allocation is gone; freed at the next collection unless kubelet unprepares it first",
				"allocation", a.ID, "claim", a.Claim.Namespace+"/"+a.Claim.Name, "why", why)
		}
	}
	for _, uid := range f.goneClaims.mark(gone) {
		a := byUID[uid]
		if err := f.core.Free(ctx, a.ID, "its claim is gone and kubelet did not unprepare it"); err != nil {
			f.log.Warn("free", "allocation", a.ID, "err", err)
			continue
		}
		freed = append(freed, a.ID)
	}
	return freed
}

// claimOf is allocation a's claim as the API server has it now, or
// why there is none: "deleted", or "deleted and made again" under its
// name with another UID.
func (f *Face) claimOf(ctx context.Context, a ledger.Allocation) (*resourceapi.ResourceClaim, string, error) {
	if f.cfg.Kube == nil {
		return nil, "", fmt.Errorf("claim %s/%s: no API server to read it from", a.Claim.Namespace, a.Claim.Name)
	}
	ctx, cancel := context.WithTimeout(ctx, api.RequestTimeout)
	defer cancel()
	c, err := f.cfg.Kube.ResourceV1().ResourceClaims(a.Claim.Namespace).Get(ctx, a.Claim.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, "deleted", nil
	case err != nil:
		return nil, "", err
	case string(c.UID) != a.Claim.UID:
		return nil, "deleted and made again (UID " + string(c.UID) + ")", nil
	}
	return c, "", nil
}

// claimGone says why allocation a's claim no longer needs it ("" if it
// does): the claim is not in the API server under its UID, or is
// reserved for none of the allocation's pods. others says the claim is
// still reserved for pods, none of them the allocation's owner: a
// claim several pods share outlived the one that held its queues.
func (f *Face) claimGone(ctx context.Context, a ledger.Allocation) (why string, others bool, err error) {
	c, gone, err := f.claimOf(ctx, a)
	if err != nil || gone != "" {
		return gone, false, err
	}
	for _, r := range c.Status.ReservedFor {
		if a.Owner.AnyPod || string(r.UID) == a.Owner.PodUID {
			return "", false, nil
		}
	}
	if a.Owner.AnyPod {
		return "reserved for no pod", false, nil
	}
	if len(c.Status.ReservedFor) > 0 {
		return "", true, nil
	}
	return "no longer reserved for pod " + a.Owner.PodUID, false, nil
}

// ReservedFor refuses pod uid the queues of claim allocation a
// unless the API server's claim is reserved for it. kubelet's
// PodResources does not list DRA devices: the claim's status is what
// says which pods may use them.
func (f *Face) ReservedFor(ctx context.Context, a ledger.Allocation, uid string) error {
	if f.cfg.Kube == nil {
		return fmt.Errorf("claim %s/%s: no API server to read it from", a.Claim.Namespace, a.Claim.Name)
	}
	c, gone, err := f.claimOf(ctx, a)
	if err != nil {
		return fmt.Errorf("claim %s/%s: %w", a.Claim.Namespace, a.Claim.Name, err)
	}
	if gone != "" {
		return fmt.Errorf("claim %s/%s was %s", a.Claim.Namespace, a.Claim.Name, gone)
	}
	for _, r := range c.Status.ReservedFor {
		if string(r.UID) == uid {
			return nil
		}
	}
	return fmt.Errorf("claim %s/%s is not reserved for this pod (its status.reservedFor): only the pods that name the claim in spec.resourceClaims may use its queues",
		a.Claim.Namespace, a.Claim.Name)
}
