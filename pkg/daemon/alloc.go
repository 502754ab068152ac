package daemon

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/deviceplugin"
	"github.com/xdpq/xdpq/pkg/ledger"
)

// apiAllocation is how the API shows an allocation.
func (c *core) apiAllocation(a ledger.Allocation) *api.Allocation {
	out := &api.Allocation{ID: a.ID, Pool: a.Pool, Netdev: a.Netdev, Queues: a.Queues, Socket: c.brokerSocket(a.ID),
		UID: a.Owner.UID, Created: a.Created, Devices: a.Devices}
	if a.Claim != nil {
		out.Claim = a.Claim.Namespace + "/" + a.Claim.Name
	}
	return out
}

func (c *core) brokerSocket(id string) string {
	return c.allocDir(id) + "/" + broker.SocketName
}

// Alloc hands count devices of a pool to a local user (standalone mode).
func (l *localAPI) Alloc(ctx context.Context, req api.AllocRequest) (*api.Allocation, error) {
	if l.core.isUninstalling() {
		return nil, errUninstalling
	}
	if !l.core.opts.Standalone {
		return nil, api.Errorf(api.ErrNotSupported, "allocations come from kubelet on this node; xdpqctl alloc is for a standalone daemon")
	}
	if req.Count < 1 {
		return nil, api.Errorf(api.ErrInvalid, "pool %s: %d queues asked; at least 1", req.Pool, req.Count)
	}
	uid := req.UID
	owner := ledger.Owner{UID: &uid}
	// Another allocation may take a device between the choice and the
	// reservation; choose again then.
	for try := 0; ; try++ {
		free, err := l.core.ledger.FreeDevices(req.Pool)
		if err != nil {
			return nil, err
		}
		ids := deviceplugin.Prefer(l.core.toPluginDevices(free), nil, req.Count)
		if len(ids) < req.Count {
			return nil, api.Errorf(api.ErrConflict, "pool %s: %d queues asked, %d free", req.Pool, req.Count, len(ids))
		}
		a, err := l.core.ledger.Reserve(ledger.Reservation{Pool: req.Pool, Devices: ids, Owner: owner})
		if errors.Is(err, ledger.ErrConflict) && try < 3 {
			continue
		}
		if err != nil {
			return nil, err
		}
		if err := l.core.serveNew(a); err != nil {
			return nil, err
		}
		if err := l.core.ledger.Commit(a.ID, nil); err != nil {
			l.core.unserve(a) // the ledger dropped it: its devices are free
			return nil, fmt.Errorf("pool %s: the allocation could not be recorded, and was not made: %w", req.Pool, err)
		}
		l.core.log.Info("allocated", "allocation", a.ID, "pool", a.Pool, "netdev", a.Netdev, "queues", a.Queues, "uid", uid)
		return l.core.apiAllocation(a), nil
	}
}

// serveNew has the broker serve a reserved allocation; on failure the
// reservation is dropped.
func (c *core) serveNew(a ledger.Allocation) error {
	p, _ := c.ledger.Meta(a.Pool)
	if err := c.broker.Add(c.brokerAllocation(a, p.Config)); err != nil {
		c.ledger.Abort(a.ID)
		if rerr := os.RemoveAll(c.allocDir(a.ID)); rerr != nil {
			c.log.Warn("directory of an allocation not served left; removed at the next start", "allocation", a.ID, "err", rerr)
		}
		return err
	}
	return nil
}

// Free ends an allocation: its attachments end, its lease (if any) ends,
// its devices are free.
func (l *localAPI) Free(ctx context.Context, id string) error {
	return l.core.free(ctx, id, "asked")
}

// free ends allocation id for the reason why (logged). An allocation the daemon is already freeing (or whose attachment it is
// making or ending) is waited for; one that is gone once the wait is over
// was freed as asked.
func (c *core) free(ctx context.Context, id, why string) error {
	var a ledger.Allocation
	waited := false
	err := c.whenIdle(ctx, func() (err error) {
		a, err = c.ledger.BeginFree(id)
		waited = waited || errors.Is(err, ledger.ErrBusy)
		return err
	})
	if waited && errors.Is(err, ledger.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return c.finishFree(ctx, a, why)
}

// finishFree undoes what an ending allocation has in the kernel and
// removes it from the ledger.
func (c *core) finishFree(ctx context.Context, a ledger.Allocation, why string) error {
	var errs []error
	for _, att := range a.Attachments {
		if err := c.undoAttachment(ctx, att); err != nil {
			errs = append(errs, fmt.Errorf("attachment %s: %w", att.Key(), err))
			continue
		}
		c.log.Info("detached with its allocation", "attachment", att.Key(), "allocation", a.ID)
	}
	if len(errs) > 0 {
		// The record stays (ending): dropping it would leave its flows
		// steering to queues the next allocation gets, or a netdev
		// stranded. The collector tries again.
		err := fmt.Errorf("allocation %s not freed yet (tried again every collection): %w", a.ID, errors.Join(errs...))
		c.retryLater(a.ID, err)
		c.log.Error("free", "err", err)
		return err
	}
	c.unserve(a)
	if err := c.ledger.EndFree(a.ID); err != nil {
		errs = append(errs, err)
	}
	c.publish(change{kind: allocationFreed, alloc: a})
	// A pool removed from the config may go with its last allocation, a
	// netdev back from a pod is managed on the node again.
	if err := c.syncNetdevs(ctx); err != nil {
		errs = append(errs, err)
	}
	c.log.Info("freed", "allocation", a.ID, "why", why)
	return errors.Join(errs...)
}

// retryLater has the collector finish something a failed undo left (err
// says what): an ending allocation's free, or a pending or ending
// attachment's undo. Status reports it until it is done.
func (c *core) retryLater(key string, err error) {
	c.mu.Lock()
	c.retry[key] = err
	c.mu.Unlock()
}

// retryUndone finishes what failed undos left (see retryLater); each try
// that fails again says so again.
func (c *core) retryUndone(ctx context.Context) {
	c.mu.Lock()
	keys := slices.Sorted(maps.Keys(c.retry))
	c.mu.Unlock()
	for _, key := range keys {
		c.mu.Lock()
		delete(c.retry, key)
		c.mu.Unlock()
		if a, ok := c.ledger.Get(key); ok && a.State == ledger.Ending {
			_ = c.finishFree(ctx, a, "retried after a failed undo") // logged, and retried again, by finishFree
			continue
		}
		att, ok := c.ledger.Attachment(key)
		switch {
		case !ok:
		case att.State != ledger.Active:
			c.finishUndo(ctx, att)
			if _, left := c.ledger.Attachment(key); !left && att.Mode == api.ModeNetdev {
				// Back from the pod: the node agent manages it again.
				if err := c.syncNetdevs(ctx); err != nil {
					c.log.Warn("netdevs", "err", err)
				}
			}
		case att.Mode == api.ModeNetdev && c.pods.get(att.Netdev) == nil:
			c.adoptOrReturn(ctx, att)
		}
	}
}

// unserve stops serving an allocation: its lease ends, its directory
// goes, and the subscribers are told (the device plugins remove its
// device-info files).
func (c *core) unserve(a ledger.Allocation) {
	_ = c.broker.Remove(a.ID) // its only error: an allocation not served, which is what is wanted
	if err := os.RemoveAll(c.allocDir(a.ID)); err != nil {
		c.log.Warn("directory of a freed allocation left; removed at the next start", "allocation", a.ID, "err", err)
	}
	c.publish(change{kind: allocationUnserved, alloc: a})
}

// removeDeviceInfo removes the device-info files of an allocation no
// longer served (Kubernetes mode).
func (ps *devicePlugins) removeDeviceInfo(a ledger.Allocation) {
	if ps.core.opts.Standalone {
		return
	}
	if p, ok := ps.core.ledger.Meta(a.Pool); ok {
		for _, dev := range a.Devices {
			if err := deviceplugin.RemoveDeviceInfo(ps.devInfoDir(), p.Resource, dev); err != nil {
				ps.log.Warn("device-info file of a freed device left", "device", dev, "err", err)
			}
		}
	}
}

func (ps *devicePlugins) devInfoDir() string {
	if ps.core.opts.DeviceInfoDir != "" {
		return ps.core.opts.DeviceInfoDir
	}
	return deviceplugin.DeviceInfoDir
}

// allocate answers kubelet's Allocate: a broker allocation for the
// devices, its directory mounted at /run/xdpq, and the environment.
// kubelet calls it again with the same devices when it restarts a
// container: the allocation that held them is succeeded by the new one,
// which takes over its attachments (CNI does not run again for a
// container restart) where the pod is still there.
func (ps *devicePlugins) allocate(ctx context.Context, pool string, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	if ps.core.isUninstalling() {
		return nil, errUninstalling
	}
	a, err := ps.core.ledger.Reserve(ledger.Reservation{Pool: pool, Devices: ids, Owner: ledger.Owner{AnyPod: true}, Replace: true})
	if err != nil {
		return nil, err
	}
	if err := ps.core.serveNew(a); err != nil {
		return nil, err
	}
	var carried []ledger.Attachment
	var podUID string
	netdevs := false
	for _, oldID := range a.Replaces {
		old, ok := ps.core.ledger.Get(oldID)
		if !ok {
			continue
		}
		ps.core.unserve(old)
		for _, att := range old.Attachments {
			if carry(att, a) {
				carried = append(carried, att)
				if att.PodUID != "" {
					podUID = att.PodUID
				}
				ps.core.log.Info("attachment kept for the restarted container", "attachment", att.Key(), "allocation", a.ID, "was", oldID)
				continue
			}
			ps.core.log.Info("attachment ended: its allocation was given to a new container", "attachment", att.Key(), "allocation", a.ID)
			if err := ps.core.undoAttachment(ctx, att); err != nil {
				ps.core.log.Warn("detach", "attachment", att.Key(), "err", err)
			}
			netdevs = netdevs || att.Mode == api.ModeNetdev
		}
	}
	if err := ps.core.ledger.Commit(a.ID, carried); err != nil {
		// The ledger dropped it; the allocations it was to replace are
		// as their records say, and kubelet's next Allocate replaces
		// them again.
		ps.core.unserve(a)
		return nil, fmt.Errorf("pool %s: the allocation could not be recorded, and was not made: %w", pool, err)
	}
	// The restarted container's pod keeps its netdev and its lease's
	// owner; a failure leaves the allocation unusable to it, so the
	// Allocate fails and kubelet's next one replaces it again.
	for _, att := range carried {
		if att.Mode != api.ModeNetdev {
			continue
		}
		if err := ps.core.retargetToPod(a.ID, att.Netdev); err != nil {
			return nil, fmt.Errorf("allocation %s: its netdev %s in the pod: %w", a.ID, att.Netdev, err)
		}
	}
	if podUID != "" {
		if err := ps.core.setOwner(a.ID, ledger.Owner{PodUID: podUID}); err != nil {
			return nil, fmt.Errorf("allocation %s: its pod %s as owner: %w", a.ID, podUID, err)
		}
	}
	if netdevs {
		if err := ps.core.syncNetdevs(ctx); err != nil {
			ps.core.log.Warn("netdevs", "err", err)
		}
	}
	// Device-info files for CNI plugins, where the NIC is a PCI device.
	dev, _ := ps.core.rec.netdev(a.Netdev)
	pci := dev.PCI
	if p, ok := ps.core.ledger.Meta(pool); ok && pci != "" {
		for _, id := range ids {
			if err := deviceplugin.WriteDeviceInfo(ps.devInfoDir(), p.Resource, id, pci); err != nil {
				ps.core.log.Warn("device info", "device", id, "err", err)
			}
		}
	}
	ps.core.log.Info("allocated", "allocation", a.ID, "pool", pool, "netdev", a.Netdev, "queues", a.Queues, "replaces", a.Replaces)
	env, mounts := ps.core.containerEdits(a)
	return &pluginapi.ContainerAllocateResponse{Envs: env, Mounts: mounts}, nil
}

// containerEdits are what a container holding allocation a gets, from
// the device plugin's Allocate or in a DRA claim's CDI spec: the
// allocation's directory at /run/xdpq (its broker socket), the
// environment that names it, and a DPDK pool's mounts.
func (c *core) containerEdits(a ledger.Allocation) (map[string]string, []*pluginapi.Mount) {
	env := strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(a.Pool))
	var qs []string
	for _, q := range a.Queues {
		qs = append(qs, fmt.Sprintf("%s:%d", a.Netdev, q))
	}
	meta, _ := c.ledger.Meta(a.Pool)
	return map[string]string{
			"XDPQ_SOCKET":        "/run/xdpq/" + broker.SocketName,
			"XDPQ_QUEUES_" + env: strings.Join(qs, ","),
			"XDPQ_NETDEV_" + env: a.Netdev,
			"XDPQ_ALLOCATION":    a.ID,
		},
		append([]*pluginapi.Mount{{ContainerPath: "/run/xdpq", HostPath: c.allocDir(a.ID)}}, c.dpdkMounts(a, meta.Config)...)
}

// carry says whether a restarted container's new allocation a keeps an
// attachment of the old one: the same netdev and queues, and the pod's
// netns still the one ADD saw.
func carry(att ledger.Attachment, a ledger.Allocation) bool {
	return att.Netdev == a.Netdev && slices.Equal(att.Queues, a.Queues) && att.NetnsInode != 0 && !netnsGone(att.Attachment)
}

// setOwner records who may use an allocation, in the ledger and the
// broker.
func (c *core) setOwner(id string, o ledger.Owner) error {
	if err := c.broker.SetOwner(id, brokerOwner(o)); err != nil {
		return err
	}
	return c.ledger.SetOwner(id, o)
}
