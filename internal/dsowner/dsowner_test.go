package dsowner

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeAPIServer is the little of a Kubernetes API server Owner talks to:
// one namespace's DaemonSets, by name, with list, watch and get, behind a
// bearer token. No API server runs on this machine in this package's
// tests (test/e2e has a real one); what Owner must get right is what it
// does with the answers, and the fake answers as the API server does.
type fakeAPIServer struct {
	t     *testing.T
	srv   *httptest.Server
	token string

	mu        sync.Mutex
	ds        map[string]string // name -> deletionTimestamp ("" none)
	rv        int
	watchers  []chan string // each open watch's events, JSON lines
	lists     int
	failLists int // answer this many lists 500
	expireOne bool
	watching  chan struct{} // a value each time a watch opens
	refused   chan struct{} // a value each time a request is answered 401
}

func newFakeAPIServer(t *testing.T) *fakeAPIServer {
	f := &fakeAPIServer{t: t, token: "s3cret", ds: map[string]string{}, watching: make(chan struct{}, 100), refused: make(chan struct{}, 100)}
	f.srv = httptest.NewTLSServer(http.HandlerFunc(f.serve))
	t.Cleanup(func() {
		f.endWatches()
		f.srv.Close()
	})
	return f
}

// endWatches ends every open watch, as the API server does at a watch's
// timeout.
func (f *fakeAPIServer) endWatches() {
	f.mu.Lock()
	for _, w := range f.watchers {
		close(w)
	}
	f.watchers = nil
	f.mu.Unlock()
}

func (f *fakeAPIServer) api(t *testing.T) *API {
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte(f.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return &API{Server: f.srv.URL, Client: f.srv.Client(), TokenFile: tok}
}

func (f *fakeAPIServer) objectJSON(name string) string {
	del := "null"
	if ts := f.ds[name]; ts != "" {
		del = fmt.Sprintf("%q", ts)
	}
	return fmt.Sprintf(`{"apiVersion":"apps/v1","kind":"DaemonSet","metadata":{"name":%q,"namespace":"xdpq","resourceVersion":"%d","deletionTimestamp":%s}}`, name, f.rv, del)
}

// event changes the DaemonSet and tells every watch.
func (f *fakeAPIServer) event(typ, name, deletionTimestamp string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rv++
	obj := ""
	switch typ {
	case "DELETED":
		f.ds[name] = deletionTimestamp
		obj = f.objectJSON(name)
		delete(f.ds, name)
	default:
		f.ds[name] = deletionTimestamp
		obj = f.objectJSON(name)
	}
	for _, w := range f.watchers {
		w <- fmt.Sprintf(`{"type":%q,"object":%s}`, typ, obj)
	}
}

func (f *fakeAPIServer) serve(w http.ResponseWriter, r *http.Request) {
	status := func(code int, msg string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":%q,"code":%d}`, msg, code)
	}
	f.mu.Lock()
	tok := f.token
	f.mu.Unlock()
	if r.Header.Get("Authorization") != "Bearer "+tok {
		status(401, "Unauthorized")
		f.refused <- struct{}{}
		return
	}
	const base = "/apis/apps/v1/namespaces/xdpq/daemonsets"
	q := r.URL.Query()
	f.mu.Lock()
	switch {
	case strings.HasPrefix(r.URL.Path, base+"/"):
		name := strings.TrimPrefix(r.URL.Path, base+"/")
		_, ok := f.ds[name]
		obj := f.objectJSON(name)
		f.mu.Unlock()
		if !ok {
			status(404, fmt.Sprintf("daemonsets.apps %q not found", name))
			return
		}
		fmt.Fprint(w, obj)
	case r.URL.Path == base && q.Get("watch") != "true":
		f.lists++
		if f.failLists > 0 {
			f.failLists--
			f.mu.Unlock()
			status(500, "etcdserver: request timed out")
			return
		}
		name, ok := strings.CutPrefix(q.Get("fieldSelector"), "metadata.name=")
		if !ok {
			f.mu.Unlock()
			status(403, "list without a metadata.name field selector is forbidden by resourceNames")
			return
		}
		items := ""
		if _, ok := f.ds[name]; ok {
			items = f.objectJSON(name)
		}
		body := fmt.Sprintf(`{"kind":"DaemonSetList","metadata":{"resourceVersion":"%d"},"items":[%s]}`, f.rv, items)
		f.mu.Unlock()
		fmt.Fprint(w, body)
	case r.URL.Path == base:
		if f.expireOne {
			f.expireOne = false
			f.mu.Unlock()
			fmt.Fprint(w, `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too old resource version","reason":"Expired","code":410}}`+"\n")
			return
		}
		ch := make(chan string, 10)
		f.watchers = append(f.watchers, ch)
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		f.watching <- struct{}{}
		for {
			select {
			case ev, ok := <-ch:
				if !ok {
					return
				}
				fmt.Fprintln(w, ev)
				w.(http.Flusher).Flush()
			case <-r.Context().Done():
				return
			}
		}
	default:
		f.mu.Unlock()
		status(404, "not found")
	}
}

// waitWatching waits until a watch has opened.
func (f *fakeAPIServer) waitWatching(t *testing.T) {
	t.Helper()
	waitChan(t, f.watching, "watch opened")
}

// runOwner runs Follow until stop is called, which returns its answer.
func runOwner(t *testing.T, o *Owner) (stop func() bool) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan bool, 1)
	go func() {
		gone, why := o.Follow(ctx, 5*time.Second)
		t.Logf("Follow: %v, %s", gone, why)
		done <- gone
	}()
	t.Cleanup(cancel)
	return func() bool {
		cancel()
		select {
		case gone := <-done:
			return gone
		case <-time.After(20 * time.Second):
			t.Fatal("Follow did not return after its context ended")
			return false
		}
	}
}

// newOwner returns an Owner of the DaemonSet xdpq/xdpq and a channel
// that receives what it learns, each time it learns it.
func newOwner(t *testing.T, f *fakeAPIServer) (*Owner, chan bool) {
	learnt := make(chan bool, 100)
	o := &Owner{API: f.api(t), Namespace: "xdpq", Name: "xdpq", Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))}
	o.learnt = func(gone bool) { learnt <- gone }
	return o, learnt
}

// waitLearnt waits until the owner has learnt want.
func waitLearnt(t *testing.T, learnt chan bool, want bool) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case got := <-learnt:
			if got == want {
				return
			}
		case <-timeout:
			t.Fatalf("the owner did not learn gone=%v", want)
		}
	}
}

func waitChan(t *testing.T, c chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s", what)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// The pod stops while its DaemonSet stays (a rolling update): the plugin
// stays.
func TestOwnerKeepsPluginOnRestart_FakeAPIServer(t *testing.T) {
	f := newFakeAPIServer(t)
	f.event("ADDED", "xdpq", "")
	o, learnt := newOwner(t, f)
	stop := runOwner(t, o)
	waitLearnt(t, learnt, false)
	f.waitWatching(t)
	f.event("MODIFIED", "xdpq", "") // the update's new template
	waitLearnt(t, learnt, false)
	if stop() {
		t.Error("uninstalling while its DaemonSet remains")
	}
}

// helm uninstall: the DaemonSet is deleted, then (in the real order) its
// service account's token stops working, and only then does the pod
// stop: the plugin goes.
func TestOwnerRemovesPluginOnUninstall_FakeAPIServer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		event func(f *fakeAPIServer)
	}{
		{"background deletion", func(f *fakeAPIServer) { f.event("DELETED", "xdpq", "") }},
		{"foreground deletion", func(f *fakeAPIServer) { f.event("MODIFIED", "xdpq", "2026-01-02T03:04:05Z") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPIServer(t)
			f.event("ADDED", "xdpq", "")
			o, learnt := newOwner(t, f)
			stop := runOwner(t, o)
			waitLearnt(t, learnt, false)
			f.waitWatching(t)
			tc.event(f)
			waitLearnt(t, learnt, true)
			f.mu.Lock()
			f.token = "revoked"
			f.mu.Unlock()
			f.endWatches()
			waitChan(t, f.refused, "refused list after the token was revoked")
			if !stop() {
				t.Error("not uninstalling after its DaemonSet was deleted")
			}
		})
	}
}

// A DaemonSet deleted and created again (an uninstall and an install
// while this pod lived, or a watch that missed the deletion) is there:
// the plugin stays.
func TestOwnerDaemonSetCreatedAgain_FakeAPIServer(t *testing.T) {
	f := newFakeAPIServer(t)
	f.event("ADDED", "xdpq", "")
	o, learnt := newOwner(t, f)
	stop := runOwner(t, o)
	waitLearnt(t, learnt, false)
	f.waitWatching(t)
	f.event("DELETED", "xdpq", "")
	waitLearnt(t, learnt, true)
	f.event("ADDED", "xdpq", "")
	waitLearnt(t, learnt, false)
	if stop() {
		t.Error("uninstalling while a DaemonSet of its name exists")
	}
}

// A watch that expires (410) and lists that fail are listed again; the
// deletion found by the new list counts.
func TestOwnerListsAgain_FakeAPIServer(t *testing.T) {
	f := newFakeAPIServer(t)
	f.event("ADDED", "xdpq", "")
	f.expireOne = true
	f.failLists = 0
	o, learnt := newOwner(t, f)
	stop := runOwner(t, o)
	waitLearnt(t, learnt, false)
	waitLearnt(t, learnt, false) // the list after the expired watch
	f.waitWatching(t)
	f.mu.Lock()
	f.failLists = 1
	f.mu.Unlock()
	f.endWatches()
	f.event("DELETED", "xdpq", "") // while no watch is open
	waitLearnt(t, learnt, true)
	f.mu.Lock()
	lists := f.lists
	f.mu.Unlock()
	if lists != 4 {
		t.Errorf("%d lists, want 4 (first, after the expired watch, refused, after the backoff)", lists)
	}
	if !stop() {
		t.Error("not uninstalling after its DaemonSet was deleted")
	}
}

// When the watch never got an answer, Uninstalling asks once; what it
// cannot learn keeps the plugin.
func TestOwnerNeverListed_FakeAPIServer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ds     bool
		token  string
		remove bool
		reason string
	}{
		{"DaemonSet missing", false, "s3cret", true, "does not exist"},
		{"DaemonSet there", true, "s3cret", false, "remains"},
		{"refused", false, "wrong", false, "(401 Unauthorized: Unauthorized): taken as staying"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPIServer(t)
			if tc.ds {
				f.event("ADDED", "xdpq", "")
			}
			f.failLists = 1 << 30
			o, _ := newOwner(t, f)
			f.mu.Lock()
			f.token = tc.token
			f.mu.Unlock()
			got, why := o.Uninstalling(context.Background())
			if got != tc.remove || !strings.Contains(why, tc.reason) {
				t.Errorf("Uninstalling = %v, %q; want %v, ...%s...", got, why, tc.remove, tc.reason)
			}
		})
	}
	// No API server at all.
	f := newFakeAPIServer(t)
	o, _ := newOwner(t, f)
	f.srv.Close()
	if got, why := o.Uninstalling(context.Background()); got || !strings.Contains(why, "could not be asked for") {
		t.Errorf("Uninstalling without an API server = %v, %q; want false, could not be asked for", got, why)
	}
}
