package images

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"github.com/xdpq/xdpq/internal/testing/release"
	"github.com/xdpq/xdpq/internal/tools/image"
)

// Release is a release of xdpq built from the repository's history: its
// image and its chart, as that commit's own tools make them.
type Release struct {
	Version string
	Commit  string
	// Chart is the directory of the release's chart (charts/xdpq).
	Chart string
	// Archive is its image for the host's architecture, a
	// docker-archive, and Ref the image's reference.
	Archive, Ref string
}

// BuildRelease builds release version of the repository at root from its
// commit: the commit's tree, exported with git archive, builds its own
// image with its own cmd/xdpqimage (as its make image did) and gives its
// chart. The result is cached in cacheDir under the version, the commit,
// the go command's version and the architecture; a build that did not
// finish leaves only a temporary directory, removed by the next.
func BuildRelease(ctx context.Context, root, version, commit, cacheDir string) (Release, error) {
	r := Release{Version: version, Commit: commit}
	tag, err := image.Tag(version)
	if err != nil {
		return r, err
	}
	r.Ref = tag.String()
	goVersion, err := release.Output(ctx, root, "go", "env", "GOVERSION")
	if err != nil || goVersion == "" {
		return r, fmt.Errorf("release %s: the go command's version (%q): %v", version, goVersion, err)
	}
	dst := filepath.Join(cacheDir, fmt.Sprintf("release-%s-%s-%s-%s", version, commit[:12], goVersion, runtime.GOARCH))
	r.Chart = filepath.Join(dst, "chart")
	r.Archive = filepath.Join(dst, "xdpq-image.tar")
	if _, err := os.Stat(r.Archive); err == nil {
		return r, nil
	}
	created, err := release.Git(ctx, root, "log", "-1", "--format=%cI", commit)
	if err != nil || created == "" {
		return r, fmt.Errorf("release %s: the date of commit %s (%q): %v", version, commit[:12], created, err)
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return r, fmt.Errorf("release %s: %w", version, err)
	}
	old, _ := filepath.Glob(filepath.Join(cacheDir, ".tmp-release-*"))
	for _, d := range old {
		// A killed build's (an hour old: not another run's under way);
		// one that cannot be removed is tried again next time.
		if fi, err := os.Stat(d); err == nil && time.Since(fi.ModTime()) > time.Hour {
			_ = os.RemoveAll(d)
		}
	}
	tmp, err := os.MkdirTemp(cacheDir, ".tmp-release-")
	if err != nil {
		return r, fmt.Errorf("release %s: %w", version, err)
	}
	defer func() { _ = os.RemoveAll(tmp) }() // gone once renamed
	src := filepath.Join(tmp, "src")
	if err := release.Export(ctx, root, commit, src); err != nil {
		return r, fmt.Errorf("release %s: %w", version, err)
	}
	// The commit's own image builder, static and without local paths, as
	// its Makefile ran it; the go command of this machine, never another
	// toolchain downloaded.
	build := exec.CommandContext(ctx, "go", "run", "./cmd/xdpqimage", "-arch", runtime.GOARCH, "-version", version,
		"-revision", commit, "-created", created, "-o", filepath.Join(tmp, "xdpq-image.tar"))
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-trimpath", "GOWORK=off", "GOTOOLCHAIN=local")
	if out, err := build.CombinedOutput(); err != nil {
		return r, fmt.Errorf("release %s: its make image: %w\n%s", version, err, out)
	}
	if err := os.Rename(filepath.Join(src, "charts", "xdpq"), filepath.Join(tmp, "chart")); err != nil {
		return r, fmt.Errorf("release %s: its chart: %w", version, err)
	}
	if err := os.RemoveAll(src); err != nil {
		return r, err
	}
	if err := os.Rename(tmp, dst); err != nil {
		if _, serr := os.Stat(r.Archive); serr == nil {
			return r, nil // another process built it meanwhile
		}
		return r, fmt.Errorf("release %s: %w", version, err)
	}
	return r, nil
}
