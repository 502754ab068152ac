package kubectlxdpq

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"

	"github.com/xdpq/xdpq/pkg/apis/xdpq/v1alpha1"
)

// ErrCRDNotInstalled is returned when the API server does not serve
// XdpqNodes: xdpq is not installed on the cluster.
var ErrCRDNotInstalled = errors.New("the XdpqNode CRD is not installed: helm install xdpq charts/xdpq -n kube-system (or kubectl apply -f manifests/xdpq.yaml), see xdpq's README, \"Install on a cluster\"")

// NoXdpqNodeError is returned for a node that has no XdpqNode.
type NoXdpqNodeError struct {
	// Node is the node's name.
	Node string
	// NodeExists says whether the cluster has a Node of that name: true,
	// false, or nil when it could not be told.
	NodeExists *bool
}

func (e *NoXdpqNodeError) Error() string {
	if e.NodeExists != nil && !*e.NodeExists {
		return fmt.Sprintf("no XdpqNode %q: the cluster has no node of that name (kubectl get nodes)", e.Node)
	}
	return fmt.Sprintf("no XdpqNode for node %q: xdpq's daemon has not reported from it; is its pod running there? "+
		"(kubectl get pods -A -l app.kubernetes.io/name=xdpq -o wide --field-selector spec.nodeName=%s)", e.Node, e.Node)
}

// Client reads XdpqNodes, and the Events about them, from an API server.
type Client struct {
	dynamic   dynamic.Interface
	discovery discovery.DiscoveryInterface
	core      corev1client.CoreV1Interface
}

// NewClient returns a Client of the API server cfg names.
func NewClient(cfg *rest.Config) (*Client, error) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("discovery client: %w", err)
	}
	core, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("core client: %w", err)
	}
	return &Client{dynamic: dyn, discovery: disc, core: core}, nil
}

// DefaultChunkSize is how many XdpqNodes List asks for at a time, as
// kubectl get does.
const DefaultChunkSize = 500

// List returns every XdpqNode as the API server serves it, chunk at a
// time (0: all at once).
func (c *Client) List(ctx context.Context, chunk int64) ([]unstructured.Unstructured, error) {
	var out []unstructured.Unstructured
	opts := metav1.ListOptions{Limit: chunk}
	for {
		l, err := c.dynamic.Resource(v1alpha1.Resource).List(ctx, opts)
		if apierrors.IsNotFound(err) {
			// A list of a served resource is never NotFound: the resource
			// is not served.
			return nil, ErrCRDNotInstalled
		}
		if err != nil {
			return nil, fmt.Errorf("list XdpqNodes: %w", err)
		}
		out = append(out, l.Items...)
		if opts.Continue = l.GetContinue(); opts.Continue == "" {
			return out, nil
		}
	}
}

// Get returns node's XdpqNode as the API server serves it. When there is
// none, the error is a *NoXdpqNodeError, or ErrCRDNotInstalled when
// XdpqNodes are not served.
func (c *Client) Get(ctx context.Context, node string) (*unstructured.Unstructured, error) {
	u, err := c.dynamic.Resource(v1alpha1.Resource).Get(ctx, node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, c.notFound(ctx, node)
	}
	if err != nil {
		return nil, fmt.Errorf("get XdpqNode %s: %w", node, err)
	}
	return u, nil
}

// notFound tells why node's XdpqNode was not found: the resource is not
// served, or the node has none (and whether the node exists at all).
func (c *Client) notFound(ctx context.Context, node string) error {
	// The API server answers NotFound for an object and for a resource it
	// does not serve alike: ask discovery which.
	rs, err := c.discovery.ServerResourcesForGroupVersion(v1alpha1.SchemeGroupVersion.String())
	switch {
	case apierrors.IsNotFound(err):
		return ErrCRDNotInstalled
	case err == nil && !served(rs):
		return ErrCRDNotInstalled
	}
	e := &NoXdpqNodeError{Node: node}
	// Whether the node exists is a hint only: a user who may not read
	// nodes gets the message without it.
	_, err = c.core.Nodes().Get(ctx, node, metav1.GetOptions{})
	switch {
	case err == nil:
		e.NodeExists = new(true)
	case apierrors.IsNotFound(err):
		e.NodeExists = new(false)
	}
	return e
}

func served(rs *metav1.APIResourceList) bool {
	for _, r := range rs.APIResources {
		if r.Name == v1alpha1.Resource.Resource {
			return true
		}
	}
	return false
}

// Events returns the Events about n, in every namespace (those about a
// cluster-scoped object are recorded in "default").
func (c *Client) Events(ctx context.Context, n *v1alpha1.XdpqNode) ([]corev1.Event, error) {
	sel := fields.Set{"involvedObject.kind": v1alpha1.Kind, "involvedObject.name": n.Name}
	if n.UID != "" {
		sel["involvedObject.uid"] = string(n.UID)
	}
	l, err := c.core.Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: sel.AsSelector().String()})
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	return l.Items, nil
}

// Typed converts XdpqNodes as served to their Go type. Fields the type
// does not have (a CRD newer than this plugin) are left out; -o json and
// -o yaml, which print the objects as served, show them.
func Typed(us []unstructured.Unstructured) ([]v1alpha1.XdpqNode, error) {
	out := make([]v1alpha1.XdpqNode, len(us))
	for i := range us {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(us[i].Object, &out[i]); err != nil {
			return nil, fmt.Errorf("XdpqNode %s: %w", us[i].GetName(), err)
		}
	}
	return out, nil
}
