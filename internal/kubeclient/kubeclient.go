// Package kubeclient is the xdpq daemon's typed client of the Kubernetes
// API server: pods, nodes and events.k8s.io/v1 Events, the resources it
// uses, built like client-go's clientset (rest, gentype) but on a scheme
// of those two groups only. client-go's clientset would do, but its
// scheme registers every API group at init: linking it costs a node
// daemon about 9 MB of resident memory for types it never uses.
package kubeclient

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/gentype"
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
			return nil, fmt.Errorf("kubeclient: %w", err)
		}
	}
	c := *cfg
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	if c.RateLimiter == nil && c.QPS > 0 {
		if c.Burst <= 0 {
			return nil, fmt.Errorf("kubeclient: burst is required to be greater than 0 when RateLimiter is not set and QPS is set to greater than 0")
		}
		c.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(c.QPS, c.Burst)
	}
	hc, err := rest.HTTPClientFor(&c)
	if err != nil {
		return nil, fmt.Errorf("kubeclient: %w", err)
	}
	codecs := rest.CodecFactoryForGeneratedClient(scheme, serializer.NewCodecFactory(scheme)).WithoutConversion()
	group := func(gv schema.GroupVersion, apiPath string) (rest.Interface, error) {
		gc := c
		gc.GroupVersion, gc.APIPath, gc.NegotiatedSerializer = &gv, apiPath, codecs
		rc, err := rest.RESTClientForConfigAndClient(&gc, hc)
		if err != nil {
			return nil, fmt.Errorf("kubeclient: %s: %w", gv, err)
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
func (c *Client) Pods(namespace string) *gentype.ClientWithList[*corev1.Pod, *corev1.PodList] {
	return gentype.NewClientWithList("pods", c.core, c.params, namespace,
		func() *corev1.Pod { return &corev1.Pod{} }, func() *corev1.PodList { return &corev1.PodList{} },
		gentype.PrefersProtobuf[*corev1.Pod]())
}

// Nodes returns the nodes.
func (c *Client) Nodes() *gentype.Client[*corev1.Node] {
	return gentype.NewClient("nodes", c.core, c.params, "", func() *corev1.Node { return &corev1.Node{} },
		gentype.PrefersProtobuf[*corev1.Node]())
}

// Events returns the events.k8s.io/v1 Events of namespace.
func (c *Client) Events(namespace string) *gentype.Client[*eventsv1.Event] {
	return gentype.NewClient("events", c.events, c.params, namespace, func() *eventsv1.Event { return &eventsv1.Event{} },
		gentype.PrefersProtobuf[*eventsv1.Event]())
}

// EventSink returns the Events as client-go's tools/events and
// internal/kubeevents write them: each in its own namespace.
func (c *Client) EventSink() EventSink { return EventSink{c} }

// EventSink writes events.k8s.io/v1 Events, each in its namespace, as
// client-go's tools/events.EventSinkImpl does.
type EventSink struct{ c *Client }

// Create creates event.
func (s EventSink) Create(ctx context.Context, event *eventsv1.Event) (*eventsv1.Event, error) {
	if event.Namespace == "" {
		return nil, fmt.Errorf("can't create an event with empty namespace")
	}
	return s.c.Events(event.Namespace).Create(ctx, event, metav1.CreateOptions{})
}

// Update updates event.
func (s EventSink) Update(ctx context.Context, event *eventsv1.Event) (*eventsv1.Event, error) {
	if event.Namespace == "" {
		return nil, fmt.Errorf("can't update an event with empty namespace")
	}
	return s.c.Events(event.Namespace).Update(ctx, event, metav1.UpdateOptions{})
}

// Patch patches event with data, a strategic merge patch.
func (s EventSink) Patch(ctx context.Context, event *eventsv1.Event, data []byte) (*eventsv1.Event, error) {
	if event.Namespace == "" {
		return nil, fmt.Errorf("can't patch an event with empty namespace")
	}
	return s.c.Events(event.Namespace).Patch(ctx, event.Name, types.StrategicMergePatchType, data, metav1.PatchOptions{})
}
