package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/xdpq/xdpq/pkg/api"
)

// DefaultAPISocket is where the daemon serves its local API.
const DefaultAPISocket = api.DefaultSocket

// serveAPI serves the local API (both modes) on a Unix socket only root
// may use: GET /v1/status; POST /v1/alloc and /v1/free (allocations
// without kubelet); POST /v1/cni/{add,del,check,gc} for the CNI plugin.
// docs/protocol.md lists them.
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
			v = api.Error{Error: err.Error()}
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
		var req api.AllocRequest
		if err := decode(r, &req); err != nil {
			reply(w, nil, err)
			return
		}
		a, err := d.Alloc(req.Pool, req.Count, req.UID)
		reply(w, a, err)
	})
	mux.HandleFunc("POST /v1/free", func(w http.ResponseWriter, r *http.Request) {
		var req api.FreeRequest
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
		var req api.CNIAddRequest
		if err := decode(r, &req); err != nil {
			reply(w, nil, err)
			return
		}
		a, err := d.CNIAdd(req)
		reply(w, a, err)
	})
	mux.HandleFunc("POST /v1/cni/del", func(w http.ResponseWriter, r *http.Request) {
		var req api.AttachmentRef
		if err := decode(r, &req); err != nil {
			reply(w, nil, err)
			return
		}
		reply(w, map[string]string{}, d.CNIDel(req.ContainerID, req.IfName))
	})
	mux.HandleFunc("POST /v1/cni/check", func(w http.ResponseWriter, r *http.Request) {
		var req api.AttachmentRef
		if err := decode(r, &req); err != nil {
			reply(w, nil, err)
			return
		}
		a, err := d.CNICheck(req.ContainerID, req.IfName)
		reply(w, a, err)
	})
	mux.HandleFunc("POST /v1/cni/gc", func(w http.ResponseWriter, r *http.Request) {
		var req api.GCRequest
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
