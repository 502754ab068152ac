// Package images builds the e2e node's container images without a
// registry or a Docker engine: static Go programs of this directory, one
// layer each on an empty base (internal/tools/image), written as
// docker-archives for `ctr images import`.
package images

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/xdpq/xdpq/internal/tools/image"
)

// Image is a program of this directory and the reference its image has.
type Image struct {
	// Package is its main package, relative to the e2e module's root.
	Package string
	// Ref is the image's reference, as a pod's spec names it.
	Ref string
}

// Pause is the sandbox image (containerd's sandbox_image).
func Pause() Image { return Image{Package: "./images/pause", Ref: "xdpq.io/e2e/pause:1"} }

// Hello prints "hello" and its arguments; with -wait it runs until
// SIGTERM.
func Hello() Image { return Image{Package: "./images/hello", Ref: "xdpq.io/e2e/hello:1"} }

// Build compiles img's program static for the host's architecture and
// writes its image as a docker-archive into dir, returning its path.
func Build(ctx context.Context, img Image, dir string) (_ string, err error) {
	mod, err := moduleDir(ctx)
	if err != nil {
		return "", err
	}
	bin := "/" + filepath.Base(img.Package)
	spec := image.Spec{
		Binaries:   []image.Binary{{Package: img.Package, Path: bin}},
		Entrypoint: []string{bin},
		WorkingDir: "/",
		GoFlags:    []string{"-trimpath", "-ldflags=-s -w"},
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("image %s: %w", img.Ref, err)
	}
	work, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		return "", fmt.Errorf("image %s: %w", img.Ref, err)
	}
	defer func() { err = errors.Join(err, os.RemoveAll(work)) }()
	files, err := image.Compile(ctx, "go", mod, runtime.GOARCH, work, spec)
	if err != nil {
		return "", fmt.Errorf("image %s: %w", img.Ref, err)
	}
	v1img, err := image.Build(spec, runtime.GOARCH, files, time.Unix(0, 0).UTC())
	if err != nil {
		return "", fmt.Errorf("image %s: %w", img.Ref, err)
	}
	tag, err := name.NewTag(img.Ref, name.StrictValidation)
	if err != nil {
		return "", fmt.Errorf("image %s: %w", img.Ref, err)
	}
	p := filepath.Join(dir, strings.NewReplacer("/", "_", ":", "_").Replace(img.Ref)+".tar")
	if err := image.WriteArchive(p, tag, v1img); err != nil {
		return "", err
	}
	return p, nil
}

// Xdpq builds xdpq's image as `make image` does (internal/tools/image: the
// Dockerfile's image), for the host's architecture, tagged
// xdpq.io/xdpq:<version>, into dir, and returns the archive's path and
// the image's reference.
func Xdpq(ctx context.Context, version, dir string) (archive, ref string, err error) {
	mod, err := moduleDir(ctx)
	if err != nil {
		return "", "", err
	}
	root := filepath.Join(mod, "..", "..") // test/e2e is in the repository's root module
	tag, err := image.Tag(version)
	if err != nil {
		return "", "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", fmt.Errorf("xdpq image: %w", err)
	}
	work, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		return "", "", fmt.Errorf("xdpq image: %w", err)
	}
	defer func() { err = errors.Join(err, os.RemoveAll(work)) }()
	spec := image.Xdpq(version, "e2e")
	files, err := image.Compile(ctx, "go", root, runtime.GOARCH, work, spec)
	if err != nil {
		return "", "", fmt.Errorf("xdpq image: %w", err)
	}
	img, err := image.Build(spec, runtime.GOARCH, files, time.Unix(0, 0).UTC())
	if err != nil {
		return "", "", fmt.Errorf("xdpq image: %w", err)
	}
	p := filepath.Join(dir, "xdpq-image-"+runtime.GOARCH+".tar")
	if err := image.WriteArchive(p, tag, img); err != nil {
		return "", "", err
	}
	return p, tag.String(), nil
}

// moduleDir returns the root of the e2e module, which the current
// directory must be in.
func moduleDir(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if !strings.HasSuffix(filepath.ToSlash(gomod), "test/e2e/go.mod") {
		return "", fmt.Errorf("build e2e images: run in the e2e module (test/e2e), not in %q", gomod)
	}
	return filepath.Dir(gomod), nil
}
