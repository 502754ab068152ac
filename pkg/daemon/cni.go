package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/xdp"
	"golang.org/x/sys/unix"
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
	p := d.pools[a.Pool]
	mode := api.ModeQueue
	if p != nil && p.cfg.Mode == api.ModeNetdev {
		mode = api.ModeNetdev
	}
	att := Attachment{CNIAddRequest: req, AllocationID: a.ID, Netdev: a.Netdev, Queues: a.Queues, Mode: mode}
	if old, ok := d.attachments[key(att)]; ok {
		if old.AllocationID == a.ID && slices.Equal(old.Flows, req.Flows) && old.MTU == req.MTU {
			return &old, nil // a repeated ADD
		}
		return nil, fmt.Errorf("cni add: container %s interface %s is attached already (allocation %s, %d flows); DEL it first",
			req.ContainerID, req.IfName, old.AllocationID, len(old.Flows))
	}
	if req.Netns != "" {
		att.NetnsInode = netnsInode(req.Netns)
	}
	if mode == api.ModeQueue && req.MTU != 0 {
		return nil, fmt.Errorf("cni add: mtu %d: pool %s shares queues of %s and gives the pod no interface; mtu applies to netdev-mode pools",
			req.MTU, a.Pool, a.Netdev)
	}
	flows, err := agentFlows(req.Flows, a.Queues)
	if err != nil {
		return nil, fmt.Errorf("cni add: %w", err)
	}
	if mode == api.ModeNetdev {
		err = d.moveInLocked(&att, a, p, flows)
	} else {
		err = d.agent.Steer(a.Netdev, key(att), flows)
	}
	if err != nil {
		return nil, fmt.Errorf("cni add: %w", err)
	}
	if req.PodUID != "" {
		if err := d.broker.SetOwner(a.ID, broker.Owner{PodUID: req.PodUID}); err != nil {
			d.detachLocked(key(att), att)
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
	err := d.detachLocked(key, att)
	d.log.Info("detached", "container", containerID, "ifname", ifName)
	return err
}

// detachLocked ends an attachment: its flows go, a netdev-mode pool's
// netdev comes back to the node.
func (d *Daemon) detachLocked(k string, att Attachment) error {
	var err error
	if m := d.moved[att.Netdev]; m != nil && m.Key == k {
		err = d.moveOutLocked(att.Netdev)
	} else if att.Mode != api.ModeNetdev {
		err = d.agent.Unsteer(att.Netdev, k)
	}
	delete(d.attachments, k)
	d.saveAttachmentsLocked()
	return err
}

// CNICheck reports whether the attachment is there, its flows installed
// (read back from the NIC's rules or the filter's flow map) and its
// netdev's program state sound.
func (d *Daemon) CNICheck(containerID, ifName string) (*Attachment, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	att, ok := d.attachments[containerID+"/"+ifName]
	if !ok {
		return nil, fmt.Errorf("no attachment of container %s interface %s", containerID, ifName)
	}
	verify := d.agent.VerifySteering
	name := att.Netdev
	if att.Mode == api.ModeNetdev {
		m := d.moved[att.Netdev]
		if m == nil || m.Key != key(att) {
			return &att, fmt.Errorf("netdev %s is not in the pod", att.Netdev)
		}
		verify, name = m.agent.VerifySteering, m.IfName
	}
	for _, s := range d.statusLocked() {
		if s.Netdev != att.Netdev {
			continue
		}
		if s.State == agent.StateMissing || s.State == agent.StateOverridden {
			return &att, fmt.Errorf("netdev %s is %s: %s", att.Netdev, s.State, s.Reason)
		}
		if len(att.Flows) > 0 {
			if err := verify(name, key(att)); err != nil {
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
		if a.Mode == api.ModeNetdev {
			// Its flows are its pod agent's; with its netdev gone from the
			// pod (loadMoved), so is the attachment.
			if m := d.moved[a.Netdev]; m == nil || m.Key != k {
				d.log.Info("attachment ended: its netdev is no longer in the pod", "attachment", k, "netdev", a.Netdev)
				delete(d.attachments, k)
			}
			continue
		}
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

// netnsInode is the inode of the namespace at path, 0 when it cannot be
// read (the daemon may not see the path; then it cannot judge).
func netnsInode(path string) uint64 {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0
	}
	return st.Ino
}

// netnsGone reports whether the attachment's pod netns is certainly gone:
// its path is gone or names another namespace than at ADD.
func netnsGone(att Attachment) bool {
	if att.Netns == "" || att.NetnsInode == 0 {
		return false // cannot tell
	}
	var st unix.Stat_t
	err := unix.Stat(att.Netns, &st)
	return (err == nil && st.Ino != att.NetnsInode) || errors.Is(err, unix.ENOENT)
}

// carryLocked gives attachments of a freed allocation to its successor on
// the same devices (kubelet's Allocate for a restarted container): the
// same pod, whose netns still lives. Others end.
func (d *Daemon) carryLocked(kept map[string]Attachment, a *Allocation) {
	for k, att := range kept {
		if att.Netdev != a.Netdev || !slices.Equal(att.Queues, a.Queues) || att.NetnsInode == 0 || netnsGone(att) {
			d.log.Info("attachment ended: its allocation was given to a new container", "attachment", k, "allocation", a.ID)
			d.detachLocked(k, att)
			continue
		}
		att.AllocationID = a.ID
		d.attachments[k] = att
		if att.PodUID != "" {
			d.broker.SetOwner(a.ID, broker.Owner{PodUID: att.PodUID})
		}
		if m := d.moved[att.Netdev]; m != nil && m.Key == k {
			if err := d.retargetMovedLocked(m, a.ID); err != nil {
				d.log.Warn("netdev in the pod, sockets not bound there", "allocation", a.ID, "err", err)
			}
		}
		d.log.Info("attachment kept for the restarted container", "attachment", k, "allocation", a.ID)
	}
	d.saveAttachmentsLocked()
}

// collectAttachments ends the attachments whose pod is gone without a DEL:
// their netns path is gone or names another namespace now. The runtime
// removes a pod's netns after the pod, and containerd never calls CNI GC.
func (d *Daemon) collectAttachments() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var gone []string
	for k, att := range d.attachments {
		if !netnsGone(att) {
			continue
		}
		if err := d.detachLocked(k, att); err != nil {
			d.log.Warn("detach of a gone pod", "attachment", k, "err", err)
		}
		d.log.Info("attachment collected: its pod's netns is gone", "attachment", k, "netns", att.Netns)
		gone = append(gone, k)
	}
	sort.Strings(gone)
	return gone
}
