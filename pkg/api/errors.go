package api

import "errors"

// Kinds of refusal; the daemon wraps them and the HTTP status says which.
var (
	ErrNotFound    = errors.New("not found")
	ErrConflict    = errors.New("conflict")
	ErrInvalid     = errors.New("invalid request")
	ErrUnavailable = errors.New("unavailable")
)
