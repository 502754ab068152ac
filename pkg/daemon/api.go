package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"
)

// DefaultAPISocket is where the standalone daemon serves its local API.
const DefaultAPISocket = "/run/xdpq/xdpq-api.sock"

type allocRequest struct {
	Pool  string `json:"pool"`
	Count int    `json:"count"`
	UID   uint32 `json:"uid"`
}

type freeRequest struct {
	ID string `json:"id"`
}

type attachmentRef struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
}

type gcRequest struct {
	Valid []string `json:"valid"` // "containerID/ifName"
}

type apiError struct {
	Error string `json:"error"`
}

// serveAPI serves the local API (standalone mode) on a Unix socket only
// root may use: POST /v1/alloc, POST /v1/free, GET /v1/status.
func (d *Daemon) serveAPI(ctx context.Context) error {
	path := d.opts.APISocket
	if path == "" {
		path = DefaultAPISocket
	}
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("local api: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return err
	}
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, v any, err error) {
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			v = apiError{err.Error()}
		}
		json.NewEncoder(w).Encode(v)
	}
	decode := func(r *http.Request, v any) error {
		dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(v); err != nil {
			return fmt.Errorf("bad request body: %w", err)
		}
		return nil
	}
	mux.HandleFunc("POST /v1/alloc", func(w http.ResponseWriter, r *http.Request) {
		if !d.opts.Standalone {
			reply(w, nil, errors.New("allocations come from kubelet here; xdpqctl alloc is for a standalone daemon"))
			return
		}
		var req allocRequest
		if err := decode(r, &req); err != nil {
			reply(w, nil, err)
			return
		}
		a, err := d.Alloc(req.Pool, req.Count, req.UID)
		reply(w, a, err)
	})
	mux.HandleFunc("POST /v1/free", func(w http.ResponseWriter, r *http.Request) {
		var req freeRequest
		if err := decode(r, &req); err != nil {
			reply(w, nil, err)
			return
		}
		reply(w, map[string]string{"freed": req.ID}, d.Free(req.ID))
	})
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		reply(w, d.Status(), nil)
	})
	mux.HandleFunc("POST /v1/cni/add", func(w http.ResponseWriter, r *http.Request) {
		var req CNIAddRequest
		if err := decode(r, &req); err != nil {
			reply(w, nil, err)
			return
		}
		a, err := d.CNIAdd(req)
		reply(w, a, err)
	})
	mux.HandleFunc("POST /v1/cni/del", func(w http.ResponseWriter, r *http.Request) {
		var req attachmentRef
		if err := decode(r, &req); err != nil {
			reply(w, nil, err)
			return
		}
		reply(w, map[string]string{}, d.CNIDel(req.ContainerID, req.IfName))
	})
	mux.HandleFunc("POST /v1/cni/check", func(w http.ResponseWriter, r *http.Request) {
		var req attachmentRef
		if err := decode(r, &req); err != nil {
			reply(w, nil, err)
			return
		}
		a, err := d.CNICheck(req.ContainerID, req.IfName)
		reply(w, a, err)
	})
	mux.HandleFunc("POST /v1/cni/gc", func(w http.ResponseWriter, r *http.Request) {
		var req gcRequest
		if err := decode(r, &req); err != nil {
			reply(w, nil, err)
			return
		}
		reply(w, map[string][]string{"removed": d.CNIGC(req.Valid)}, nil)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	d.log.Info("local api serving", "socket", path)
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	os.Remove(path)
	return nil
}

// APIClient talks to a standalone daemon's local API.
type APIClient struct {
	http *http.Client
}

// NewAPIClient returns a client of the API at socket ("" for the default).
func NewAPIClient(socket string) *APIClient {
	if socket == "" {
		socket = DefaultAPISocket
	}
	return &APIClient{http: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		}}}}
}

func (c *APIClient) call(method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://xdpq"+path, body)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("xdpq daemon: %w (is it running in standalone mode?)", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e apiError
		json.NewDecoder(resp.Body).Decode(&e)
		return errors.New(e.Error)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// Alloc asks for count queues of pool for uid.
func (c *APIClient) Alloc(pool string, count int, uid uint32) (*Allocation, error) {
	var a Allocation
	err := c.call("POST", "/v1/alloc", allocRequest{pool, count, uid}, &a)
	return &a, err
}

// Free ends an allocation.
func (c *APIClient) Free(id string) error {
	var out map[string]string
	return c.call("POST", "/v1/free", freeRequest{id}, &out)
}

// CNIAdd makes an attachment.
func (c *APIClient) CNIAdd(req CNIAddRequest) (*Attachment, error) {
	var a Attachment
	err := c.call("POST", "/v1/cni/add", req, &a)
	return &a, err
}

// CNIDel removes an attachment (none is no error).
func (c *APIClient) CNIDel(containerID, ifName string) error {
	var out map[string]string
	return c.call("POST", "/v1/cni/del", attachmentRef{containerID, ifName}, &out)
}

// CNICheck verifies an attachment.
func (c *APIClient) CNICheck(containerID, ifName string) (*Attachment, error) {
	var a Attachment
	err := c.call("POST", "/v1/cni/check", attachmentRef{containerID, ifName}, &a)
	return &a, err
}

// CNIGC removes the attachments not in valid ("containerID/ifName").
func (c *APIClient) CNIGC(valid []string) ([]string, error) {
	var out map[string][]string
	err := c.call("POST", "/v1/cni/gc", gcRequest{valid}, &out)
	return out["removed"], err
}

// Status reports the daemon's state.
func (c *APIClient) Status() (*Status, error) {
	var s Status
	err := c.call("GET", "/v1/status", nil, &s)
	return &s, err
}
