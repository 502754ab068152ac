// Package xdpq is this tree's release: its version, set in the file
// VERSION and nowhere else. The commands, the API, the XdpqNode and the
// metrics say it; the chart's version and appVersion and the image's tag
// must be it (test/chart and the Makefile check and use it).
package xdpq

import (
	_ "embed"
	"strings"
)

//go:embed VERSION
var version string

// Version is the release, semantic versioning without a "v" ("0.1.0"):
// a tree between releases says the next one with "-dev".
func Version() string { return strings.TrimSpace(version) }
