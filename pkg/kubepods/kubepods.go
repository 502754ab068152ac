// Package kubepods keeps the pods of one node as the API server has them,
// by UID: an informer on pods with the field selector spec.nodeName, so a
// node's daemon watches its own pods only (as kubelet does), never the
// cluster's. The broker learns a peer's pod UID from its cgroup; kubelet's
// PodResources API knows pods by namespace and name: a Directory joins
// the two.
package kubepods

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

const byUID = "uid"

// Directory is the pods of one node, by UID.
type Directory struct {
	client   kubernetes.Interface
	node     string
	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer
}

// New returns the directory of node's pods. It holds nothing until Run.
func New(client kubernetes.Interface, node string) (*Directory, error) {
	if node == "" {
		return nil, fmt.Errorf("kubepods: no node name")
	}
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
	}))
	inf := f.Core().V1().Pods().Informer()
	if err := inf.AddIndexers(cache.Indexers{byUID: func(obj any) ([]string, error) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return nil, nil
		}
		return []string{string(p.UID)}, nil
	}}); err != nil {
		return nil, fmt.Errorf("kubepods: %w", err)
	}
	return &Directory{client: client, node: node, factory: f, informer: inf}, nil
}

// Run keeps the directory until ctx ends. (The informer retries, with
// backoff, while the API server is away.)
func (d *Directory) Run(ctx context.Context) error {
	d.factory.Start(ctx.Done())
	<-ctx.Done()
	d.factory.Shutdown()
	return nil
}

// Synced says whether the directory has listed the node's pods once.
func (d *Directory) Synced() bool { return d.informer.HasSynced() }

// PodByUID returns the namespace and name of the node's pod with uid. A
// pod the informer has not seen yet (its container may connect within
// milliseconds of its creation) is looked for once in a fresh list of the
// node's pods.
func (d *Directory) PodByUID(ctx context.Context, uid string) (namespace, name string, err error) {
	if p := d.cached(uid); p != nil {
		return p.Namespace, p.Name, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	list, err := d.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", d.node).String()})
	if err != nil {
		return "", "", fmt.Errorf("pods of node %s: %w", d.node, err)
	}
	for _, p := range list.Items {
		if string(p.UID) == uid {
			return p.Namespace, p.Name, nil
		}
	}
	return "", "", fmt.Errorf("the API server has no pod %s on node %s", uid, d.node)
}

// Cached returns the namespace and name of the node's pod with uid as the
// informer has it, without asking the API server: for callers that must
// not block.
func (d *Directory) Cached(uid string) (namespace, name string, ok bool) {
	if p := d.cached(uid); p != nil {
		return p.Namespace, p.Name, true
	}
	return "", "", false
}

func (d *Directory) cached(uid string) *corev1.Pod {
	objs, err := d.informer.GetIndexer().ByIndex(byUID, uid)
	if err != nil || len(objs) == 0 {
		return nil
	}
	p, _ := objs[0].(*corev1.Pod)
	return p
}
