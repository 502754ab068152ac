// Package testbin builds the repository's commands for the tests that
// run them as processes, the way the image is built (make image): static
// (CGO_ENABLED=0) and -trimpath. A plain `go build` in a test compiles
// every dependency once more, with cgo and the source's paths, for no
// other use: on a machine with an empty build cache that was minutes of
// its CPUs, since a dozen tests' builds shared nothing with the image's,
// the e2e module's or lint's. Built as the image is, a test's build
// reuses what those compiled, and the tests run the binaries a node
// runs.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// Build builds the main package pkg (an import path, or a directory
// such as ".") into the file out, as Run does, and fails the test if
// the build fails.
func Build(tb testing.TB, out, pkg string) {
	tb.Helper()
	if err := Run(out, pkg); err != nil {
		tb.Fatal(err)
	}
}

// Run builds the main package pkg into the file out, static and
// -trimpath, with the go command on PATH in the current directory, for
// callers that are not tests (internal/tools/bench); its error carries the go
// command's output.
func Run(out, pkg string) error { return RunIn("", out, pkg) }

// BuildIn is Build in the module at dir (another tree, such as a
// release exported from history), "" the current directory.
func BuildIn(tb testing.TB, dir, out, pkg string) {
	tb.Helper()
	if err := RunIn(dir, out, pkg); err != nil {
		tb.Fatal(err)
	}
}

// RunIn is Run in the module at dir, "" the current directory.
func RunIn(dir, out, pkg string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s: %w\n%s", pkg, err, b)
	}
	return nil
}
