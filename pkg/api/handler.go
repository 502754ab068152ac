package api

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/xdpq/xdpq"
)

// Backend is what the local API serves; the daemon implements it. Each
// call gets a context that ends after [RequestTimeout], when the client
// goes away, or when [Serve] stops. An error chooses its status code by
// the sentinel it wraps ([ErrNotFound], [ErrConflict], [ErrInvalid],
// [ErrNotSupported], [ErrUnavailable]); an error wrapping none is a 500.
// Its message goes to the client as it is: it should say what failed and
// what to do. A nil answer with a nil error is a bug, answered 500.
type Backend interface {
	// Status reports pools, netdevs and how many allocations and
	// attachments there are.
	Status(ctx context.Context) (*Status, error)
	// Allocations lists the allocations of pool ("" for every pool) and
	// their attachments; a pool it does not know is an ErrNotFound that
	// names the pools it does.
	Allocations(ctx context.Context, pool string) (*AllocationList, error)
	// Alloc allocates queues of a pool (a standalone daemon).
	Alloc(ctx context.Context, req AllocRequest) (*Allocation, error)
	// Free ends an allocation and its attachments.
	Free(ctx context.Context, id string) error
	// CNIAdd makes an attachment.
	CNIAdd(ctx context.Context, req CNIAddRequest) (*Attachment, error)
	// CNIDel ends an attachment; one it does not know is no error.
	CNIDel(ctx context.Context, ref AttachmentRef) error
	// CNICheck reports an attachment, or why it is not sound.
	CNICheck(ctx context.Context, ref AttachmentRef) (*Attachment, error)
	// CNIGC ends the attachments not in req.Valid and returns their
	// "containerID/ifName".
	CNIGC(ctx context.Context, req GCRequest) (removed []string, err error)
}

// MaxBodyBytes is the largest request body the API reads; a larger one is
// answered 413.
const MaxBodyBytes = 1 << 20

// RequestTimeout is how long a [Backend] call may take: its context's
// deadline.
const RequestTimeout = 30 * time.Second

// route is one path of the API.
type route struct {
	method string
	// query are the query parameters it takes, each at most once; any
	// other is refused before call.
	query []string
	call  func(ctx context.Context, query url.Values, body []byte) (any, error)
}

// handler serves a Backend.
type handler struct {
	log    *slog.Logger
	routes map[string]route
	paths  string // "GET /v1/status, POST /v1/alloc, ...", for a 404's message
	// bufs are the buffers answers are encoded in (*bytes.Buffer): the
	// status of a node of 64 netdevs is ~10 KiB, asked for often, the
	// allocations' list of hundreds of pods tens of KiB, and each buffer
	// grown anew was garbage the collector ran for.
	bufs sync.Pool
}

// NewHandler returns the local API's HTTP handler serving b: GET
// /v1/status, /v1/allocations[?pool=NAME] and /v1/version, POST
// /v1/alloc, /v1/free and /v1/cni/{add,del,check,gc}. It decodes a
// request body strictly (one JSON object of at most [MaxBodyBytes], no
// unknown field, nothing after it), refuses a query parameter its path
// does not take or one given twice, and answers every refusal with an
// [Error] body and the status of its kind: 400, 404, 405 (with Allow),
// 409, 413, 500, 501, 503. It logs refusals to log (nil for none).
func NewHandler(b Backend, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &handler{log: log, routes: map[string]route{
		"/v1/version": {method: http.MethodGet, call: func(context.Context, url.Values, []byte) (any, error) {
			return VersionInfo{API: Version, Release: xdpq.Version()}, nil
		}},
		"/v1/status": {method: http.MethodGet, call: func(ctx context.Context, _ url.Values, _ []byte) (any, error) {
			return answer(b.Status(ctx))
		}},
		"/v1/allocations": {method: http.MethodGet, query: []string{"pool"}, call: func(ctx context.Context, q url.Values, _ []byte) (any, error) {
			pool, asked := q["pool"]
			if asked && pool[0] == "" {
				return nil, &requestError{http.StatusBadRequest, CodeInvalid, "query pool=: empty; name a pool, or leave pool out for every pool"}
			}
			l, err := b.Allocations(ctx, q.Get("pool"))
			if l != nil {
				if l.Allocations == nil {
					l.Allocations = []Allocation{}
				}
				if l.Attachments == nil {
					l.Attachments = []AttachmentStatus{}
				}
			}
			return answer(l, err)
		}},
		"/v1/alloc": {method: http.MethodPost, call: decoded(func(ctx context.Context, req AllocRequest) (any, error) {
			return answer(b.Alloc(ctx, req))
		})},
		"/v1/free": {method: http.MethodPost, call: decoded(func(ctx context.Context, req FreeRequest) (any, error) {
			if err := b.Free(ctx, req.ID); err != nil {
				return nil, err
			}
			return FreeAnswer{Freed: req.ID}, nil
		})},
		"/v1/cni/add": {method: http.MethodPost, call: decoded(func(ctx context.Context, req CNIAddRequest) (any, error) {
			return answer(b.CNIAdd(ctx, req))
		})},
		"/v1/cni/del": {method: http.MethodPost, call: decoded(func(ctx context.Context, req AttachmentRef) (any, error) {
			if err := b.CNIDel(ctx, req); err != nil {
				return nil, err
			}
			return struct{}{}, nil
		})},
		"/v1/cni/check": {method: http.MethodPost, call: decoded(func(ctx context.Context, req AttachmentRef) (any, error) {
			return answer(b.CNICheck(ctx, req))
		})},
		"/v1/cni/gc": {method: http.MethodPost, call: decoded(func(ctx context.Context, req GCRequest) (any, error) {
			removed, err := b.CNIGC(ctx, req)
			if err != nil {
				return nil, err
			}
			if removed == nil {
				removed = []string{}
			}
			return GCAnswer{Removed: removed}, nil
		})},
	}}
	var paths []string
	for p, r := range h.routes {
		paths = append(paths, r.method+" "+p)
	}
	slices.Sort(paths)
	h.paths = strings.Join(paths, ", ")
	return h
}

// answer turns a Backend's pointer answer into the handler's, refusing
// a nil one without an error.
func answer[T any](v *T, err error) (any, error) {
	if err != nil {
		return nil, err
	}
	if v == nil {
		return nil, errors.New("the daemon's backend returned neither an answer nor an error")
	}
	return v, nil
}

// decoded makes a route's call of f, decoding its request from the body.
func decoded[T any](f func(context.Context, T) (any, error)) func(context.Context, url.Values, []byte) (any, error) {
	return func(ctx context.Context, _ url.Values, body []byte) (any, error) {
		var req T
		if err := decodeRequest(body, &req); err != nil {
			return nil, err
		}
		return f(ctx, req)
	}
}

// requestError is a refusal of the request itself, before the backend.
type requestError struct {
	status int
	code   string
	msg    string
}

func (e *requestError) Error() string { return e.msg }

// decodeRequest decodes body into v strictly: one JSON object, no field v
// does not have, nothing but white space after it.
func decodeRequest(body []byte, v any) error {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	switch {
	case len(trimmed) == 0:
		return &requestError{http.StatusBadRequest, CodeInvalid, "bad request body: empty; want a JSON object"}
	case trimmed[0] != '{':
		return &requestError{http.StatusBadRequest, CodeInvalid, "bad request body: not a JSON object"}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return &requestError{http.StatusBadRequest, CodeInvalid, "bad request body: the JSON object is cut short"}
		}
		return &requestError{http.StatusBadRequest, CodeInvalid, "bad request body: " + err.Error()}
	}
	if off := dec.InputOffset(); len(bytes.TrimLeft(body[off:], " \t\r\n")) != 0 {
		return &requestError{http.StatusBadRequest, CodeInvalid,
			fmt.Sprintf("bad request body: data after the JSON object (at byte %d); send one object", off)}
	}
	return nil
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rt, ok := h.routes[r.URL.Path]
	switch {
	case !ok:
		h.refuse(w, r, http.StatusNotFound, CodeUnknownPath,
			fmt.Sprintf("no API path %s; this daemon speaks API version %d: %s", r.URL.Path, Version, h.paths))
		return
	case r.Method != rt.method:
		w.Header().Set("Allow", rt.method)
		h.refuse(w, r, http.StatusMethodNotAllowed, CodeMethodNotAllowed,
			fmt.Sprintf("%s %s: method not allowed; %s takes %s", r.Method, r.URL.Path, r.URL.Path, rt.method))
		return
	}
	query, err := parseQuery(r.URL, rt.query)
	if err != nil {
		h.refuse(w, r, http.StatusBadRequest, CodeInvalid, err.Error())
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			h.refuse(w, r, http.StatusRequestEntityTooLarge, CodeTooLarge,
				fmt.Sprintf("request body over the limit of %d bytes (1 MiB)", MaxBodyBytes))
			return
		}
		h.refuse(w, r, http.StatusBadRequest, CodeInvalid, "read request body: "+err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), RequestTimeout)
	defer cancel()
	v, err := h.call(ctx, rt, query, body)
	if err != nil {
		var re *requestError
		if errors.As(err, &re) {
			h.refuse(w, r, re.status, re.code, re.msg)
			return
		}
		status, code := classify(err)
		msg := err.Error()
		if code == CodeUnavailable && ctx.Err() != nil && !errors.Is(err, ErrUnavailable) {
			// The request's own context ended: say which way. (A client
			// gone away reads nothing; the daemon stopping is the case a
			// client sees.)
			msg = "the xdpq daemon is stopping: " + msg
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				msg = fmt.Sprintf("the xdpq daemon gave up after %v: %s", RequestTimeout, err)
			}
		}
		h.refuse(w, r, status, code, msg)
		return
	}
	buf, _ := h.bufs.Get().(*bytes.Buffer)
	if buf == nil {
		buf = new(bytes.Buffer)
	}
	defer func() {
		if buf.Cap() <= maxPooledAnswer {
			buf.Reset()
			h.bufs.Put(buf)
		}
	}()
	if err := json.NewEncoder(buf).Encode(v); err != nil { // the line ends the answer
		h.refuse(w, r, http.StatusInternalServerError, CodeInternal, "encode the answer: "+err.Error())
		return
	}
	h.log.Debug("local api", "method", r.Method, "path", r.URL.Path, "status", http.StatusOK, "took", time.Since(start))
	writeLine(w, http.StatusOK, buf.Bytes())
}

// maxPooledAnswer is the largest buffer kept for the next answer.
const maxPooledAnswer = 1 << 20

// call calls the route, turning a panic of the backend into an error: the
// client gets a 500 instead of a closed connection, the log the stack.
func (h *handler) call(ctx context.Context, rt route, query url.Values, body []byte) (v any, err error) {
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			h.log.Error("local api: backend panicked", "panic", p, "stack", string(debug.Stack()))
			v, err = nil, fmt.Errorf("the xdpq daemon failed: panic: %v", p)
		}
	}()
	return rt.call(ctx, query, body)
}

// parseQuery parses u's query strictly: well formed, and each parameter
// one of takes, given once.
func parseQuery(u *url.URL, takes []string) (url.Values, error) {
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("bad query %q: %v", u.RawQuery, err)
	}
	for _, k := range slices.Sorted(maps.Keys(q)) {
		if !slices.Contains(takes, k) {
			return nil, fmt.Errorf("query parameter %q: %s takes %s", k, u.Path, cmp.Or(strings.Join(takes, ", "), "none"))
		}
		if len(q[k]) > 1 {
			return nil, fmt.Errorf("query parameter %q given %d times; give it once", k, len(q[k]))
		}
	}
	return q, nil
}

// refuse answers with an Error body and logs the refusal: a daemon's
// failure as an error, a refusal it may lift as a warning, the client's
// mistake at info.
func (h *handler) refuse(w http.ResponseWriter, r *http.Request, status int, code, msg string) {
	level := slog.LevelInfo
	switch {
	case status == http.StatusInternalServerError:
		level = slog.LevelError
	case status >= 500:
		level = slog.LevelWarn
	}
	h.log.Log(r.Context(), level, "local api refused a request", "method", r.Method, "path", r.URL.Path,
		"status", status, "code", code, "error", msg)
	buf, _ := json.Marshal(Error{Error: msg, Code: code}) // two strings: cannot fail
	write(w, status, buf)
}

func write(w http.ResponseWriter, status int, body []byte) {
	writeLine(w, status, append(body, '\n'))
}

// writeLine writes an answer that ends in its newline.
func writeLine(w http.ResponseWriter, status int, line []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(line)))
	w.WriteHeader(status)
	w.Write(line)
}
