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

// listenAPI listens on the local API's socket, only root may use it.
func listenAPI(path string) (net.Listener, error) {
	if st, err := os.Lstat(path); err == nil {
		if st.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("local api: %s exists and is not a socket; remove it or choose another --api-socket", path)
		}
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("local api: another xdpq daemon serves %s", path)
		}
		os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("local api: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("local api: %w", err)
	}
	return ln, nil
}

// serveAPI serves the local API until ctx ends.
func (d *Daemon) serveAPI(ctx context.Context) error {
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, v any, err error) {
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			code := http.StatusInternalServerError
			switch {
			case errors.Is(err, api.ErrNotFound):
				code = http.StatusNotFound
			case errors.Is(err, api.ErrConflict):
				code = http.StatusConflict
			case errors.Is(err, api.ErrInvalid):
				code = http.StatusBadRequest
			case errors.Is(err, api.ErrUnavailable):
				code = http.StatusServiceUnavailable
			}
			w.WriteHeader(code)
			v = api.Error{Error: err.Error()}
		}
		json.NewEncoder(w).Encode(v)
	}
	decode := func(r *http.Request, v any) error {
		dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(v); err != nil {
			return fmt.Errorf("bad request body: %w: %w", err, api.ErrInvalid)
		}
		return nil
	}
	handle := func(pattern string, f func(r *http.Request) (any, error)) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			v, err := f(r)
			reply(w, v, err)
		})
	}
	handle("POST /v1/alloc", func(r *http.Request) (any, error) {
		var req api.AllocRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return d.Alloc(r.Context(), req)
	})
	handle("POST /v1/free", func(r *http.Request) (any, error) {
		var req api.FreeRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return map[string]string{"freed": req.ID}, d.Free(r.Context(), req.ID)
	})
	handle("GET /v1/status", func(r *http.Request) (any, error) { return d.Status(r.Context()), nil })
	handle("POST /v1/cni/add", func(r *http.Request) (any, error) {
		var req api.CNIAddRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return d.CNIAdd(r.Context(), req)
	})
	handle("POST /v1/cni/del", func(r *http.Request) (any, error) {
		var req api.AttachmentRef
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return map[string]string{}, d.CNIDel(r.Context(), req)
	})
	handle("POST /v1/cni/check", func(r *http.Request) (any, error) {
		var req api.AttachmentRef
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return d.CNICheck(r.Context(), req)
	})
	handle("POST /v1/cni/gc", func(r *http.Request) (any, error) {
		var req api.GCRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		removed, err := d.CNIGC(r.Context(), req)
		return map[string][]string{"removed": removed}, err
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	if err := srv.Serve(d.apiLn); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
