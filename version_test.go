package xdpq

import (
	"regexp"
	"testing"
)

// TestVersion: VERSION holds one semantic version, without a "v" and
// without anything around it but a newline.
func TestVersion(t *testing.T) {
	semver := regexp.MustCompile(`^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$`)
	if v := Version(); !semver.MatchString(v) {
		t.Errorf("VERSION %q is not a semantic version (1.2.3, 1.3.0-dev)", v)
	}
	if version != Version()+"\n" {
		t.Errorf("VERSION is %q: one line, the version alone", version)
	}
}
