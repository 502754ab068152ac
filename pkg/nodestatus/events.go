package nodestatus

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/xdpq/xdpq/pkg/apis/xdpq/v1alpha1"
)

// Event reasons, as `kubectl events` shows them.
const (
	EventNetdevOverridden  = "NetdevOverridden"
	EventNetdevReclaimed   = "NetdevReclaimed"
	EventConfigRefused     = "ConfigRefused"
	EventConnectionRefused = "ConnectionRefused"
	EventFlowsApplied      = "FlowsApplied"
	EventFlowsRefused      = "FlowsRefused"
	maxNote                = 1024 // events.k8s.io/v1's limit of a note
)

// NetdevOverridden records that a foreign program took netdev's XDP hook:
// xdpq steps aside.
func (w *Writer) NetdevOverridden(netdev, program string, id uint32) {
	w.event(nil, corev1.EventTypeWarning, EventNetdevOverridden, "StepAside",
		"netdev %s: foreign XDP program %q (id %d) has precedence; xdpq's sockets there get only what it redirects to them", netdev, program, id)
}

// NetdevReclaimed records that the foreign program left netdev and xdpq's
// program is back (state: Direct or Filter), or that none is needed
// (Idle).
func (w *Writer) NetdevReclaimed(netdev, state string) {
	w.event(nil, corev1.EventTypeNormal, EventNetdevReclaimed, "Attach",
		"netdev %s: the foreign XDP program is gone; xdpq's hook state is %s", netdev, state)
}

// ConfigRefused records that a config file was refused: the last good
// one stays in force.
func (w *Writer) ConfigRefused(err error) {
	w.event(nil, corev1.EventTypeWarning, EventConfigRefused, "Reload", "config refused, the last good one stays in force: %v", err)
}

// ConnectionRefused records that the broker refused a connection to
// allocation alloc's socket, on the XdpqNode and, when the pod is known
// (its namespace and name), on the pod.
func (w *Writer) ConnectionRefused(alloc string, pod v1alpha1.PodRef, code, reason string) {
	var podRef *corev1.ObjectReference
	if pod.Namespace != "" && pod.Name != "" {
		podRef = &corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: types.UID(pod.UID)}
	}
	who := "a connection"
	switch {
	case podRef != nil:
		who = "pod " + pod.Namespace + "/" + pod.Name
	case pod.UID != "":
		who = "a process of pod " + pod.UID
	}
	note := fmt.Sprintf("allocation %s: %s was refused (%s): %s", alloc, who, code, reason)
	if podRef == nil {
		w.event(nil, corev1.EventTypeWarning, EventConnectionRefused, "Connect", "%s", note)
		return
	}
	w.event(podRef, corev1.EventTypeWarning, EventConnectionRefused, "Connect", "%s", note)
	w.record(podRef, w.regarding(), corev1.EventTypeWarning, EventConnectionRefused, "Connect", note)
}

// PodFlows records on the pod that the flows of its xdpq.io/flows
// annotation are steered to its allocation's queues (refused empty), or
// why they are not.
func (w *Writer) PodFlows(pod v1alpha1.PodRef, alloc string, flows []string, refused string) {
	ref := &corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: types.UID(pod.UID)}
	if refused != "" {
		w.record(ref, w.regarding(), corev1.EventTypeWarning, EventFlowsRefused, "Steer",
			fmt.Sprintf("allocation %s: the pod's flows are refused, none is steered: %s", alloc, refused))
		return
	}
	w.record(ref, w.regarding(), corev1.EventTypeNormal, EventFlowsApplied, "Steer",
		fmt.Sprintf("allocation %s: %d flows steered to the pod's queues: %s", alloc, len(flows), strings.Join(flows, ", ")))
}

// event records an event on the XdpqNode, related to related if not nil.
func (w *Writer) event(related *corev1.ObjectReference, typ, reason, action, format string, args ...any) {
	w.record(w.regarding(), related, typ, reason, action, fmt.Sprintf(format, args...))
}

func (w *Writer) record(regarding, related *corev1.ObjectReference, typ, reason, action, note string) {
	w.mu.Lock()
	rec := w.recorder
	w.mu.Unlock()
	if rec == nil {
		w.log.Debug("event not recorded: the node status writer is not running", "reason", reason, "note", note)
		return
	}
	if len(note) > maxNote {
		note = note[:maxNote-3] + "..."
	}
	rec.Event(regarding, related, typ, reason, action, note)
}

// regarding is the XdpqNode as events name it: with its UID once it is
// created.
func (w *Writer) regarding() *corev1.ObjectReference {
	ref := &corev1.ObjectReference{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.Kind, Name: w.cfg.Node}
	if o := w.object(); o != nil {
		ref.UID = o.UID
	}
	return ref
}
