// Package kubeclient is the xdpq daemon's typed client of the Kubernetes
// API server: pods, nodes and events.k8s.io/v1 Events, the resources it
// uses, built like client-go's clientset (on rest) but on a scheme
// of those two groups only. client-go's clientset would do, but its
// scheme registers every API group at init: linking it costs a node
// daemon about 9 MB of resident memory for types it never uses.
package kubeclient

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// Client reaches one API server's core/v1 and events.k8s.io/v1 groups.
type Client struct {
	core, events rest.Interface
	params       runtime.ParameterCodec
}

// NewForConfig returns a client of the API server cfg reaches, set up as
// client-go's kubernetes.NewForConfig sets up its clientset: one HTTP
// client and one rate limiter (cfg's QPS and Burst) for both groups,
// protobuf where cfg allows it.
func NewForConfig(cfg *rest.Config) (*Client, error) {
	scheme := runtime.NewScheme()
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, eventsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, fmt.Errorf("register API types: %w", err)
		}
	}
	c := *cfg
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	if c.RateLimiter == nil && c.QPS > 0 {
		if c.Burst <= 0 {
			return nil, fmt.Errorf("burst is required to be greater than 0 when RateLimiter is not set and QPS is set to greater than 0")
		}
		c.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(c.QPS, c.Burst)
	}
	hc, err := rest.HTTPClientFor(&c)
	if err != nil {
		return nil, fmt.Errorf("make HTTP client: %w", err)
	}
	codecs := rest.CodecFactoryForGeneratedClient(scheme, serializer.NewCodecFactory(scheme)).WithoutConversion()
	group := func(gv schema.GroupVersion, apiPath string) (rest.Interface, error) {
		gc := c
		gc.GroupVersion, gc.APIPath, gc.NegotiatedSerializer = &gv, apiPath, codecs
		rc, err := rest.RESTClientForConfigAndClient(&gc, hc)
		if err != nil {
			return nil, fmt.Errorf("make client of %s: %w", gv, err)
		}
		return rc, nil
	}
	core, err := group(corev1.SchemeGroupVersion, "/api")
	if err != nil {
		return nil, err
	}
	events, err := group(eventsv1.SchemeGroupVersion, "/apis")
	if err != nil {
		return nil, err
	}
	return &Client{core: core, events: events, params: runtime.NewParameterCodec(scheme)}, nil
}

// Pods returns the pods of namespace; "" is every namespace.
func (c *Client) Pods(namespace string) Pods { return Pods{c, namespace} }

// Nodes returns the nodes.
func (c *Client) Nodes() Nodes { return Nodes{c} }

// EventSink returns the events.k8s.io/v1 Events as client-go's
// tools/events and internal/kubeevents write them: each in its own
// namespace.
func (c *Client) EventSink() EventSink { return EventSink{c} }

// The requests below are those of client-go's typed clients
// (k8s.io/client-go/gentype), which this package does not use: gentype
// imports client-go's fakes, and with them OpenAPI and managed fields'
// packages, about 3 MB of resident memory more.

// Pods is the pods of one namespace, or of every namespace.
type Pods struct {
	c         *Client
	namespace string
}

// List lists the pods.
func (p Pods) List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
	var list corev1.PodList
	err := p.c.core.Get().UseProtobufAsDefaultIfPreferred(true).NamespaceIfScoped(p.namespace, p.namespace != "").Resource("pods").
		VersionedParams(&opts, p.c.params).Timeout(timeout(opts)).Do(ctx).Into(&list)
	return &list, err
}

// Watch watches the pods.
func (p Pods) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return p.c.core.Get().UseProtobufAsDefaultIfPreferred(true).NamespaceIfScoped(p.namespace, p.namespace != "").Resource("pods").
		VersionedParams(&opts, p.c.params).Timeout(timeout(opts)).Watch(ctx)
}

func timeout(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}

// Nodes is the nodes.
type Nodes struct{ c *Client }

// Get gets the node name.
func (n Nodes) Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Node, error) {
	var node corev1.Node
	err := n.c.core.Get().UseProtobufAsDefaultIfPreferred(true).Resource("nodes").Name(name).
		VersionedParams(&opts, n.c.params).Do(ctx).Into(&node)
	return &node, err
}

// EventSink writes events.k8s.io/v1 Events, each in its namespace, as
// client-go's tools/events.EventSinkImpl does.
type EventSink struct{ c *Client }

// Create creates event.
func (s EventSink) Create(ctx context.Context, event *eventsv1.Event) (*eventsv1.Event, error) {
	if event.Namespace == "" {
		return nil, fmt.Errorf("can't create an event with empty namespace")
	}
	var out eventsv1.Event
	err := s.c.events.Post().UseProtobufAsDefaultIfPreferred(true).Namespace(event.Namespace).Resource("events").
		VersionedParams(&metav1.CreateOptions{}, s.c.params).Body(event).Do(ctx).Into(&out)
	return &out, err
}

// Patch patches event with data, a strategic merge patch.
func (s EventSink) Patch(ctx context.Context, event *eventsv1.Event, data []byte) (*eventsv1.Event, error) {
	if event.Namespace == "" {
		return nil, fmt.Errorf("can't patch an event with empty namespace")
	}
	var out eventsv1.Event
	err := s.c.events.Patch(types.StrategicMergePatchType).UseProtobufAsDefaultIfPreferred(true).Namespace(event.Namespace).Resource("events").
		Name(event.Name).VersionedParams(&metav1.PatchOptions{}, s.c.params).Body(data).Do(ctx).Into(&out)
	return &out, err
}
