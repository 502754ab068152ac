package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// clientCalls calls every method of the client.
func clientCalls() []struct {
	name string
	call func(c *Client) error
} {
	return []struct {
		name string
		call func(c *Client) error
	}{
		{"GET /v1/status", func(c *Client) error { _, err := c.Status(); return err }},
		{"GET /v1/allocations", func(c *Client) error { _, err := c.Allocations(""); return err }},
		{"GET /v1/allocations?pool=upf", func(c *Client) error { _, err := c.Allocations("upf"); return err }},
		{"POST /v1/alloc", func(c *Client) error { _, err := c.Alloc("p", 1, 1000); return err }},
		{"POST /v1/free", func(c *Client) error { return c.Free("p-1") }},
		{"POST /v1/cni/add", func(c *Client) error { _, err := c.CNIAdd(CNIAddRequest{ContainerID: "c", IfName: "i"}); return err }},
		{"POST /v1/cni/del", func(c *Client) error { return c.CNIDel("c", "i") }},
		{"POST /v1/cni/check", func(c *Client) error { _, err := c.CNICheck("c", "i"); return err }},
		{"POST /v1/cni/gc", func(c *Client) error { _, err := c.CNIGC([]string{"c/i"}); return err }},
	}
}

// sentinels are the error kinds, ErrVersionSkew last.
func sentinels() []error {
	return []error{ErrInvalid, ErrNotFound, ErrConflict, ErrUnavailable, ErrNotSupported, ErrVersionSkew}
}

// startHandler serves h on a Listen socket until the test ends.
func startHandler(t *testing.T, h http.Handler) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "api.sock")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, h, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return path
}

// TestClientRoundTrip: each method's request reaches the backend and its
// answer comes back.
func TestClientRoundTrip(t *testing.T) {
	b := &fakeBackend{fn: answers()}
	c := NewClient(startHandler(t, NewHandler(b, nil)))
	if v, err := c.Version(); err != nil || v != Version {
		t.Fatalf("Version: %d, %v", v, err)
	}
	if s, err := c.Status(); err != nil || s.Pools[0].Free != 2 || s.Pools[0].Allocations != 1 || s.Allocations != 1 {
		t.Fatalf("Status: %+v, %v", s, err)
	}
	if l, err := c.Allocations(""); err != nil || len(l.Allocations) != 1 || l.Allocations[0].ID != "p-1" || l.Attachments == nil {
		t.Fatalf("Allocations: %+v, %v", l, err)
	}
	if l, err := c.Allocations("p"); err != nil || len(l.Allocations) != 1 {
		t.Fatalf("Allocations of p: %+v, %v", l, err)
	}
	_, err := c.Allocations("a b&pool=c")
	if se := (*StatusError)(nil); !errors.As(err, &se) || !errors.Is(err, ErrNotFound) ||
		err.Error() != `no pool "a b&pool=c" (pools: p)` || se.Path != "/v1/allocations?pool=a+b%26pool%3Dc" {
		t.Fatalf("Allocations of an unknown pool: %v", err)
	}
	if a, err := c.Alloc("p", 2, 1000); err != nil || a.ID != "p-1" {
		t.Fatalf("Alloc: %+v, %v", a, err)
	}
	if err := c.Free("p-1"); err != nil {
		t.Fatal(err)
	}
	if a, err := c.CNIAdd(CNIAddRequest{ContainerID: "c", IfName: "i", MTU: 1400}); err != nil || a.Mode != ModeQueue {
		t.Fatalf("CNIAdd: %+v, %v", a, err)
	}
	if err := c.CNIDel("c", "i"); err != nil {
		t.Fatal(err)
	}
	if a, err := c.CNICheck("c", "i"); err != nil || a.Netdev != "eth1" {
		t.Fatalf("CNICheck: %+v, %v", a, err)
	}
	if r, err := c.CNIGC([]string{"c2/i"}); err != nil || len(r) != 1 || r[0] != "c1/net1" {
		t.Fatalf("CNIGC: %v, %v", r, err)
	}
	want := []string{"Status", "Allocations", "Allocations", "Allocations", "Alloc", "Free", "CNIAdd", "CNIDel", "CNICheck", "CNIGC"}
	calls := b.called()
	if len(calls) != len(want) {
		t.Fatalf("backend calls %+v, want %v", calls, want)
	}
	for i, c := range calls {
		if c.op != want[i] {
			t.Fatalf("backend calls %+v, want %v", calls, want)
		}
	}
	if calls[1].req != "" || calls[2].req != "p" || calls[3].req != "a b&pool=c" {
		t.Errorf("Allocations asked %v, %v, %v", calls[1].req, calls[2].req, calls[3].req)
	}
	if fmt.Sprint(calls[6].req) != fmt.Sprint(CNIAddRequest{ContainerID: "c", IfName: "i", MTU: 1400}) {
		t.Errorf("CNIAdd asked %+v", calls[6].req)
	}
}

// TestClientErrorKinds: a backend's error reaches the client with its
// status, code, message and sentinel, for every method.
func TestClientErrorKinds(t *testing.T) {
	for _, tt := range []struct {
		err      error
		status   int
		code     string
		sentinel error
	}{
		{fmt.Errorf("no pool %q (pools: upf): %w", "nope", ErrNotFound), 404, CodeNotFound, ErrNotFound},
		{fmt.Errorf("pool upf: 3 queues asked, 2 free: %w", ErrConflict), 409, CodeConflict, ErrConflict},
		{Errorf(ErrConflict, "device xa-q2 is in use by allocation upf-1"), 409, CodeConflict, ErrConflict},
		{fmt.Errorf("flow protocol \"sctp\": udp or tcp: %w", ErrInvalid), 400, CodeInvalid, ErrInvalid},
		{fmt.Errorf("allocations come from kubelet here; xdpqctl alloc is for a standalone daemon: %w", ErrNotSupported), 501, CodeNotSupported, ErrNotSupported},
		{fmt.Errorf("pool upf is blocked: its state file is unreadable: %w", ErrUnavailable), 503, CodeUnavailable, ErrUnavailable},
		{errors.New("bind xsk eth1/q3: device or resource busy"), 500, CodeInternal, nil},
	} {
		c := NewClient(startHandler(t, NewHandler(&fakeBackend{fn: failing(tt.err)}, nil)))
		for _, cc := range clientCalls() {
			t.Run(tt.code+" "+cc.name, func(t *testing.T) {
				err := cc.call(c)
				var se *StatusError
				if !errors.As(err, &se) {
					t.Fatalf("%T %v", err, err)
				}
				if se.StatusCode != tt.status || se.Code != tt.code || se.Method+" "+se.Path != cc.name || se.Socket != c.Socket() {
					t.Errorf("%+v", se)
				}
				if err.Error() != tt.err.Error() {
					t.Errorf("error %q, want the daemon's %q", err, tt.err)
				}
				for _, s := range sentinels() {
					if errors.Is(err, s) != (s == tt.sentinel) {
						t.Errorf("errors.Is(%v, %v) = %v", err, s, !(s == tt.sentinel))
					}
				}
			})
		}
	}
}

// TestClientTooLarge: a request over the daemon's limit says so.
func TestClientTooLarge(t *testing.T) {
	b := &fakeBackend{fn: answers()}
	c := NewClient(startHandler(t, NewHandler(b, nil)))
	valid := make([]string, MaxBodyBytes/8)
	for i := range valid {
		valid[i] = "c/net1"
	}
	_, err := c.CNIGC(valid)
	var se *StatusError
	if !errors.As(err, &se) || se.StatusCode != 413 || !errors.Is(err, ErrInvalid) ||
		err.Error() != "request body over the limit of 1048576 bytes (1 MiB)" {
		t.Fatalf("%v", err)
	}
	if len(b.called()) != 0 {
		t.Fatal("the backend was called")
	}
}

// oldDaemon is the local API of a daemon before this version: Go's mux,
// text/plain 404 and 405, every refusal 400 with a message only, and
// neither /v1/version nor, here, /v1/cni/gc.
func oldDaemon() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"pools":[],"allocations":[],"netdevs":[]}`)
	})
	mux.HandleFunc("POST /v1/alloc", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(400)
		io.WriteString(w, `{"error":"no pool \"p\" (pools: upf)"}`+"\n")
	})
	mux.HandleFunc("POST /v1/cni/check", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "OK") // 200, not JSON
	})
	mux.HandleFunc("GET /v1/cni/del", func(w http.ResponseWriter, r *http.Request) {}) // 405 for POST
	return mux
}

// v1Daemon is the local API of a version 1 daemon: its status lists the
// allocations and attachments, and it has no /v1/allocations.
func v1Daemon() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/v1/version":
			io.WriteString(w, `{"api":1}`)
		case "/v1/status":
			io.WriteString(w, `{"pools":[{"name":"upf","resource":"xdpq.io/upf","queues":4,"free":3}],"allocations":[{"id":"upf-1","pool":"upf"}],"netdevs":[],"attachments":[]}`)
		default:
			w.WriteHeader(404)
			io.WriteString(w, `{"error":"no API path `+r.URL.Path+`; this daemon speaks API version 1: GET /v1/status, GET /v1/version","code":"unknown-path"}`)
		}
	})
}

// TestClientVersionSkew: answers that are not this API's name the skew,
// the socket, the request and what the daemon said; never an empty error.
func TestClientVersionSkew(t *testing.T) {
	old := NewClient(startHandler(t, oldDaemon()))
	v1 := NewClient(startHandler(t, v1Daemon()))
	// A daemon of a later version: its own JSON for unknown paths.
	newer := NewClient(startHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/version" {
			io.WriteString(w, `{"api":3}`)
			return
		}
		w.WriteHeader(404)
		io.WriteString(w, `{"error":"no API path `+r.URL.Path+`; this daemon speaks API version 3: GET /v3/status","code":"unknown-path"}`)
	})))
	// Some other HTTP server, which knows /v1/version.
	other := NewClient(startHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/version" {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"api":3}`)
			return
		}
		w.WriteHeader(502)
	})))
	for _, tt := range []struct {
		name   string
		c      *Client
		call   func(c *Client) error
		status int
		says   string
	}{
		{"path unknown to an old daemon", old, func(c *Client) error { _, err := c.CNIGC(nil); return err }, 404,
			`POST /v1/cni/gc answered 404 Not Found: "404 page not found"; the daemon does not answer GET /v1/version either, so it predates API versions; this client speaks version 2 (version skew: upgrade or downgrade one of them)`},
		{"method unknown to an old daemon", old, func(c *Client) error { return c.CNIDel("c", "i") }, 405,
			`POST /v1/cni/del answered 405 Method Not Allowed: "Method Not Allowed"; the daemon does not answer GET /v1/version either`},
		{"version of an old daemon", old, func(c *Client) error { _, err := c.Version(); return err }, 404,
			`GET /v1/version answered 404 Not Found: "404 page not found" (version skew`},
		{"not JSON", old, func(c *Client) error { _, err := c.CNICheck("c", "i"); return err }, 200,
			`POST /v1/cni/check answered 200 OK: its body is not the API's JSON (invalid character 'O' looking for beginning of value); the daemon does not answer GET /v1/version either`},
		{"status of an old daemon", old, func(c *Client) error { _, err := c.Status(); return err }, 200,
			`GET /v1/status answered 200 OK: its body is not the API's JSON (json: cannot unmarshal array into Go struct field Status.allocations of type int); the daemon does not answer GET /v1/version either`},
		{"status of a version 1 daemon", v1, func(c *Client) error { _, err := c.Status(); return err }, 200,
			`GET /v1/status answered 200 OK: its body is not the API's JSON (json: cannot unmarshal array into Go struct field Status.allocations of type int); the daemon speaks API version 1, this client 2 (version skew`},
		{"allocations of a version 1 daemon", v1, func(c *Client) error { _, err := c.Allocations("upf"); return err }, 404,
			`GET /v1/allocations?pool=upf answered 404 Not Found: no API path /v1/allocations; this daemon speaks API version 1: GET /v1/status, GET /v1/version (version skew`},
		{"path unknown to a newer daemon", newer, func(c *Client) error { _, err := c.Status(); return err }, 404,
			`GET /v1/status answered 404 Not Found: no API path /v1/status; this daemon speaks API version 3: GET /v3/status (version skew`},
		{"empty 502", other, func(c *Client) error { return c.Free("x") }, 502,
			`POST /v1/free answered 502 Bad Gateway: its body is not the API's JSON; the daemon speaks API version 3, this client 2 (version skew`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call(tt.c)
			var se *StatusError
			if !errors.As(err, &se) || se.StatusCode != tt.status || !errors.Is(err, ErrVersionSkew) {
				t.Fatalf("%T %v", err, err)
			}
			want := "the xdpq daemon at " + tt.c.Socket() + " and this client disagree on the API: " + tt.says
			if !strings.HasPrefix(err.Error(), want) {
				t.Errorf("error\n %s\nwant it to start\n %s", err, want)
			}
			for _, s := range sentinels()[:5] {
				if errors.Is(err, s) {
					t.Errorf("skew is also %v", s)
				}
			}
		})
	}
	// An old daemon's refusal (400, a message, no code) is still a refusal.
	_, err := old.Alloc("p", 1, 0)
	if !errors.Is(err, ErrInvalid) || err.Error() != `no pool "p" (pools: upf)` {
		t.Errorf("old daemon's refusal: %v", err)
	}
}

// TestStatusV1ClientFails: a version 1 client reading a version 2 status
// fails, rather than read that there are no allocations; so does one
// reading an allocation list as a status.
func TestStatusV1ClientFails(t *testing.T) {
	// The fields of version 1's Status that version 2 changed.
	type statusV1 struct {
		Allocations []Allocation       `json:"allocations"`
		Attachments []AttachmentStatus `json:"attachments"`
	}
	for _, s := range []Status{{Allocations: 0}, {Allocations: 3, Attachments: 2}} {
		data, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		var old statusV1
		if err := json.Unmarshal(data, &old); err == nil {
			t.Errorf("a version 1 client reads %s as %+v", data, old)
		}
	}
	data, err := json.Marshal(AllocationList{Allocations: []Allocation{{ID: "p-1"}}, Attachments: []AttachmentStatus{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, new(Status)); err == nil {
		t.Errorf("a list %s reads as a status", data)
	}
}

// TestClientUnknownCode: a code this client does not know falls back on
// the status.
func TestClientUnknownCode(t *testing.T) {
	c := NewClient(startHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.WriteHeader(409)
		io.WriteString(w, `{"error":"queue 3 is draining","code":"draining"}`)
	})))
	err := c.Free("x")
	var se *StatusError
	if !errors.As(err, &se) || se.Code != "draining" || !errors.Is(err, ErrConflict) || err.Error() != "queue 3 is draining" {
		t.Fatalf("%v (%+v)", err, se)
	}
}

// TestClientNoAnswer: a daemon that is not there, or that drops the
// connection, gives an error that says so.
func TestClientNoAnswer(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "api.sock")
	err := NewClient(missing).Free("x")
	want := "the xdpq daemon's API at " + missing + " does not answer: dial unix " + missing +
		": connect: no such file or directory (is the daemon running, with --api-socket " + missing + "?)"
	if err == nil || err.Error() != want {
		t.Errorf("error\n %v\nwant\n %s", err, want)
	}
	path := startHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	_, err = NewClient(path).CNIAdd(CNIAddRequest{})
	if err == nil || !strings.HasPrefix(err.Error(), "the xdpq daemon at "+path+" did not answer POST /v1/cni/add: ") || !strings.Contains(err.Error(), "EOF") {
		t.Errorf("dropped connection: %v", err)
	}
}

// TestStatusErrorNoReason: a refusal without a message still says what
// happened.
func TestStatusErrorNoReason(t *testing.T) {
	err := &StatusError{Socket: "/run/x.sock", Method: "POST", Path: "/v1/free", StatusCode: 409, err: ErrConflict}
	if got := err.Error(); got != "the xdpq daemon at /run/x.sock refused POST /v1/free with 409 Conflict and gave no reason" {
		t.Error(got)
	}
}
