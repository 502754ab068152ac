// Package dsowner follows the DaemonSet that runs a pod, so that when
// the pod stops it knows whether its DaemonSet went with it (helm
// uninstall, kubectl delete) or stays (a restart, a rolling update, an
// eviction, a node shutdown). xdpq's daemon removes its datapath from the
// node, and the CNI installer's sidecar the plugin, only in the first
// case.
package dsowner

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
)

// The in-cluster service account's files, as kubelet projects them.
const (
	serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
	// DefaultTokenFile is the pod's service account token.
	DefaultTokenFile = serviceAccountDir + "/token"
	// DefaultCAFile is the cluster's CA bundle.
	DefaultCAFile = serviceAccountDir + "/ca.crt"
)

// API is the little of the Kubernetes API server the sidecar needs:
// authenticated GETs. It is plain net/http, not client-go: the installer
// runs in every node's xdpq pod for the node's lifetime and needs one
// resource's get, list and watch.
type API struct {
	// Server is the API server's base URL, https://host:port.
	Server string
	// Client sends the requests. It must have no Timeout: a watch is a
	// response that lasts minutes.
	Client *http.Client
	// TokenFile holds the bearer token, read again for every request
	// (kubelet rotates projected tokens); "" sends none.
	TokenFile string
}

// InCluster returns the API server of the pod's cluster as its service
// account sees it: KUBERNETES_SERVICE_HOST and _PORT, the token and the
// CA that kubelet projects into every pod.
func InCluster() (*API, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, errors.New("in-cluster API server: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set (not running in a pod?)")
	}
	ca, err := os.ReadFile(DefaultCAFile)
	if err != nil {
		return nil, fmt.Errorf("in-cluster API server: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("in-cluster API server: no certificate in %s", DefaultCAFile)
	}
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
	}
	return &API{
		Server:    "https://" + net.JoinHostPort(host, port),
		Client:    &http.Client{Transport: tr},
		TokenFile: DefaultTokenFile,
	}, nil
}

// get sends GET path?query and returns the response, whatever its status.
func (a *API) get(ctx context.Context, path string, query url.Values) (*http.Response, error) {
	u := strings.TrimSuffix(a.Server, "/") + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if a.TokenFile != "" {
		tok, err := os.ReadFile(a.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("service account token: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	}
	return a.Client.Do(req)
}

// statusError is the error of a response other than 200: its code and
// the API server's message.
func statusError(resp *http.Response) error {
	var st struct {
		Message string `json:"message"`
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if json.Unmarshal(body, &st) != nil || st.Message == "" {
		st.Message = strings.TrimSpace(string(body))
	}
	return fmt.Errorf("%s: %s", resp.Status, st.Message)
}

// objectMeta is the part of an object's metadata the owner watch reads.
type objectMeta struct {
	Name              string  `json:"name"`
	ResourceVersion   string  `json:"resourceVersion"`
	DeletionTimestamp *string `json:"deletionTimestamp"`
}

type object struct {
	Metadata objectMeta `json:"metadata"`
}

// Owner follows the DaemonSet that runs the installer's pods, so that
// when a pod ends the installer knows whether the DaemonSet went with it
// (helm uninstall, kubectl delete: xdpq's datapath and CNI plugin must
// go too) or stays (a rolling update, a restart, an eviction, a node
// shutdown: they must stay, for the node's pods that receive through them
// and whose CNI DEL, CHECK and STATUS run the plugin).
//
// It watches rather than asks once at the end because of how the end
// comes: helm uninstall deletes the DaemonSet and, in the same breath,
// the Role that lets the pod read it and the service account whose
// token the pod holds. When the pod's turn to stop comes, a question
// would be refused; a watch has already been told.
type Owner struct {
	API       *API
	Namespace string
	Name      string // the DaemonSet
	Log       *slog.Logger

	mu      sync.Mutex // guards gone and seenAny
	gone    bool       // the DaemonSet was deleted or is being deleted
	seenAny bool       // a list has succeeded

	learnt func(gone bool) // tests: called after each list and event
}

func (o *Owner) path() string {
	return "/apis/apps/v1/namespaces/" + url.PathEscape(o.Namespace) + "/daemonsets"
}

func (o *Owner) set(gone bool) {
	o.mu.Lock()
	o.gone, o.seenAny = gone, true
	o.mu.Unlock()
	if o.learnt != nil {
		o.learnt(gone)
	}
}

// Run lists and watches the DaemonSet until ctx is done, listing again
// whenever a watch ends and backing off (1 s doubling to 30 s) while the
// API server cannot be reached.
func (o *Owner) Run(ctx context.Context) {
	const maxBackoff = 30 * time.Second
	backoff := time.Second
	for ctx.Err() == nil {
		listed, err := o.listAndWatch(ctx)
		if ctx.Err() != nil {
			return
		}
		if listed {
			backoff = time.Second
		}
		if err == nil {
			continue // the watch ended as watches do: list again
		}
		o.Log.Warn("watching the DaemonSet failed; retrying", "daemonset", o.Namespace+"/"+o.Name, "error", err, "retry_in", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// listAndWatch lists the DaemonSet by name, then watches it from the
// list's resource version until the watch ends. listed says whether the
// list succeeded.
func (o *Owner) listAndWatch(ctx context.Context) (listed bool, err error) {
	q := url.Values{"fieldSelector": {"metadata.name=" + o.Name}}
	resp, err := o.API.get(ctx, o.path(), q)
	if err != nil {
		return false, fmt.Errorf("list: %w", err)
	}
	var list struct {
		Metadata objectMeta `json:"metadata"`
		Items    []object   `json:"items"`
	}
	err = decodeOK(resp, &list)
	if err != nil {
		return false, fmt.Errorf("list: %w", err)
	}
	o.set(len(list.Items) == 0 || list.Items[0].Metadata.DeletionTimestamp != nil)

	q.Set("watch", "true")
	q.Set("resourceVersion", list.Metadata.ResourceVersion)
	q.Set("allowWatchBookmarks", "true")
	q.Set("timeoutSeconds", "300")
	resp, err = o.API.get(ctx, o.path(), q)
	if err != nil {
		return true, fmt.Errorf("watch: %w", err)
	}
	defer func() { _ = resp.Body.Close() }() // read, or abandoned with ctx: nothing to lose
	if resp.StatusCode != http.StatusOK {
		return true, fmt.Errorf("watch: %w", statusError(resp))
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var ev struct {
			Type   string          `json:"type"`
			Object json.RawMessage `json:"object"`
		}
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) || ctx.Err() != nil {
				return true, nil
			}
			return true, fmt.Errorf("watch: %w", err)
		}
		switch ev.Type {
		case "ADDED", "MODIFIED":
			var obj object
			if err := json.Unmarshal(ev.Object, &obj); err != nil {
				return true, fmt.Errorf("watch: %s event: %w", ev.Type, err)
			}
			o.set(obj.Metadata.DeletionTimestamp != nil)
		case "DELETED":
			o.set(true)
		case "ERROR": // a Status, e.g. 410 Gone: the resource version is too old
			var st struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if err := json.Unmarshal(ev.Object, &st); err != nil {
				return true, fmt.Errorf("watch: ERROR event: %w", err)
			}
			return true, fmt.Errorf("watch: %d %s", st.Code, st.Message)
		}
	}
}

// decodeOK decodes a 200 response's JSON body into v and closes it.
func decodeOK(resp *http.Response, v any) error {
	defer func() { _ = resp.Body.Close() }() // read, or its status is the answer
	if resp.StatusCode != http.StatusOK {
		return statusError(resp)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// Uninstalling reports whether the DaemonSet is gone or being deleted,
// and why it thinks so. What the watch saw decides; when it saw nothing
// (the API server was away the whole time) the DaemonSet is asked for
// once. Whatever is not known counts as staying: what xdpq leaves behind
// an operator can remove; what is taken from under a running xdpq (its
// pods' traffic, the CNI calls of the node's pods) is lost until a new
// xdpq pod puts it back.
func (o *Owner) Uninstalling(ctx context.Context) (bool, string) {
	o.mu.Lock()
	gone, seen := o.gone, o.seenAny
	o.mu.Unlock()
	ds := o.Namespace + "/" + o.Name
	if seen && gone {
		return true, "DaemonSet " + ds + " was deleted"
	}
	if seen {
		return false, "DaemonSet " + ds + " remains (a restart or an update of its pods)"
	}
	resp, err := o.API.get(ctx, o.path()+"/"+url.PathEscape(o.Name), nil)
	if err != nil {
		return false, fmt.Sprintf("DaemonSet %s could not be asked for (%v): taken as staying", ds, err)
	}
	if resp.StatusCode == http.StatusNotFound {
		_ = resp.Body.Close() // the status is the answer
		return true, "DaemonSet " + ds + " does not exist"
	}
	var obj object
	if err := decodeOK(resp, &obj); err != nil {
		return false, fmt.Sprintf("DaemonSet %s could not be asked for (%v): taken as staying", ds, err)
	}
	if obj.Metadata.DeletionTimestamp != nil {
		return true, "DaemonSet " + ds + " is being deleted"
	}
	return false, "DaemonSet " + ds + " remains (a restart or an update of its pods)"
}

// Follow follows the DaemonSet until ctx is done (the container's
// SIGTERM), then says whether it is being uninstalled and why (see
// Uninstalling); final bounds the last question to the API server, if
// one is needed.
func (o *Owner) Follow(ctx context.Context, final time.Duration) (bool, string) {
	o.Run(ctx)
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), final)
	defer cancel()
	return o.Uninstalling(fctx)
}
