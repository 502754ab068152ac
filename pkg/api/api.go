// Package api is the xdpq daemon's local API on a Unix socket: the types
// its requests and answers carry, and a client. xdpqctl and the CNI plugin
// use it; they need nothing else of the daemon.
package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"time"
)

// DefaultSocket is where the daemon serves its local API.
const DefaultSocket = "/run/xdpq/xdpq-api.sock"

// Allocation is a set of queues handed out, as the API reports it.
type Allocation struct {
	ID     string   `json:"id"`
	Pool   string   `json:"pool"`
	Netdev string   `json:"netdev"`
	Queues []uint32 `json:"queues"`
	Socket string   `json:"socket"` // the broker socket the holder connects to
	UID    *uint32  `json:"uid,omitempty"`
	// Created is when the allocation was made.
	Created time.Time `json:"created"`
	// Devices are the device ids of the queues.
	Devices []string `json:"devices"`
}

// Status reports pools, allocations and netdevs.
type Status struct {
	Pools       []PoolStatus   `json:"pools"`
	Allocations []Allocation   `json:"allocations"`
	Netdevs     []NetdevStatus `json:"netdevs"`
	// ConfigError says why the config in force is not the file on disk,
	// or what of it could not be put in force on this node.
	ConfigError string `json:"configError,omitempty"`
	// StateErrors are the daemon's records it cannot read: each keeps its
	// pool from new allocations until it is repaired or removed.
	StateErrors []string `json:"stateErrors,omitempty"`
	// Collected is when the daemon last finished looking for attachments
	// of gone pods (and, with kubelet, allocations no container holds).
	Collected time.Time `json:"collected,omitzero"`
}

// PoolStatus is one pool's capacity.
type PoolStatus struct {
	Name     string `json:"name"`
	Resource string `json:"resource"`
	Queues   int    `json:"queues"`
	Free     int    `json:"free"`
	// Reason says why the pool has fewer queues than its config names, or
	// takes no allocation now.
	Reason string `json:"reason,omitempty"`
}

// NetdevStatus is what the agent reports of a netdev.
type NetdevStatus struct {
	Netdev   string   `json:"netdev"`
	State    string   `json:"state"`
	Mode     string   `json:"mode"`
	Steering string   `json:"steering"`
	Flows    int      `json:"flows"`
	Sockets  []uint32 `json:"sockets"`
	LinkUp   bool     `json:"linkUp"`
	Reason   string   `json:"reason,omitempty"`
}

// CNIFlow is a flow the CNI plugin asks for, its destination resolved
// (the IPAM address filled in) and its port ranges expanded.
type CNIFlow struct {
	Protocol string       `json:"protocol"`
	Dst      netip.Prefix `json:"dst"`
	DstPort  uint16       `json:"dstPort,omitempty"`
	Src      netip.Prefix `json:"src,omitzero"`
	SrcPort  uint16       `json:"srcPort,omitempty"`
	VLAN     uint16       `json:"vlan,omitempty"`
}

// CNIAddRequest is an attachment the CNI plugin makes.
type CNIAddRequest struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	// The allocation: by its id (standalone, CNI_ARGS XDPQ_ALLOCATION), by
	// a device it holds (Kubernetes, Multus's deviceID), or else the one
	// kubelet's PodResources reports for the pod (PodNamespace, PodName).
	Allocation   string    `json:"allocation,omitempty"`
	Resource     string    `json:"resource,omitempty"`
	DeviceID     string    `json:"deviceID,omitempty"`
	PodUID       string    `json:"podUID,omitempty"`
	PodNamespace string    `json:"podNamespace,omitempty"`
	PodName      string    `json:"podName,omitempty"`
	Flows        []CNIFlow `json:"flows,omitempty"`
	// Netns is the pod's network namespace (CNI_NETNS): a netdev-mode
	// pool's netdev moves there, renamed IfName, with MTU if not zero.
	Netns string `json:"netns,omitempty"`
	MTU   int    `json:"mtu,omitempty"`
}

// Attachment is a pod's attachment as the daemon keeps it.
type Attachment struct {
	CNIAddRequest
	AllocationID string   `json:"allocationID"`
	Netdev       string   `json:"netdev"` // its name in the daemon's namespace
	Queues       []uint32 `json:"queues"`
	// Mode is the pool's: queue (flows steered onto the allocation's queues
	// of a netdev that stays on the node) or netdev (the netdev moved into
	// Netns as IfName; Mac is its address there).
	Mode string `json:"mode"`
	Mac  string `json:"mac,omitempty"`
	// NetnsInode identifies Netns as ADD found it: when the path is gone or
	// names another namespace, the pod is gone and the daemon ends the
	// attachment on its own (containerd never calls CNI GC).
	NetnsInode uint64 `json:"netnsInode,omitempty"`
}

// Pool modes.
const (
	ModeQueue  = "queue"
	ModeNetdev = "netdev"
)

// AllocRequest asks for queues of a pool (standalone).
type AllocRequest struct {
	Pool  string `json:"pool"`
	Count int    `json:"count"`
	UID   uint32 `json:"uid"`
}

// FreeRequest ends an allocation.
type FreeRequest struct {
	ID string `json:"id"`
}

// AttachmentRef names an attachment.
type AttachmentRef struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
}

// GCRequest lists the attachments to keep.
type GCRequest struct {
	Valid []string `json:"valid"` // "containerID/ifName"
}

// Error is a refused request.
type Error struct {
	Error string `json:"error"`
}

// Client talks to the daemon's local API.
type Client struct {
	http   *http.Client
	socket string
}

// NewClient returns a client of the API at socket ("" for the default).
func NewClient(socket string) *Client {
	if socket == "" {
		socket = DefaultSocket
	}
	return &Client{socket: socket, http: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		}}}}
}

func (c *Client) call(method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://xdpq"+path, body)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // not the made-up http://xdpq URL
		}
		return fmt.Errorf("the xdpq daemon's API at %s does not answer: %w (is the daemon running, with --api-socket %s?)",
			c.socket, err, c.socket)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e Error
		json.NewDecoder(resp.Body).Decode(&e)
		return errors.New(e.Error)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// Alloc asks for count queues of pool for uid.
func (c *Client) Alloc(pool string, count int, uid uint32) (*Allocation, error) {
	var a Allocation
	err := c.call("POST", "/v1/alloc", AllocRequest{pool, count, uid}, &a)
	return &a, err
}

// Free ends an allocation.
func (c *Client) Free(id string) error {
	var out map[string]string
	return c.call("POST", "/v1/free", FreeRequest{id}, &out)
}

// CNIAdd makes an attachment.
func (c *Client) CNIAdd(req CNIAddRequest) (*Attachment, error) {
	var a Attachment
	err := c.call("POST", "/v1/cni/add", req, &a)
	return &a, err
}

// CNIDel removes an attachment (none is no error).
func (c *Client) CNIDel(containerID, ifName string) error {
	var out map[string]string
	return c.call("POST", "/v1/cni/del", AttachmentRef{containerID, ifName}, &out)
}

// CNICheck verifies an attachment.
func (c *Client) CNICheck(containerID, ifName string) (*Attachment, error) {
	var a Attachment
	err := c.call("POST", "/v1/cni/check", AttachmentRef{containerID, ifName}, &a)
	return &a, err
}

// CNIGC removes the attachments not in valid ("containerID/ifName").
func (c *Client) CNIGC(valid []string) ([]string, error) {
	var out map[string][]string
	err := c.call("POST", "/v1/cni/gc", GCRequest{valid}, &out)
	return out["removed"], err
}

// Status reports the daemon's state.
func (c *Client) Status() (*Status, error) {
	var s Status
	err := c.call("GET", "/v1/status", nil, &s)
	return &s, err
}
