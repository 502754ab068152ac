package cluster

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// CreateNamespace creates a namespace with labels and waits until its
// default service account and kube-root-ca.crt exist (made by
// kube-controller-manager, which StartNode starts): a pod created before
// them is refused.
func (cp *ControlPlane) CreateNamespace(ctx context.Context, name string, labels map[string]string) error {
	_, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create namespace %s: %w", name, err)
	}
	if err := cp.waitExists(ctx, "serviceaccounts", name, "default"); err != nil {
		return err
	}
	return cp.waitExists(ctx, "configmaps", name, "kube-root-ca.crt")
}

// listWatch is a list-watch of the core objects of a resource named name
// in namespace.
func (cp *ControlPlane) listWatch(resource, namespace, name string) *cache.ListWatch {
	return cache.NewFilteredListWatchFromClient(cp.Client.CoreV1().RESTClient(), resource, namespace, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
	})
}

// waitExists waits until the core object resource namespace/name exists.
func (cp *ControlPlane) waitExists(ctx context.Context, resource, namespace, name string) error {
	_, err := watchtools.UntilWithSync(ctx, cp.listWatch(resource, namespace, name), nil, nil, func(ev watch.Event) (bool, error) {
		return ev.Type == watch.Added || ev.Type == watch.Modified, nil
	})
	if err != nil {
		return fmt.Errorf("wait for %s %s/%s: %w", resource, namespace, name, err)
	}
	return nil
}

// PodCondition says whether a pod is where a wait wants it, or that it
// never will be (an error).
type PodCondition func(*corev1.Pod) (bool, error)

// PodRunning is a pod's phase Running; Succeeded or Failed is an error.
func PodRunning(p *corev1.Pod) (bool, error) {
	switch p.Status.Phase {
	case corev1.PodRunning:
		return true, nil
	case corev1.PodSucceeded, corev1.PodFailed:
		return false, fmt.Errorf("pod %s/%s %s, want Running", p.Namespace, p.Name, p.Status.Phase)
	}
	return false, nil
}

// PodSucceeded is a pod's phase Succeeded; Failed is an error.
func PodSucceeded(p *corev1.Pod) (bool, error) {
	switch p.Status.Phase {
	case corev1.PodSucceeded:
		return true, nil
	case corev1.PodFailed:
		return false, fmt.Errorf("pod %s/%s Failed: %s", p.Namespace, p.Name, containerStates(p))
	}
	return false, nil
}

// WaitPod watches a pod until cond holds and returns it. An error says
// where the pod was and its events.
func (cp *ControlPlane) WaitPod(ctx context.Context, namespace, name string, cond PodCondition) (*corev1.Pod, error) {
	var last *corev1.Pod
	ev, err := watchtools.UntilWithSync(ctx, cp.listWatch("pods", namespace, name), &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
		if ev.Type == watch.Deleted {
			return false, apierrors.NewNotFound(corev1.Resource("pods"), name)
		}
		p, ok := ev.Object.(*corev1.Pod)
		if !ok {
			return false, nil
		}
		last = p
		return cond(p)
	})
	if err != nil {
		return last, fmt.Errorf("pod %s/%s: %w (%s; events: %s)", namespace, name, err, podState(last), cp.events(namespace, name))
	}
	return ev.Object.(*corev1.Pod), nil
}

func podState(p *corev1.Pod) string {
	if p == nil {
		return "not seen"
	}
	return fmt.Sprintf("phase %s on node %q: %s", p.Status.Phase, p.Spec.NodeName, containerStates(p))
}

func containerStates(p *corev1.Pod) string {
	var s []string
	for _, c := range p.Status.ContainerStatuses {
		switch {
		case c.State.Waiting != nil:
			s = append(s, fmt.Sprintf("%s waiting: %s %s", c.Name, c.State.Waiting.Reason, c.State.Waiting.Message))
		case c.State.Terminated != nil:
			s = append(s, fmt.Sprintf("%s terminated: exit %d %s %s", c.Name, c.State.Terminated.ExitCode, c.State.Terminated.Reason, c.State.Terminated.Message))
		case c.State.Running != nil:
			s = append(s, c.Name+" running")
		}
	}
	if len(s) == 0 {
		return "no container status"
	}
	return strings.Join(s, "; ")
}

// events returns the events of an object, one line each.
func (cp *ControlPlane) events(namespace, name string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	evs, err := cp.Client.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.name", name).String(),
	})
	if err != nil {
		return err.Error()
	}
	var s []string
	for _, e := range evs.Items {
		s = append(s, fmt.Sprintf("%s %s: %s", e.Type, e.Reason, e.Message))
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, " | ")
}
