// Package release reads which release of xdpq came before this tree's
// (the file PREVIOUS_RELEASE) and exports that release's files from the
// repository's history, for the tests that run it beside this tree: the
// e2e's upgrade and rollback, and the clients' version skew.
package release

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// PreviousFile is the repository's file that names the previous release:
// a line "<version> <commit>" after comment lines.
const PreviousFile = "PREVIOUS_RELEASE"

// Previous reads PreviousFile of the repository at root: the previous
// release's version and commit.
func Previous(root string) (version, commit string, err error) {
	b, err := os.ReadFile(filepath.Join(root, PreviousFile))
	if err != nil {
		return "", "", err
	}
	s := bufio.NewScanner(bytes.NewReader(b))
	for s.Scan() {
		l := strings.TrimSpace(s.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		f := strings.Fields(l)
		if len(f) != 2 || len(f[1]) != 40 || strings.Trim(f[1], "0123456789abcdef") != "" {
			return "", "", fmt.Errorf("%s: %q is not \"<version> <40-digit commit>\"", PreviousFile, l)
		}
		if !semver(f[0]) {
			return "", "", fmt.Errorf("%s: version %q is not x.y.z[-pre]", PreviousFile, f[0])
		}
		return f[0], f[1], nil
	}
	return "", "", fmt.Errorf("%s names no release", PreviousFile)
}

// semver is whether v is x.y.z with an optional pre-release of
// [0-9A-Za-z.-] (no build metadata: an image tag cannot carry "+").
func semver(v string) bool {
	core, pre, hasPre := strings.Cut(v, "-")
	parts := strings.Split(core, ".")
	if len(parts) != 3 || hasPre && pre == "" {
		return false
	}
	for _, p := range parts {
		if p == "" || strings.Trim(p, "0123456789") != "" || len(p) > 1 && p[0] == '0' {
			return false
		}
	}
	return strings.Trim(pre, "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz.-") == ""
}

// Export writes the files of commit under paths (all if none) of the
// repository at root into dir, as git archive gives them. A commit the
// clone lacks (a shallow clone) is refused by name.
func Export(ctx context.Context, root, commit, dir string, paths ...string) error {
	if _, err := Git(ctx, root, "rev-parse", "--verify", "--quiet", commit+"^{commit}"); err != nil {
		return fmt.Errorf("commit %s (%s) is not in this clone's history: clone with history (git fetch --unshallow): %w",
			commit[:min(12, len(commit))], PreviousFile, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	args := append([]string{`set -o pipefail; git -C "$1" archive --format=tar "$2" -- "${@:4}" | tar -x -C "$3"`, "export", root, commit, dir}, paths...)
	if out, err := exec.CommandContext(ctx, "bash", append([]string{"-c"}, args...)...).CombinedOutput(); err != nil {
		return fmt.Errorf("export %s of %s: %w\n%s", strings.Join(paths, " "), commit[:12], err, out)
	}
	return nil
}

// Git runs git in the repository at root and returns its trimmed output.
func Git(ctx context.Context, root string, args ...string) (string, error) {
	return Output(ctx, root, "git", args...)
}

// Output runs command name in dir and returns its trimmed standard
// output; a failure says the command and its standard error.
func Output(ctx context.Context, dir, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return string(bytes.TrimSpace(out)), nil
}

// ExportPrevious is Previous and Export for a test: the previous
// release's files under paths (all if none) of the repository at root,
// in a directory of the test's; the test fails if they cannot be had.
func ExportPrevious(tb testing.TB, root string, paths ...string) (version, commit, dir string) {
	tb.Helper()
	version, commit, err := Previous(root)
	if err != nil {
		tb.Fatal(err)
	}
	dir = tb.TempDir()
	if err := Export(context.Background(), root, commit, dir, paths...); err != nil {
		tb.Fatal(err)
	}
	return version, commit, dir
}
