package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
)

// The kinds of refusal. A [Backend] wraps one with %w to choose the status
// code of its error (fmt.Errorf("pool %q: %w", name, api.ErrNotFound)
// reads `pool "x": not found`), or marks a message complete without it
// with [Errorf]; [NewHandler] answers anything else with 500. On the
// client side the [*StatusError] of a refusal wraps the same sentinel, so
// errors.Is(err, api.ErrNotFound) holds on both ends of the socket.
var (
	// ErrInvalid is a bad argument or a request body that is not one
	// valid request (400; 413 for a body over [MaxBodyBytes]).
	ErrInvalid = errors.New("invalid request")
	// ErrNotFound is a missing pool, allocation, device or attachment (404).
	ErrNotFound = errors.New("not found")
	// ErrConflict is a request the daemon's state refuses: a device in
	// use, a pool without enough free queues, an attachment made already
	// (409).
	ErrConflict = errors.New("conflict")
	// ErrUnavailable is a refusal that may pass if retried later: a pool
	// blocked by an unreadable state file, kubelet unreachable, the
	// daemon stopping or out of time (503).
	ErrUnavailable = errors.New("unavailable")
	// ErrNotSupported is a request this daemon does not do in its mode or
	// configuration, e.g. alloc on a daemon whose allocations come from
	// kubelet (501).
	ErrNotSupported = errors.New("not supported")
	// ErrVersionSkew is an answer this client cannot read: an unknown
	// path or method, or a body that is not this API's JSON. The daemon
	// and the client speak different versions of the API. Only the client
	// returns it.
	ErrVersionSkew = errors.New("api version skew")
	// ErrNoDevices is the ErrNotFound of a CNI ADD for a pod that holds
	// no xdpq device: where xdpq runs in the node's chain after the
	// primary plugin every pod passes through it, and for such a pod it
	// does nothing (404).
	ErrNoDevices error = &kindError{kind: ErrNotFound, err: errors.New("the pod holds no xdpq device")}
)

// The codes of [Error], one per kind of refusal.
const (
	CodeInvalid          = "invalid"            // 400, ErrInvalid
	CodeTooLarge         = "too-large"          // 413, ErrInvalid
	CodeNotFound         = "not-found"          // 404, ErrNotFound
	CodeNoDevices        = "no-devices"         // 404, ErrNoDevices (an ErrNotFound)
	CodeConflict         = "conflict"           // 409, ErrConflict
	CodeUnavailable      = "unavailable"        // 503, ErrUnavailable
	CodeNotSupported     = "not-supported"      // 501, ErrNotSupported
	CodeInternal         = "internal"           // 500, no sentinel
	CodeUnknownPath      = "unknown-path"       // 404, ErrVersionSkew at the client
	CodeMethodNotAllowed = "method-not-allowed" // 405, ErrVersionSkew at the client
)

// Errorf formats an error as fmt.Errorf does (%w included) and marks it
// as of kind, one of the sentinels above: errors.Is(err, kind) holds, and
// its message is the formatted one alone, for messages that say it all:
//
//	api.Errorf(api.ErrConflict, "device %s is in use by allocation %s", dev, id)
func Errorf(kind error, format string, a ...any) error {
	return &kindError{kind: kind, err: fmt.Errorf(format, a...)}
}

// kindError is an error of Errorf.
type kindError struct {
	kind, err error
}

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

// CodeOf returns the code a backend's error is answered with (one of
// the codes above: CodeInternal for an error of no kind), "" for nil.
func CodeOf(err error) string {
	if err == nil {
		return ""
	}
	_, code := classify(err)
	return code
}

// ResultOf is the result label of a verb that ended with err: "success",
// or its error's code (the metrics of the CNI verbs and of DRA's).
func ResultOf(err error) string {
	if err == nil {
		return "success"
	}
	return CodeOf(err)
}

// classify gives the status and code of a backend's error: its sentinel's,
// else 503 for a request out of time or cancelled (the daemon stopping),
// else 500. An error that wraps two sentinels gets the first listed here.
func classify(err error) (status int, code string) {
	switch {
	case errors.Is(err, ErrNoDevices):
		return http.StatusNotFound, CodeNoDevices
	case errors.Is(err, ErrNotFound):
		return http.StatusNotFound, CodeNotFound
	case errors.Is(err, ErrConflict):
		return http.StatusConflict, CodeConflict
	case errors.Is(err, ErrInvalid):
		return http.StatusBadRequest, CodeInvalid
	case errors.Is(err, ErrNotSupported):
		return http.StatusNotImplemented, CodeNotSupported
	case errors.Is(err, ErrUnavailable), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return http.StatusServiceUnavailable, CodeUnavailable
	}
	return http.StatusInternalServerError, CodeInternal
}

// sentinelOf gives the sentinel the client's error for an API answer
// wraps: by its code where the daemon sent a known one, else by its
// status (a daemon before codes sent every refusal as 400).
func sentinelOf(code string, status int) error {
	switch code {
	case CodeInvalid, CodeTooLarge:
		return ErrInvalid
	case CodeNotFound:
		return ErrNotFound
	case CodeNoDevices:
		return ErrNoDevices
	case CodeConflict:
		return ErrConflict
	case CodeNotSupported:
		return ErrNotSupported
	case CodeUnavailable:
		return ErrUnavailable
	case CodeUnknownPath, CodeMethodNotAllowed:
		return ErrVersionSkew
	case CodeInternal:
		return nil
	}
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		return ErrInvalid
	case http.StatusNotFound:
		return ErrNotFound
	case http.StatusConflict:
		return ErrConflict
	case http.StatusNotImplemented:
		return ErrNotSupported
	case http.StatusServiceUnavailable:
		return ErrUnavailable
	case http.StatusMethodNotAllowed:
		return ErrVersionSkew
	}
	return nil
}

// StatusError is the client's error for an answer of the daemon: its
// refusal of the request, wrapping the sentinel of its kind (none for a
// 500), or an answer the client cannot read (an unknown path or method,
// a body that is not the API's), wrapping [ErrVersionSkew].
type StatusError struct {
	Socket     string // the daemon's API socket
	Method     string // of the request
	Path       string // of the request
	StatusCode int    // the answer's HTTP status
	Code       string // the answer's code; "" if it had none
	Message    string // the daemon's message, or what the client made of the answer
	err        error
}

// Error returns the daemon's message: it says what failed. An answer the
// client cannot read gets a line that names the version skew.
func (e *StatusError) Error() string {
	switch {
	case e.err == ErrVersionSkew:
		what := ""
		if e.Message != "" {
			what = ": " + e.Message
		}
		return fmt.Sprintf("the xdpq daemon at %s and this client disagree on the API: %s %s answered %d %s%s (version skew: upgrade or downgrade one of them)",
			e.Socket, e.Method, e.Path, e.StatusCode, http.StatusText(e.StatusCode), what)
	case e.Message == "":
		return fmt.Sprintf("the xdpq daemon at %s refused %s %s with %d %s and gave no reason",
			e.Socket, e.Method, e.Path, e.StatusCode, http.StatusText(e.StatusCode))
	}
	return e.Message
}

// Unwrap returns the sentinel of the error's kind, or nil (a 500).
func (e *StatusError) Unwrap() error { return e.err }
