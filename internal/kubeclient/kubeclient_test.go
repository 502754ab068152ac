package kubeclient_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"

	"github.com/xdpq/xdpq/internal/kubeclient"
)

// TestClient: each resource is asked for at its path, with its options
// as query parameters, and its answer decoded. (test/e2e runs the client
// against a real kube-apiserver.)
func TestClient(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := eventsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	codecs := serializer.NewCodecFactory(scheme)
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.RequestURI()+" "+r.UserAgent())
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		var out any
		switch r.URL.Path {
		case "/api/v1/pods":
			out = corev1.PodList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PodList"},
				Items: []corev1.Pod{{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "p", UID: "u"}}}}
		case "/api/v1/nodes/n1":
			out = corev1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}, ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "nu"}}
		case "/apis/events.k8s.io/v1/namespaces/default/events":
			// As client-go's clientset sends it: protobuf.
			body, _ := io.ReadAll(r.Body)
			obj, _, err := codecs.UniversalDeserializer().Decode(body, nil, nil)
			e, ok := obj.(*eventsv1.Event)
			if !ok {
				t.Errorf("event sent as %s: %v", r.Header.Get("Content-Type"), err)
				return
			}
			e.APIVersion, e.Kind, e.ResourceVersion = "events.k8s.io/v1", "Event", "7"
			out = e
		default:
			http.NotFound(w, r)
			return
		}
		if err := json.NewEncoder(w).Encode(out); err != nil {
			t.Error(err)
		}
	}))
	t.Cleanup(srv.Close)
	c, err := kubeclient.NewForConfig(&rest.Config{Host: srv.URL, UserAgent: "xdpq-test"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pods, err := c.Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=n1"})
	if err != nil || len(pods.Items) != 1 || pods.Items[0].UID != "u" {
		t.Fatalf("pods: %v %+v", err, pods)
	}
	node, err := c.Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil || node.UID != "nu" {
		t.Fatalf("node: %v %+v", err, node)
	}
	ev, err := c.EventSink().Create(ctx, &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "n1.1"}, Reason: "R"})
	if err != nil || ev.Reason != "R" || ev.ResourceVersion != "7" {
		t.Fatalf("event: %v %+v", err, ev)
	}
	if _, err := c.EventSink().Create(ctx, &eventsv1.Event{}); err == nil {
		t.Error("an event without a namespace was sent")
	}
	want := []string{
		"GET /api/v1/pods?fieldSelector=spec.nodeName%3Dn1 xdpq-test",
		"GET /api/v1/nodes/n1 xdpq-test",
		"POST /apis/events.k8s.io/v1/namespaces/default/events xdpq-test",
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != len(want) {
		t.Fatalf("requests %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("request %d: %q, want %q", i, got[i], want[i])
		}
	}
}
