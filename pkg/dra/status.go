package dra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/retry"
)

// ConditionReady is the condition of a claim's device in its status:
// True while its netdev is xdpq's and up, False with the reason (the
// device's taint value) when not.
const ConditionReady = "Ready"

// fieldManager is the driver's name as the writer of a claim's device
// status.
const fieldManager = DriverName

// claimStatus is what was last applied to a claim's status.
type claimStatus struct {
	ready string
	key   string // the whole status, less the time
	since metav1.Time
}

// statusApply is a claim's status to write: its devices' entries.
type statusApply struct {
	claim   PreparedClaim
	st      claimStatus
	devices []resourceapi.AllocatedDeviceStatus
}

// writeStatus replaces the driver's entries in the claim's
// status.devices, leaving the rest of its status as it is (an update
// of the claim read, again on a conflict). Server-side apply would be
// shorter, but the API server then takes the status's other fields as
// changed by the driver (allocation, reservedFor), which it may not.
func (d *Driver) writeStatus(ctx context.Context, t statusApply) error {
	claims := d.opts.Kube.ResourceV1().ResourceClaims(t.claim.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c, err := claims.Get(ctx, t.claim.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if string(c.UID) != t.claim.UID {
			return fmt.Errorf("the claim was replaced (UID %s, prepared %s)", c.UID, t.claim.UID)
		}
		devs := slices.DeleteFunc(slices.Clone(c.Status.Devices), func(s resourceapi.AllocatedDeviceStatus) bool { return s.Driver == DriverName })
		c.Status.Devices = append(devs, t.devices...)
		_, err = claims.UpdateStatus(ctx, c, metav1.UpdateOptions{FieldManager: fieldManager})
		return err
	})
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
		st, devices, err := d.claimStatus(c, devs)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if st != nil {
			todo = append(todo, statusApply{c, *st, devices})
		}
	}
	for _, uid := range slices.Collect(maps.Keys(d.status)) {
		if !seen[uid] {
			delete(d.status, uid)
		}
	}
	d.statusMu.Unlock()
	for _, t := range todo {
		if err := d.writeStatus(ctx, t); err != nil {
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
func (d *Driver) claimStatus(c PreparedClaim, devs map[string][]Device) (*claimStatus, []resourceapi.AllocatedDeviceStatus, error) {
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
	var network *resourceapi.NetworkDeviceData
	netKey := ""
	if n := c.Network; n != nil {
		network = &resourceapi.NetworkDeviceData{InterfaceName: n.InterfaceName, HardwareAddress: n.HardwareAddress, IPs: n.IPs}
		netKey = fmt.Sprintf("%+v", *n)
	}
	st := claimStatus{ready: ready, key: fmt.Sprint(ready, reason, msg, string(data), c.Devices, netKey)}
	last, had := d.status[c.UID]
	if had && last.key == st.key {
		return nil, nil, nil
	}
	st.since = metav1.NewTime(time.Now().Truncate(time.Second))
	if had && last.ready == ready { // the same Ready status: its transition stands
		st.since = last.since
	}
	var devices []resourceapi.AllocatedDeviceStatus
	for _, name := range c.Devices {
		devices = append(devices, resourceapi.AllocatedDeviceStatus{Driver: DriverName, Pool: PoolName(d.opts.NodeName, c.Pool), Device: name,
			Conditions: []metav1.Condition{{Type: ConditionReady, Status: metav1.ConditionStatus(ready), Reason: reason, Message: msg, LastTransitionTime: st.since}},
			Data:       &runtime.RawExtension{Raw: data}, NetworkData: network})
	}
	return &st, devices, nil
}
