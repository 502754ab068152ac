// Package kubepods keeps the pods of one node as the API server has them,
// by UID: an informer on pods with the field selector spec.nodeName, so a
// node's daemon watches its own pods only (as kubelet does), never the
// cluster's. The broker learns a peer's pod UID from its cgroup; kubelet's
// PodResources API knows pods by namespace and name: a Directory joins
// the two.
package kubepods

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

const (
	byUID = "uid"
	byIP  = "ip"
)

// Pods lists and watches the pods of every namespace: client-go's
// CoreV1().Pods("") and internal/kubeclient's Pods("") are ones.
type Pods interface {
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// Pod is what the daemon needs of a pod.
type Pod struct {
	Namespace, Name string
	UID             string
	Annotations     map[string]string
	IPs             []netip.Addr // status.podIPs
}

// Directory is the pods of one node, by UID.
type Directory struct {
	pods     Pods
	node     string
	informer cache.SharedIndexInformer
	// changed holds the UIDs of pods added, changed or deleted since
	// Next took them, each once (a client-go workqueue).
	changed workqueue.TypedInterface[string]
}

// New returns the directory of node's pods. It holds nothing until Run.
func New(pods Pods, node string) (*Directory, error) {
	if node == "" {
		return nil, errors.New("watch the node's pods: no node name")
	}
	// The informer client-go's informer factory would make
	// (informers/core/v1.NewTypedPodInformerWithOptions), without
	// linking the factory and its clientset of every API group.
	onNode := func(o metav1.ListOptions) metav1.ListOptions {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
		return o
	}
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return pods.List(ctx, onNode(o))
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return pods.Watch(ctx, onNode(o))
		},
	}, pods)
	var unnamed *cache.InformerName // the factory's without informers.WithInformerName
	inf := cache.NewSharedIndexInformerWithOptions(lw, &corev1.Pod{}, cache.SharedIndexInformerOptions{
		Indexers:   cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc},
		Identifier: unnamed.WithResource(schema.GroupVersionResource{Version: "v1", Resource: "pods"}),
	})
	if err := inf.AddIndexers(cache.Indexers{byUID: func(obj any) ([]string, error) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return nil, nil
		}
		return []string{string(p.UID)}, nil
	}, byIP: ipsOf}); err != nil {
		return nil, fmt.Errorf("index pods by uid and address: %w", err)
	}
	d := &Directory{pods: pods, node: node, informer: inf, changed: workqueue.NewTyped[string]()}
	add := func(obj any) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if p, ok := obj.(*corev1.Pod); ok {
			d.changed.Add(string(p.UID))
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: add, UpdateFunc: func(_, obj any) { add(obj) }, DeleteFunc: add}); err != nil {
		return nil, fmt.Errorf("follow pod events: %w", err)
	}
	return d, nil
}

// Next waits for a pod that was added, changed or deleted, and returns
// its UID; false once Run has ended (Run ends with its ctx, which should
// be Next's). The caller calls Done(uid) when it
// has dealt with it: until then further changes of that pod wait.
func (d *Directory) Next(ctx context.Context) (uid string, ok bool) {
	if ctx.Err() != nil {
		return "", false
	}
	uid, shutdown := d.changed.Get()
	return uid, !shutdown
}

// Done says the change Next returned is dealt with.
func (d *Directory) Done(uid string) { d.changed.Done(uid) }

// Touch queues uid as if the pod changed (its allocation did).
func (d *Directory) Touch(uid string) { d.changed.Add(uid) }

// Run keeps the directory until ctx ends. (The informer retries, with
// backoff, while the API server is away.)
func (d *Directory) Run(ctx context.Context) error {
	d.informer.RunWithContext(ctx)
	d.changed.ShutDown()
	return nil
}

// Synced says whether the directory has listed the node's pods once.
func (d *Directory) Synced() bool { return d.informer.HasSynced() }

// PodByUID returns the namespace and name of the node's pod with uid. A
// pod the informer has not seen yet (its container may connect within
// milliseconds of its creation) is looked for once in a fresh list of the
// node's pods.
func (d *Directory) PodByUID(ctx context.Context, uid string) (Pod, error) {
	if p, ok := d.Cached(uid); ok {
		return p, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	list, err := d.pods.List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", d.node).String()})
	if err != nil {
		return Pod{}, fmt.Errorf("pods of node %s: %w", d.node, err)
	}
	for i := range list.Items {
		if string(list.Items[i].UID) == uid {
			return podOf(&list.Items[i]), nil
		}
	}
	return Pod{}, fmt.Errorf("the API server has no pod %s on node %s", uid, d.node)
}

// Cached returns the node's pod with uid as the informer has it, without
// asking the API server: for callers that must not block.
func (d *Directory) Cached(uid string) (Pod, bool) {
	p := d.cached(uid)
	if p == nil {
		return Pod{}, false
	}
	return podOf(p), true
}

// ByIP returns the node's pods that hold address a as their own
// (status.podIPs), as the informer has them: not hostNetwork pods (their
// addresses are the node's), nor pods that ended (a new pod may hold
// their address).
func (d *Directory) ByIP(a netip.Addr) []Pod {
	objs, err := d.informer.GetIndexer().ByIndex(byIP, a.Unmap().String())
	if err != nil {
		return nil
	}
	var out []Pod
	for _, o := range objs {
		if p, ok := o.(*corev1.Pod); ok {
			out = append(out, podOf(p))
		}
	}
	return out
}

// ipsOf indexes a pod by the addresses it holds as its own; see ByIP.
func ipsOf(obj any) ([]string, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok || p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return nil, nil
	}
	var out []string
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			out = append(out, a.Unmap().String())
		}
	}
	return out, nil
}

func podOf(p *corev1.Pod) Pod {
	out := Pod{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID), Annotations: p.Annotations}
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			out.IPs = append(out.IPs, a)
		}
	}
	return out
}

func (d *Directory) cached(uid string) *corev1.Pod {
	objs, err := d.informer.GetIndexer().ByIndex(byUID, uid)
	if err != nil || len(objs) == 0 {
		return nil
	}
	p, _ := objs[0].(*corev1.Pod)
	return p
}
