package kubectlxdpq

import (
	"context"
	"io"
	"time"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// NewClientFrom is a Client of the given clients (fakes).
func NewClientFrom(dyn dynamic.Interface, disc discovery.DiscoveryInterface, core corev1client.CoreV1Interface) *Client {
	return &Client{dynamic: dyn, discovery: disc, core: core}
}

// RunTop runs `kubectl xdpq top nodes...` with c, its daemons in
// DefaultDaemonNamespace: mode "once", "json", or "live" (frames redrawn
// as on a terminal), with the clock now and refreshes when wait returns.
func RunTop(ctx context.Context, w io.Writer, c *Client, nodes []string, interval time.Duration, mode string,
	now func() time.Time, wait func(context.Context) error) error {
	t := &topper{c: c, nodes: nodes, chunk: DefaultChunkSize, namespace: DefaultDaemonNamespace, selector: DefaultDaemonSelector,
		timeout: time.Second, now: now}
	return t.run(ctx, w, topRun{interval: interval, once: mode == "once", json: mode == "json", clear: mode == "live", wait: wait})
}

// ClearScreen is what a live frame starts with on a terminal.
const ClearScreen = clearScreen
