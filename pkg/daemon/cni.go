package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/xdp"
)

// Attachment, CNIAddRequest and CNIFlow are the API's.
type (
	Attachment    = api.Attachment
	CNIAddRequest = api.CNIAddRequest
	CNIFlow       = api.CNIFlow
)

func key(a Attachment) string { return a.ContainerID + "/" + a.IfName }

// CNIAdd steers the attachment's flows to its allocation's queues and,
// given the pod UID, binds the allocation's socket to that pod.
func (d *Daemon) CNIAdd(req CNIAddRequest) (*Attachment, error) {
	if req.ContainerID == "" || req.IfName == "" {
		return nil, fmt.Errorf("cni add: container id and interface name are required")
	}
	// Without an allocation id or a device id (Multus's), kubelet says
	// which devices the pod holds.
	var podDevs map[string][]string
	if req.Allocation == "" && req.DeviceID == "" && req.PodName != "" && !d.opts.Standalone {
		var err error
		if podDevs, err = d.podDevices(context.Background(), req.PodNamespace, req.PodName); err != nil {
			return nil, fmt.Errorf("cni add: %w", err)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	a, err := d.findAllocLocked(req, podDevs)
	if err != nil {
		return nil, fmt.Errorf("cni add: %w", err)
	}
	att := Attachment{CNIAddRequest: req, AllocationID: a.ID, Netdev: a.Netdev, Queues: a.Queues}
	if old, ok := d.attachments[key(att)]; ok {
		if old.AllocationID == a.ID && slices.Equal(old.Flows, req.Flows) {
			return &old, nil // a repeated ADD
		}
		return nil, fmt.Errorf("cni add: container %s interface %s is attached already (allocation %s, %d flows); DEL it first",
			req.ContainerID, req.IfName, old.AllocationID, len(old.Flows))
	}
	flows, err := agentFlows(req.Flows, a.Queues)
	if err != nil {
		return nil, fmt.Errorf("cni add: %w", err)
	}
	if err := d.agent.Steer(a.Netdev, key(att), flows); err != nil {
		return nil, fmt.Errorf("cni add: %w", err)
	}
	if req.PodUID != "" {
		if err := d.broker.SetOwner(a.ID, broker.Owner{PodUID: req.PodUID}); err != nil {
			d.agent.Unsteer(a.Netdev, key(att))
			return nil, fmt.Errorf("cni add: %w", err)
		}
	}
	d.attachments[key(att)] = att
	d.saveAttachmentsLocked()
	d.log.Info("attached", "container", req.ContainerID, "ifname", req.IfName, "allocation", a.ID, "flows", len(flows))
	return &att, nil
}

func (d *Daemon) findAllocLocked(req CNIAddRequest, podDevs map[string][]string) (*Allocation, error) {
	if req.Allocation != "" {
		if a := d.allocs[req.Allocation]; a != nil {
			return a, nil
		}
		return nil, fmt.Errorf("no allocation %q", req.Allocation)
	}
	if req.DeviceID != "" {
		for _, p := range d.pools {
			if req.Resource != "" && p.resource != req.Resource {
				continue
			}
			if id := p.used[req.DeviceID]; id != "" {
				return d.allocs[id], nil
			}
		}
		return nil, fmt.Errorf("no allocation holds device %q of %s; the pod must request the pool's resource", req.DeviceID, req.Resource)
	}
	if req.PodName == "" {
		return nil, fmt.Errorf("no allocation id, device id or pod name to find the pod's queues by")
	}
	var found []*Allocation
	for _, name := range d.poolNames() {
		p := d.pools[name]
		if req.Resource != "" && p.resource != req.Resource {
			continue
		}
		for _, dev := range podDevs[p.resource] {
			if a := d.allocs[p.used[dev]]; a != nil && !slices.Contains(found, a) {
				found = append(found, a)
			}
		}
	}
	switch {
	case len(found) == 0:
		return nil, fmt.Errorf("kubelet assigns pod %s/%s no xdpq device%s; the pod must request the pool's resource",
			req.PodNamespace, req.PodName, map[bool]string{true: " of " + req.Resource}[req.Resource != ""])
	case len(found) > 1:
		var ids []string
		for _, a := range found {
			ids = append(ids, a.ID)
		}
		return nil, fmt.Errorf("pod %s/%s holds allocations %v; set resourceName (or deviceID) to choose one", req.PodNamespace, req.PodName, ids)
	}
	return found[0], nil
}

func agentFlows(fs []CNIFlow, queues []uint32) ([]agent.Flow, error) {
	var out []agent.Flow
	for _, f := range fs {
		var proto xdp.Protocol
		switch f.Protocol {
		case "udp":
			proto = xdp.UDP
		case "tcp":
			proto = xdp.TCP
		default:
			return nil, fmt.Errorf("flow protocol %q: udp or tcp", f.Protocol)
		}
		out = append(out, agent.Flow{Protocol: proto, Dst: f.Dst, DstPort: f.DstPort, Src: f.Src, SrcPort: f.SrcPort,
			VLAN: f.VLAN, Queues: slices.Clone(queues)})
	}
	return out, nil
}

// CNIDel removes an attachment's flows. An attachment the daemon does not
// know is no error: DEL is idempotent.
func (d *Daemon) CNIDel(containerID, ifName string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	key := containerID + "/" + ifName
	att, ok := d.attachments[key]
	if !ok {
		return nil
	}
	err := d.agent.Unsteer(att.Netdev, key)
	delete(d.attachments, key)
	d.saveAttachmentsLocked()
	d.log.Info("detached", "container", containerID, "ifname", ifName)
	return err
}

// CNICheck reports whether the attachment is there, its flows installed
// (read back from the NIC's rules or the filter's flow map) and its
// netdev's program state sound.
func (d *Daemon) CNICheck(containerID, ifName string) (*Attachment, error) {
	d.mu.Lock()
	att, ok := d.attachments[containerID+"/"+ifName]
	d.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("no attachment of container %s interface %s", containerID, ifName)
	}
	for _, s := range d.agent.Status() {
		if s.Netdev != att.Netdev {
			continue
		}
		if s.State == agent.StateMissing || s.State == agent.StateOverridden {
			return &att, fmt.Errorf("netdev %s is %s: %s", att.Netdev, s.State, s.Reason)
		}
		if len(att.Flows) > 0 {
			if err := d.agent.VerifySteering(att.Netdev, key(att)); err != nil {
				return &att, err
			}
		}
		return &att, nil
	}
	return &att, fmt.Errorf("netdev %s is not managed", att.Netdev)
}

// CNIGC removes every attachment not in valid ("containerID/ifName").
func (d *Daemon) CNIGC(valid []string) (removed []string) {
	d.mu.Lock()
	var gone []Attachment
	for k, a := range d.attachments {
		if !slices.Contains(valid, k) {
			gone = append(gone, a)
		}
	}
	d.mu.Unlock()
	for _, a := range gone {
		d.CNIDel(a.ContainerID, a.IfName)
		removed = append(removed, key(a))
	}
	sort.Strings(removed)
	return removed
}

func (d *Daemon) attachmentsPath() string {
	dir := d.opts.StateDir
	if dir == "" {
		dir = agent.DefaultStateDir
	}
	return filepath.Join(dir, "cni-attachments.json")
}

func (d *Daemon) saveAttachmentsLocked() {
	b, _ := json.Marshal(d.attachments)
	os.MkdirAll(filepath.Dir(d.attachmentsPath()), 0o700)
	if err := os.WriteFile(d.attachmentsPath(), b, 0o600); err != nil {
		d.log.Error("save cni attachments", "err", err)
	}
}

// loadAttachments takes back the attachments of a previous daemon: their
// flows stay, everything else xdpq installed on the netdevs goes.
func (d *Daemon) loadAttachments() {
	b, err := os.ReadFile(d.attachmentsPath())
	if err == nil {
		err = json.Unmarshal(b, &d.attachments)
	}
	if err != nil && !os.IsNotExist(err) {
		d.log.Warn("cni attachments not restored", "err", err)
	}
	keep := map[string]map[string][]agent.Flow{}
	for k, a := range d.attachments {
		flows, err := agentFlows(a.Flows, a.Queues)
		if err != nil {
			continue
		}
		if keep[a.Netdev] == nil {
			keep[a.Netdev] = map[string][]agent.Flow{}
		}
		keep[a.Netdev][k] = flows
	}
	for netdev := range d.managed {
		if n, err := d.agent.SyncSteering(netdev, keep[netdev]); err != nil || n > 0 {
			d.log.Info("steering synced with the attachments", "netdev", netdev, "removed", n, "err", err)
		}
	}
}
