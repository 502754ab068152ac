package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
)

// maxErrorBody is as much of a refusal's body as the client reads.
const maxErrorBody = 64 << 10

// Client talks to the daemon's local API. Its methods never return an
// empty error: a refusal is a [*StatusError] wrapping the sentinel of its
// kind; a daemon that does not answer gets an error that says so.
type Client struct {
	http   *http.Client
	socket string
}

// NewClient returns a client of the API at socket ("" for the default).
func NewClient(socket string) *Client {
	if socket == "" {
		socket = DefaultSocket
	}
	return &Client{socket: socket, http: &http.Client{
		// Longer than the daemon takes to answer, timeouts included.
		Timeout: clientTimeout,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", socket)
			},
			// A connection per request: a client makes few, and none
			// is left open to a daemon that restarted in between.
			DisableKeepAlives: true,
		},
		// The API never redirects; a redirect is some other server's.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// Socket returns the path of the API's socket the client uses.
func (c *Client) Socket() string { return c.socket }

func (c *Client) call(method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode the request %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://xdpq"+path, body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return c.noAnswer(method, path, err)
	}
	defer func() { _ = resp.Body.Close() }() // read to its end or abandoned: nothing to lose
	if resp.StatusCode/100 == 2 {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			what := "its body is not the API's JSON (" + err.Error() + ")"
			if path != "/v1/version" {
				what += "; " + c.versionHint()
			}
			return c.statusError(method, path, resp.StatusCode, "", what, ErrVersionSkew)
		}
		return nil
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	if err != nil {
		return fmt.Errorf("the xdpq daemon at %s: read its answer to %s %s (%d %s): %w",
			c.socket, method, path, resp.StatusCode, http.StatusText(resp.StatusCode), err)
	}
	var e Error
	if isJSON(resp.Header) && json.Unmarshal(data, &e) == nil && e.Error != "" {
		return c.statusError(method, path, resp.StatusCode, e.Code, e.Error, sentinelOf(e.Code, resp.StatusCode))
	}
	// Not this API's answer: a daemon of another version (Go's own 404 or
	// 405 page for a path it does not have), or not an xdpq daemon.
	what := "its body is not the API's JSON"
	if b := bytes.TrimSpace(data); len(b) > 0 {
		if len(b) > 200 {
			b = append(b[:200:200], "..."...)
		}
		what = strconv.Quote(string(b))
	}
	if path != "/v1/version" {
		what += "; " + c.versionHint()
	}
	return c.statusError(method, path, resp.StatusCode, "", what, ErrVersionSkew)
}

// versionHint asks the daemon its API version, for the message of an
// answer the client could not read.
func (c *Client) versionHint() string {
	v, err := c.Version()
	switch {
	case err == nil:
		return fmt.Sprintf("the daemon speaks API version %d, this client %d", v, Version)
	case errors.Is(err, ErrVersionSkew):
		return fmt.Sprintf("the daemon does not answer GET /v1/version either, so it predates API versions; this client speaks version %d", Version)
	}
	return fmt.Sprintf("this client speaks API version %d", Version)
}

// isJSON tells whether an answer's content type is JSON.
func isJSON(h http.Header) bool {
	t, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	return err == nil && t == "application/json"
}

func (c *Client) statusError(method, path string, status int, code, msg string, sentinel error) error {
	return &StatusError{Socket: c.socket, Method: method, Path: path, StatusCode: status, Code: code, Message: msg, err: sentinel}
}

// noAnswer is the error of a request that got no answer.
func (c *Client) noAnswer(method, path string, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // not the made-up http://xdpq URL
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return fmt.Errorf("the xdpq daemon's API at %s does not answer: %w (is the daemon running, with --api-socket %s?)",
			c.socket, err, c.socket)
	}
	if ue != nil && ue.Timeout() {
		return fmt.Errorf("the xdpq daemon at %s did not answer %s %s within %v: %w", c.socket, method, path, clientTimeout, err)
	}
	return fmt.Errorf("the xdpq daemon at %s did not answer %s %s: %w", c.socket, method, path, err)
}

// Version returns the API version the daemon speaks (see [Version]).
func (c *Client) Version() (int, error) {
	v, err := c.VersionInfo()
	return v.API, err
}

// VersionInfo returns the daemon's API version and release.
func (c *Client) VersionInfo() (VersionInfo, error) {
	var v VersionInfo
	err := c.call(http.MethodGet, "/v1/version", nil, &v)
	return v, err
}

// Status reports the daemon's pools and netdevs and how many allocations
// and attachments it holds; [Client.Allocations] lists them.
func (c *Client) Status() (*Status, error) {
	var s Status
	if err := c.call(http.MethodGet, "/v1/status", nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// Allocations lists the allocations of pool ("" for every pool) and their
// CNI attachments. A pool the daemon does not know is an [ErrNotFound]
// whose message names the pools it does.
func (c *Client) Allocations(pool string) (*AllocationList, error) {
	path := "/v1/allocations"
	if pool != "" {
		path += "?" + url.Values{"pool": {pool}}.Encode()
	}
	var l AllocationList
	if err := c.call(http.MethodGet, path, nil, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// Alloc asks for count queues of pool for uid.
func (c *Client) Alloc(pool string, count int, uid uint32) (*Allocation, error) {
	var a Allocation
	if err := c.call(http.MethodPost, "/v1/alloc", AllocRequest{Pool: pool, Count: count, UID: uid}, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

// Free ends an allocation.
func (c *Client) Free(id string) error {
	var out FreeAnswer
	return c.call(http.MethodPost, "/v1/free", FreeRequest{ID: id}, &out)
}

// CNIAdd makes an attachment.
func (c *Client) CNIAdd(req CNIAddRequest) (*Attachment, error) {
	var a Attachment
	if err := c.call(http.MethodPost, "/v1/cni/add", req, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

// CNIDel removes an attachment (none is no error).
func (c *Client) CNIDel(containerID, ifName string) error {
	var out struct{}
	return c.call(http.MethodPost, "/v1/cni/del", AttachmentRef{ContainerID: containerID, IfName: ifName}, &out)
}

// CNICheck verifies an attachment.
func (c *Client) CNICheck(containerID, ifName string) (*Attachment, error) {
	var a Attachment
	if err := c.call(http.MethodPost, "/v1/cni/check", AttachmentRef{ContainerID: containerID, IfName: ifName}, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

// CNIGC removes the attachments not in valid ("containerID/ifName") and
// returns those it removed.
func (c *Client) CNIGC(valid []string) ([]string, error) {
	var out GCAnswer
	if err := c.call(http.MethodPost, "/v1/cni/gc", GCRequest{Valid: valid}, &out); err != nil {
		return nil, err
	}
	return out.Removed, nil
}
