package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xdpq/xdpq"
	"github.com/xdpq/xdpq/internal/testing/testnet"
)

func TestMain(m *testing.M) { os.Exit(testnet.MainWithLeakCheck(m)) }

// fakeBackend answers every Backend method through one function of the
// method's name and request; it records the calls.
type fakeBackend struct {
	fn    func(ctx context.Context, op string, req any) (any, error)
	mu    sync.Mutex
	calls []call
}

type call struct {
	op  string
	req any
	ctx context.Context
}

var _ Backend = (*fakeBackend)(nil)

func (f *fakeBackend) do(ctx context.Context, op string, req any) (any, error) {
	f.mu.Lock()
	f.calls = append(f.calls, call{op, req, ctx})
	f.mu.Unlock()
	if f.fn == nil {
		return nil, fmt.Errorf("fake backend: no answer for %s", op)
	}
	return f.fn(ctx, op, req)
}

func (f *fakeBackend) called() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]call(nil), f.calls...)
}

func (f *fakeBackend) Status(ctx context.Context) (*Status, error) {
	v, err := f.do(ctx, "Status", nil)
	s, _ := v.(*Status)
	return s, err
}

func (f *fakeBackend) Allocations(ctx context.Context, pool string) (*AllocationList, error) {
	v, err := f.do(ctx, "Allocations", pool)
	l, _ := v.(*AllocationList)
	return l, err
}

func (f *fakeBackend) Alloc(ctx context.Context, req AllocRequest) (*Allocation, error) {
	v, err := f.do(ctx, "Alloc", req)
	a, _ := v.(*Allocation)
	return a, err
}

func (f *fakeBackend) Free(ctx context.Context, id string) error {
	_, err := f.do(ctx, "Free", id)
	return err
}

func (f *fakeBackend) CNIAdd(ctx context.Context, req CNIAddRequest) (*Attachment, error) {
	v, err := f.do(ctx, "CNIAdd", req)
	a, _ := v.(*Attachment)
	return a, err
}

func (f *fakeBackend) CNIDel(ctx context.Context, ref AttachmentRef) error {
	_, err := f.do(ctx, "CNIDel", ref)
	return err
}

func (f *fakeBackend) CNICheck(ctx context.Context, ref AttachmentRef) (*Attachment, error) {
	v, err := f.do(ctx, "CNICheck", ref)
	a, _ := v.(*Attachment)
	return a, err
}

func (f *fakeBackend) CNIGC(ctx context.Context, req GCRequest) ([]string, error) {
	v, err := f.do(ctx, "CNIGC", req)
	r, _ := v.([]string)
	return r, err
}

// answers is a backend answering every method with a fixed value.
func answers() func(context.Context, string, any) (any, error) {
	return func(_ context.Context, op string, req any) (any, error) {
		switch op {
		case "Status":
			return &Status{Pools: []PoolStatus{{Name: "p", Resource: "xdpq.io/p", Queues: 4, Free: 2, Allocations: 1}}, Allocations: 1}, nil
		case "Allocations":
			if pool := req.(string); pool != "" && pool != "p" {
				return nil, Errorf(ErrNotFound, "no pool %q (pools: p)", pool)
			}
			return &AllocationList{Allocations: []Allocation{{ID: "p-1", Pool: "p", Netdev: "eth1", Queues: []uint32{2, 3}}}}, nil
		case "Alloc":
			return &Allocation{ID: "p-1", Pool: "p", Netdev: "eth1", Queues: []uint32{2, 3}}, nil
		case "CNIAdd", "CNICheck":
			return &Attachment{AllocationID: "p-1", Netdev: "eth1", Queues: []uint32{2}, Mode: ModeQueue}, nil
		case "CNIGC":
			return []string{"c1/net1"}, nil
		}
		return nil, nil
	}
}

// failing is a backend failing every method with err.
func failing(err error) func(context.Context, string, any) (any, error) {
	return func(context.Context, string, any) (any, error) { return nil, err }
}

// serve runs one request through a handler of b and returns the answer.
func serve(t *testing.T, b Backend, method, path, body string) *httptest.ResponseRecorder {
	t.Helper()
	var r *http.Request
	if body == "" {
		r = httptest.NewRequest(method, path, nil)
	} else {
		r = httptest.NewRequest(method, path, strings.NewReader(body))
	}
	w := httptest.NewRecorder()
	NewHandler(b, nil).ServeHTTP(w, r)
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q", method, path, ct)
	}
	return w
}

// refusal decodes a refusal's body strictly and checks it has a message.
func refusal(t *testing.T, w *httptest.ResponseRecorder) Error {
	t.Helper()
	var e Error
	dec := json.NewDecoder(w.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		t.Fatalf("refusal body %q: %v", w.Body, err)
	}
	if e.Error == "" || e.Code == "" {
		t.Fatalf("refusal without message or code: %+v", e)
	}
	return e
}

func TestHandlerRoutes(t *testing.T) {
	tests := []struct {
		method, path, body string
		op                 string // the backend call expected, "" for none
		req                any    // what it is asked
		answer             string // the answer's body, as JSON
	}{
		{"GET", "/v1/version", "", "", nil, `{"api":2,"release":"` + xdpq.Version() + `"}`},
		{"GET", "/v1/status", "", "Status", nil, `{"pools":[{"name":"p","resource":"xdpq.io/p","queues":4,"free":2,"allocations":1}],"allocations":1,"attachments":0,"netdevs":null}`},
		{"GET", "/v1/allocations", "", "Allocations", "",
			`{"allocations":[{"id":"p-1","pool":"p","netdev":"eth1","queues":[2,3],"socket":"","created":"0001-01-01T00:00:00Z","devices":null}],"attachments":[]}`},
		{"GET", "/v1/allocations?pool=p", "", "Allocations", "p",
			`{"allocations":[{"id":"p-1","pool":"p","netdev":"eth1","queues":[2,3],"socket":"","created":"0001-01-01T00:00:00Z","devices":null}],"attachments":[]}`},
		// A GET's body is read (a body over the limit is a 413) and
		// ignored, as ever: it is not the query.
		{"GET", "/v1/allocations", `{"pool":"q"}`, "Allocations", "",
			`{"allocations":[{"id":"p-1","pool":"p","netdev":"eth1","queues":[2,3],"socket":"","created":"0001-01-01T00:00:00Z","devices":null}],"attachments":[]}`},
		{"POST", "/v1/alloc", `{"pool":"p","count":2,"uid":1000}`, "Alloc", AllocRequest{Pool: "p", Count: 2, UID: 1000},
			`{"id":"p-1","pool":"p","netdev":"eth1","queues":[2,3],"socket":"","created":"0001-01-01T00:00:00Z","devices":null}`},
		{"POST", "/v1/free", `{"id":"p-1"}`, "Free", "p-1", `{"freed":"p-1"}`},
		{"POST", "/v1/cni/add", `{"containerID":"c1","ifName":"net1","allocation":"p-1","flows":[{"protocol":"udp","dst":"10.0.0.1/32","dstPort":2152}]}`,
			"CNIAdd", CNIAddRequest{ContainerID: "c1", IfName: "net1", Allocation: "p-1",
				Flows: []CNIFlow{{Protocol: "udp", Dst: netip.MustParsePrefix("10.0.0.1/32"), DstPort: 2152}}},
			`{"containerID":"","ifName":"","allocationID":"p-1","netdev":"eth1","queues":[2],"mode":"queue"}`},
		{"POST", "/v1/cni/del", `{"containerID":"c1","ifName":"net1"}`, "CNIDel", AttachmentRef{"c1", "net1"}, `{}`},
		{"POST", "/v1/cni/check", " \n{\"containerID\":\"c1\",\"ifName\":\"net1\"}\n\t ", "CNICheck", AttachmentRef{"c1", "net1"},
			`{"containerID":"","ifName":"","allocationID":"p-1","netdev":"eth1","queues":[2],"mode":"queue"}`},
		{"POST", "/v1/cni/gc", `{"valid":["c2/net1"]}`, "CNIGC", GCRequest{Valid: []string{"c2/net1"}}, `{"removed":["c1/net1"]}`},
	}
	for _, tt := range tests {
		t.Run(tt.method+tt.path+tt.body, func(t *testing.T) {
			b := &fakeBackend{fn: answers()}
			start := time.Now()
			w := serve(t, b, tt.method, tt.path, tt.body)
			end := time.Now()
			if w.Code != http.StatusOK {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			if got := strings.TrimSpace(w.Body.String()); got != tt.answer {
				t.Errorf("answer\n got %s\nwant %s", got, tt.answer)
			}
			calls := b.called()
			if tt.op == "" {
				if len(calls) != 0 {
					t.Fatalf("backend called: %+v", calls)
				}
				return
			}
			if len(calls) != 1 || calls[0].op != tt.op || !reflect.DeepEqual(calls[0].req, tt.req) {
				t.Fatalf("backend calls %+v, want one %s(%+v)", calls, tt.op, tt.req)
			}
			if dl, ok := calls[0].ctx.Deadline(); !ok || dl.Before(start.Add(RequestTimeout)) || dl.After(end.Add(RequestTimeout)) {
				t.Errorf("backend context deadline %v (%v after the request), want %v", dl, dl.Sub(start), RequestTimeout)
			}
		})
	}
}

// TestHandlerGCNoneRemoved: GC that removes nothing answers an empty
// list, not null.
func TestHandlerGCNoneRemoved(t *testing.T) {
	b := &fakeBackend{fn: func(context.Context, string, any) (any, error) { return nil, nil }}
	w := serve(t, b, "POST", "/v1/cni/gc", `{"valid":[]}`)
	if got := strings.TrimSpace(w.Body.String()); w.Code != 200 || got != `{"removed":[]}` {
		t.Fatalf("%d %s", w.Code, got)
	}
}

// TestHandlerAllocations: a pool the backend does not know is its 404,
// naming the pools it knows; no allocation is an empty list, not null.
func TestHandlerAllocations(t *testing.T) {
	b := &fakeBackend{fn: answers()}
	w := serve(t, b, "GET", "/v1/allocations?pool=nope", "")
	if e := refusal(t, w); w.Code != 404 || e.Code != CodeNotFound || e.Error != `no pool "nope" (pools: p)` {
		t.Errorf("unknown pool: %d %+v", w.Code, e)
	}
	if calls := b.called(); len(calls) != 1 || calls[0].op != "Allocations" || calls[0].req != "nope" {
		t.Errorf("backend calls %+v", calls)
	}
	w = serve(t, &fakeBackend{fn: func(context.Context, string, any) (any, error) { return &AllocationList{}, nil }}, "GET", "/v1/allocations?pool=p", "")
	if got := strings.TrimSpace(w.Body.String()); w.Code != 200 || got != `{"allocations":[],"attachments":[]}` {
		t.Errorf("no allocations: %d %s", w.Code, got)
	}
	// A name that needs escaping reaches the backend as it was named.
	b = &fakeBackend{fn: answers()}
	serve(t, b, "GET", "/v1/allocations?"+url.Values{"pool": {"a b&c=d/é"}}.Encode(), "")
	if calls := b.called(); len(calls) != 1 || calls[0].req != "a b&c=d/é" {
		t.Errorf("backend calls %+v", calls)
	}
}

// TestHandlerBackendErrors: each sentinel, wrapped, gives its status and
// code; the backend's message reaches the client as it is.
func TestHandlerBackendErrors(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		status int
		code   string
	}{
		{"not found", fmt.Errorf("no allocation %q: %w", "x", ErrNotFound), 404, CodeNotFound},
		{"conflict", fmt.Errorf("device xa-q2 is in use by allocation p-1: %w", ErrConflict), 409, CodeConflict},
		{"invalid", fmt.Errorf("count 0: %w", ErrInvalid), 400, CodeInvalid},
		{"not supported", fmt.Errorf("allocations come from kubelet here: %w", ErrNotSupported), 501, CodeNotSupported},
		{"unavailable", fmt.Errorf("pool p is blocked: state file unreadable: %w", ErrUnavailable), 503, CodeUnavailable},
		{"joined", errors.Join(errors.New("a"), fmt.Errorf("b: %w", ErrConflict)), 409, CodeConflict},
		{"two sentinels", fmt.Errorf("x: %w, %w", ErrUnavailable, ErrNotFound), 404, CodeNotFound},
		{"deadline", fmt.Errorf("ask kubelet: %w", context.DeadlineExceeded), 503, CodeUnavailable},
		{"other", errors.New("bind xsk eth1/q3: device or resource busy"), 500, CodeInternal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, r := range []struct{ method, path, body string }{
				{"GET", "/v1/status", ""},
				{"GET", "/v1/allocations", ""},
				{"GET", "/v1/allocations?pool=p", ""},
				{"POST", "/v1/alloc", `{"pool":"p","count":1}`},
				{"POST", "/v1/free", `{"id":"x"}`},
				{"POST", "/v1/cni/add", `{"containerID":"c","ifName":"i"}`},
				{"POST", "/v1/cni/del", `{"containerID":"c","ifName":"i"}`},
				{"POST", "/v1/cni/check", `{"containerID":"c","ifName":"i"}`},
				{"POST", "/v1/cni/gc", `{"valid":[]}`},
			} {
				w := serve(t, &fakeBackend{fn: failing(tt.err)}, r.method, r.path, r.body)
				e := refusal(t, w)
				if w.Code != tt.status || e.Code != tt.code || e.Error != tt.err.Error() {
					t.Errorf("%s %s: %d %+v, want %d %s %q", r.method, r.path, w.Code, e, tt.status, tt.code, tt.err)
				}
			}
		})
	}
}

// TestHandlerBackendBugs: a nil answer without error, or a panic, is a
// 500 with a message, not an empty 200 or a closed connection.
func TestHandlerBackendBugs(t *testing.T) {
	w := serve(t, &fakeBackend{fn: func(context.Context, string, any) (any, error) { return nil, nil }}, "GET", "/v1/status", "")
	if e := refusal(t, w); w.Code != 500 || !strings.Contains(e.Error, "neither an answer nor an error") {
		t.Errorf("nil answer: %d %+v", w.Code, e)
	}
	w = serve(t, &fakeBackend{fn: func(context.Context, string, any) (any, error) { panic("boom") }}, "POST", "/v1/cni/add", `{}`)
	if e := refusal(t, w); w.Code != 500 || e.Code != CodeInternal || !strings.Contains(e.Error, "panic: boom") {
		t.Errorf("panic: %d %+v", w.Code, e)
	}
}

// TestHandlerRequestErrors: what is refused before the backend is called.
func TestHandlerRequestErrors(t *testing.T) {
	big := `{"pool":"` + strings.Repeat("a", MaxBodyBytes) + `"}`
	atLimit := `{"pool":"p"}` + strings.Repeat(" ", MaxBodyBytes-len(`{"pool":"p"}`))
	tests := []struct {
		name, method, path, body string
		status                   int
		code                     string
		says                     string
	}{
		{"unknown field", "POST", "/v1/alloc", `{"pool":"p","bogus":1}`, 400, CodeInvalid, `unknown field "bogus"`},
		{"unknown nested field", "POST", "/v1/cni/add", `{"flows":[{"protocol":"udp","port":1}]}`, 400, CodeInvalid, `unknown field "port"`},
		{"trailing object", "POST", "/v1/alloc", `{"pool":"p"}{"pool":"q"}`, 400, CodeInvalid, "data after the JSON object (at byte 12)"},
		{"trailing garbage", "POST", "/v1/free", "{\"id\":\"x\"}\n rm -rf", 400, CodeInvalid, "data after the JSON object"},
		{"trailing NUL", "POST", "/v1/free", "{\"id\":\"x\"}\x00", 400, CodeInvalid, "data after the JSON object"},
		{"empty", "POST", "/v1/cni/del", "", 400, CodeInvalid, "empty"},
		{"white space", "POST", "/v1/cni/del", " \n", 400, CodeInvalid, "empty"},
		{"null", "POST", "/v1/cni/del", "null", 400, CodeInvalid, "not a JSON object"},
		{"array", "POST", "/v1/cni/gc", `["c/i"]`, 400, CodeInvalid, "not a JSON object"},
		{"string", "POST", "/v1/free", `"p-1"`, 400, CodeInvalid, "not a JSON object"},
		{"cut short", "POST", "/v1/alloc", `{"pool":`, 400, CodeInvalid, "cut short"},
		{"bad syntax", "POST", "/v1/alloc", `{"pool" "p"}`, 400, CodeInvalid, "invalid character"},
		{"wrong type", "POST", "/v1/alloc", `{"count":"2"}`, 400, CodeInvalid, "AllocRequest.count of type int"},
		{"negative uid", "POST", "/v1/alloc", `{"uid":-1}`, 400, CodeInvalid, "uint32"},
		{"bad prefix", "POST", "/v1/cni/add", `{"flows":[{"dst":"10.0.0.300/32"}]}`, 400, CodeInvalid, "10.0.0.300"},
		{"over 1 MiB", "POST", "/v1/alloc", big, 413, CodeTooLarge, "over the limit of 1048576 bytes (1 MiB)"},
		{"unknown path", "POST", "/v1/cni/status", `{}`, 404, CodeUnknownPath,
			"no API path /v1/cni/status; this daemon speaks API version 2: GET /v1/allocations, GET /v1/status, GET /v1/version, POST /v1/alloc"},
		{"root", "GET", "/", "", 404, CodeUnknownPath, "no API path /"},
		{"other version", "GET", "/v2/status", "", 404, CodeUnknownPath, "no API path /v2/status"},
		{"trailing slash", "GET", "/v1/status/", "", 404, CodeUnknownPath, "no API path /v1/status/"},
		{"GET a POST", "GET", "/v1/alloc", "", 405, CodeMethodNotAllowed, "GET /v1/alloc: method not allowed; /v1/alloc takes POST"},
		{"POST a GET", "POST", "/v1/status", `{}`, 405, CodeMethodNotAllowed, "/v1/status takes GET"},
		{"DELETE", "DELETE", "/v1/free", "", 405, CodeMethodNotAllowed, "/v1/free takes POST"},
		{"HEAD", "HEAD", "/v1/version", "", 405, CodeMethodNotAllowed, "takes GET"},
		{"POST allocations", "POST", "/v1/allocations", `{"pool":"p"}`, 405, CodeMethodNotAllowed, "POST /v1/allocations: method not allowed; /v1/allocations takes GET"},
		{"DELETE allocations of a pool", "DELETE", "/v1/allocations?pool=p", "", 405, CodeMethodNotAllowed, "/v1/allocations takes GET"},
		{"allocations/", "GET", "/v1/allocations/p", "", 404, CodeUnknownPath, "no API path /v1/allocations/p"},
		{"unknown query parameter", "GET", "/v1/allocations?pol=p", "", 400, CodeInvalid, `query parameter "pol": /v1/allocations takes pool`},
		{"a query parameter too many", "GET", "/v1/allocations?pool=p&netdev=eth1", "", 400, CodeInvalid, `query parameter "netdev": /v1/allocations takes pool`},
		{"pool twice", "GET", "/v1/allocations?pool=p&pool=q", "", 400, CodeInvalid, `query parameter "pool" given 2 times; give it once`},
		{"empty pool", "GET", "/v1/allocations?pool=", "", 400, CodeInvalid, "query pool=: empty; name a pool, or leave pool out for every pool"},
		{"pool without a value", "GET", "/v1/allocations?pool", "", 400, CodeInvalid, "query pool=: empty"},
		{"bad escape", "GET", "/v1/allocations?pool=%zz", "", 400, CodeInvalid, `bad query "pool=%zz": invalid URL escape "%zz"`},
		{"semicolon", "GET", "/v1/allocations?pool=p;x=1", "", 400, CodeInvalid, "bad query"},
		{"query of status", "GET", "/v1/status?pool=p", "", 400, CodeInvalid, `query parameter "pool": /v1/status takes none`},
		{"query of version", "GET", "/v1/version?v=1", "", 400, CodeInvalid, `query parameter "v": /v1/version takes none`},
		{"query of a POST", "POST", "/v1/free?id=p-1", `{"id":"p-1"}`, 400, CodeInvalid, `query parameter "id": /v1/free takes none`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &fakeBackend{fn: answers()}
			w := serve(t, b, tt.method, tt.path, tt.body)
			if w.Code != tt.status {
				t.Fatalf("status %d, want %d: %s", w.Code, tt.status, w.Body)
			}
			if tt.method == "HEAD" {
				return // no body
			}
			e := refusal(t, w)
			if e.Code != tt.code || !strings.Contains(e.Error, tt.says) {
				t.Errorf("refusal %+v, want code %s saying %q", e, tt.code, tt.says)
			}
			if calls := b.called(); len(calls) != 0 {
				t.Errorf("backend called: %+v", calls)
			}
			if tt.status == 405 {
				want := "POST"
				if p, _, _ := strings.Cut(tt.path, "?"); slices.Contains([]string{"/v1/status", "/v1/version", "/v1/allocations"}, p) {
					want = "GET"
				}
				if got := w.Header().Get("Allow"); got != want {
					t.Errorf("Allow %q, want %q", got, want)
				}
			}
		})
	}
	t.Run("exactly 1 MiB", func(t *testing.T) {
		if len(atLimit) != MaxBodyBytes {
			t.Fatal(len(atLimit))
		}
		if w := serve(t, &fakeBackend{fn: answers()}, "POST", "/v1/alloc", atLimit); w.Code != 200 {
			t.Fatalf("%d %s", w.Code, w.Body)
		}
	})
}

// FuzzDecodeRequest feeds request bodies to the richest request. A body is
// accepted only if it is one JSON object, with nothing after it, whose
// fields are all CNIAddRequest's, decoded as encoding/json decodes it;
// anything else is a 400 or a 413 with an Error body and never reaches
// the backend.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"containerID":"c1","ifName":"net1","allocation":"p-1"}`,
		`{"containerID":"c1","ifName":"net1","flows":[{"protocol":"udp","dst":"10.0.0.1/32","dstPort":2152,"vlan":7}],"mtu":1400}`,
		`{"flows":[{"src":"fd00::/64"}]}`,
		`{} `, `{}{}`, `{} x`, `null`, `[]`, `"x"`, `{"a":1}`, `{"mtu":1e400}`, `{"mtu":-1}`,
		`{"containerID":"\u0000"}`, `{"containerid":"c"}`, `{"flows":null}`, "\ufeff{}", `{"netns":"/proc/1/ns/net"`,
	} {
		f.Add([]byte(s))
	}
	known := map[string]bool{}
	for _, typ := range []reflect.Type{reflect.TypeFor[CNIAddRequest]()} {
		for i := range typ.NumField() {
			known[strings.ToLower(strings.Split(typ.Field(i).Tag.Get("json"), ",")[0])] = true
		}
	}
	b := &fakeBackend{fn: answers()}
	h := NewHandler(b, nil)
	f.Fuzz(func(t *testing.T, body []byte) {
		b.calls = nil // inputs run one at a time
		r := httptest.NewRequest("POST", "/v1/cni/add", bytes.NewReader(body))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		calls := b.called()
		if w.Code != http.StatusOK {
			if w.Code != 400 && w.Code != 413 {
				t.Fatalf("status %d for %q", w.Code, body)
			}
			var e Error
			if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error == "" || e.Code == "" {
				t.Fatalf("refusal %q: %v", w.Body, err)
			}
			if len(calls) != 0 {
				t.Fatalf("refused %q but called the backend", body)
			}
			return
		}
		if len(calls) != 1 {
			t.Fatalf("accepted %q with %d backend calls", body, len(calls))
		}
		if !json.Valid(body) || bytes.TrimLeft(body, " \t\r\n")[0] != '{' {
			t.Fatalf("accepted %q: not one JSON object", body)
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(body, &fields); err != nil {
			t.Fatalf("accepted %q: %v", body, err)
		}
		for k := range fields {
			if !known[strings.ToLower(k)] {
				t.Fatalf("accepted %q with unknown field %q", body, k)
			}
		}
		var want CNIAddRequest
		if err := json.Unmarshal(body, &want); err != nil || !reflect.DeepEqual(calls[0].req, want) {
			t.Fatalf("accepted %q as %+v; encoding/json reads %+v (%v)", body, calls[0].req, want, err)
		}
	})
}

// FuzzAllocationsQuery feeds queries to GET /v1/allocations. A query is
// accepted exactly when it parses and names nothing but pool, once, not
// empty (or nothing at all): the backend is then asked for that pool;
// anything else is a 400 with an Error body and never reaches the
// backend.
func FuzzAllocationsQuery(f *testing.F) {
	for _, s := range []string{
		"", "pool=upf", "pool=a%20b", "pool=a+b", "pool=", "pool", "pool=a&pool=b", "pool=a&x=1", "x=1", "&", "pool=a&",
		"pool=%zz", "pool=a;b", "%70ool=upf", "POOL=upf", "pool=%00", "pool=%E2%82", "=", "==", "pool==",
	} {
		f.Add(s)
	}
	b := &fakeBackend{fn: answers()}
	h := NewHandler(b, nil)
	f.Fuzz(func(t *testing.T, raw string) {
		b.calls = nil // inputs run one at a time
		r := httptest.NewRequest("GET", "/v1/allocations", nil)
		r.URL.RawQuery = raw
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		calls := b.called()
		q, err := url.ParseQuery(raw)
		valid := err == nil && (len(q) == 0 || len(q) == 1 && len(q["pool"]) == 1 && q["pool"][0] != "")
		switch {
		case w.Code == http.StatusOK || w.Code == http.StatusNotFound && len(calls) == 1:
			// Accepted: answered, or the backend's 404 of a pool it does
			// not know.
			if !valid {
				t.Fatalf("accepted %q (%v, %v)", raw, q, err)
			}
			if len(calls) != 1 || calls[0].req != q.Get("pool") {
				t.Fatalf("accepted %q with backend calls %+v, want one for pool %q", raw, calls, q.Get("pool"))
			}
		case w.Code == http.StatusBadRequest:
			if valid {
				t.Fatalf("refused %q: %s", raw, w.Body)
			}
			var e Error
			if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error == "" || e.Code != CodeInvalid {
				t.Fatalf("refusal %q: %v", w.Body, err)
			}
			if len(calls) != 0 {
				t.Fatalf("refused %q but called the backend", raw)
			}
		default:
			t.Fatalf("status %d for %q: %s", w.Code, raw, w.Body)
		}
	})
}

// TestErrorf: an error marked with Errorf keeps its message alone, is of
// its kind, and still wraps what its format wraps.
func TestErrorf(t *testing.T) {
	inner := errors.New("open /var/lib/xdpq/upf.json: permission denied")
	err := Errorf(ErrUnavailable, "pool upf is blocked until its state file can be read: %w", inner)
	if err.Error() != "pool upf is blocked until its state file can be read: open /var/lib/xdpq/upf.json: permission denied" ||
		!errors.Is(err, ErrUnavailable) || !errors.Is(err, inner) || errors.Is(err, ErrNotFound) {
		t.Fatalf("%v", err)
	}
	w := serve(t, &fakeBackend{fn: failing(fmt.Errorf("cni add: %w", err))}, "POST", "/v1/cni/add", `{}`)
	if e := refusal(t, w); w.Code != 503 || e.Code != CodeUnavailable || e.Error != "cni add: "+err.Error() {
		t.Fatalf("%d %+v", w.Code, e)
	}
}
