package dra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	resourceac "k8s.io/client-go/applyconfigurations/resource/v1"
)

// ConditionReady is the condition of a claim's device in its status:
// True while its netdev is xdpq's and up, False with the reason (the
// device's taint value) when not.
const ConditionReady = "Ready"

// fieldManager is the driver's name as the owner of a claim's device
// status (server-side apply).
const fieldManager = DriverName

// claimStatus is what was last applied to a claim's status.
type claimStatus struct {
	ready string
	key   string // the whole status, less the time
	since metav1.Time
}

// statusApply is a claim's status to apply.
type statusApply struct {
	claim PreparedClaim
	st    claimStatus
	ac    *resourceac.ResourceClaimStatusApplyConfiguration
}

// syncStatus applies the status of every prepared claim whose devices'
// state changed since it was last applied (each once after a start): a
// Ready condition and the data, per device. A claim whose apply fails
// is tried again at the next sync. The lock is not held across the API
// calls: two syncs at once may apply the same status twice, which
// changes nothing.
func (d *Driver) syncStatus(ctx context.Context, devs map[string][]Device) error {
	src, ok := d.opts.Node.(PreparedClaims)
	if !ok {
		return nil
	}
	claims := src.Prepared()
	var todo []statusApply
	var errs []error
	d.statusMu.Lock()
	seen := map[string]bool{}
	for _, c := range claims {
		seen[c.UID] = true
		st, ac, err := d.claimStatus(c, devs)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if st != nil {
			todo = append(todo, statusApply{c, *st, ac})
		}
	}
	for _, uid := range slices.Collect(maps.Keys(d.status)) {
		if !seen[uid] {
			delete(d.status, uid)
		}
	}
	d.statusMu.Unlock()
	for _, t := range todo {
		_, err := d.opts.Kube.ResourceV1().ResourceClaims(t.claim.Namespace).ApplyStatus(ctx,
			resourceac.ResourceClaim(t.claim.Name, t.claim.Namespace).WithStatus(t.ac), metav1.ApplyOptions{FieldManager: fieldManager, Force: true})
		if err != nil {
			errs = append(errs, fmt.Errorf("claim %s/%s: status: %w", t.claim.Namespace, t.claim.Name, err))
			continue
		}
		d.statusMu.Lock()
		d.status[t.claim.UID] = t.st
		d.statusMu.Unlock()
	}
	return errors.Join(errs...)
}

// claimStatus is the status claim c should have with the devices devs,
// or nil when it was applied already. Called with statusMu held.
func (d *Driver) claimStatus(c PreparedClaim, devs map[string][]Device) (*claimStatus, *resourceac.ResourceClaimStatusApplyConfiguration, error) {
	ready, reason, msg := "True", "Prepared", "its queues are xdpq's"
	byName := map[string]Device{}
	for _, dv := range devs[c.Pool] {
		byName[DeviceName(dv.Netdev, dv.Queue)] = dv
	}
	for _, name := range c.Devices {
		dv, ok := byName[name]
		if !ok {
			ready, reason, msg = "False", "Gone", "device "+name+" is no longer in pool "+c.Pool
			break
		}
		if dv.Unavailable != "" {
			ready, reason, msg = "False", dv.Reason, dv.Unavailable
			break
		}
	}
	data, err := json.Marshal(c.Data)
	if err != nil {
		return nil, nil, err
	}
	st := claimStatus{ready: ready, key: fmt.Sprint(ready, reason, msg, string(data), c.Devices)}
	last, had := d.status[c.UID]
	if had && last.key == st.key {
		return nil, nil, nil
	}
	st.since = metav1.NewTime(time.Now().Truncate(time.Second))
	if had && last.ready == ready { // the same Ready status: its transition stands
		st.since = last.since
	}
	ac := resourceac.ResourceClaimStatus()
	for _, name := range c.Devices {
		ac.WithDevices(resourceac.AllocatedDeviceStatus().WithDriver(DriverName).WithPool(PoolName(d.opts.NodeName, c.Pool)).WithDevice(name).
			WithConditions(metav1ac.Condition().WithType(ConditionReady).WithStatus(metav1.ConditionStatus(ready)).
				WithReason(reason).WithMessage(msg).WithLastTransitionTime(st.since)).
			WithData(runtime.RawExtension{Raw: data}))
	}
	return &st, ac, nil
}
