// Package image builds xdpq's container image without a Docker engine or a
// registry: the module's commands compiled static for an architecture, one
// layer per binary on an empty base, written as a docker-archive tarball
// that `docker load` and `ctr images import` accept. It is the image the
// repository's Dockerfile describes; the package's tests keep the two the
// same.
package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/xdpq/xdpq/internal/atomicfile"
)

// Repository is the name the image is tagged with, before ":<version>".
const Repository = "xdpq.io/xdpq"

// Binary is a command of the module and where the image holds it.
type Binary struct {
	Package string // relative to the module's root: "./cmd/cni"
	Path    string // absolute, in the image
}

// Spec is what the image holds and how it runs: what the Dockerfile's
// final stage says.
type Spec struct {
	Binaries   []Binary
	Entrypoint []string
	User       string
	WorkingDir string
	Env        []string
	Labels     map[string]string
	// GoFlags are the flags of `go build` for every binary. With
	// CGO_ENABLED=0 the binaries are static.
	GoFlags []string
}

// Xdpq returns the spec of xdpq's image of a version built from a revision
// (a commit id).
func Xdpq(version, revision string) Spec {
	return Spec{
		Binaries: []Binary{
			{"./cmd/deviceplugin", "/usr/local/bin/xdpq-deviceplugin"},
			{"./cmd/cni", "/opt/xdpq/cni/xdpq"},
			{"./cmd/xdpqctl", "/usr/local/bin/xdpqctl"},
			{"./cmd/xdpqperf", "/usr/local/bin/xdpqperf"},
			// The chart's init container and sidecar: the image has no
			// shell and no cp to install the CNI plugin with.
			{"./cmd/xdpq-install-cni", "/usr/local/bin/xdpq-install-cni"},
		},
		Entrypoint: []string{"/usr/local/bin/xdpq-deviceplugin"},
		// Root: the daemon attaches XDP programs, pins maps, binds AF_XDP
		// sockets and enters pods' network namespaces, with the
		// capabilities the chart adds to an unprivileged container.
		User:       "0:0",
		WorkingDir: "/",
		Env:        []string{"PATH=/usr/local/bin"},
		Labels: map[string]string{
			"org.opencontainers.image.title":       "xdpq",
			"org.opencontainers.image.description": "NIC queues for Kubernetes pods as AF_XDP sockets: the node daemon, the CNI plugin, xdpqctl and xdpqperf",
			"org.opencontainers.image.source":      "https://github.com/xdpq/xdpq",
			"org.opencontainers.image.version":     version,
			"org.opencontainers.image.revision":    revision,
		},
		// No local paths in the binaries, no symbol table.
		GoFlags: []string{"-trimpath", "-ldflags=-s -w"},
	}
}

// Compile builds spec's binaries for linux/goarch with the go command
// goTool, from the module at moduleDir, into dir (named after their
// paths' last elements), and returns each binary's file by its path in
// the image.
func Compile(ctx context.Context, goTool, moduleDir, goarch, dir string, spec Spec) (map[string]string, error) {
	files := map[string]string{}
	for i, b := range spec.Binaries {
		out := filepath.Join(dir, fmt.Sprintf("%d-%s", i, path.Base(b.Path)))
		args := append(append([]string{"build"}, spec.GoFlags...), "-o", out, b.Package)
		cmd := exec.CommandContext(ctx, goTool, args...)
		cmd.Dir = moduleDir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goarch)
		if msg, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("compile %s for %s: %w\n%s", b.Package, goarch, err, msg)
		}
		files[b.Path] = out
	}
	return files, nil
}

// Build makes the image of spec for linux/goarch: an empty base, then one
// layer per binary (as the Dockerfile's COPY lines make them) holding the
// file files[path] at path, mode 0755, owned by root, with its parent
// directories. Every time in it is created, so that the same inputs make
// the same image.
func Build(spec Spec, goarch string, files map[string]string, created time.Time) (v1.Image, error) {
	cfg, err := empty.Image.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", goarch
	cfg.Created = v1.Time{Time: created}
	cfg.Config = v1.Config{
		Entrypoint: spec.Entrypoint,
		User:       spec.User,
		WorkingDir: spec.WorkingDir,
		Env:        spec.Env,
		Labels:     spec.Labels,
	}
	img, err := mutate.ConfigFile(empty.Image, cfg)
	if err != nil {
		return nil, err
	}
	for _, b := range spec.Binaries {
		src, ok := files[b.Path]
		if !ok {
			return nil, fmt.Errorf("build image: no file for %s", b.Path)
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return nil, fmt.Errorf("build image: %w", err)
		}
		layer, err := fileLayer(b.Path, data, created)
		if err != nil {
			return nil, fmt.Errorf("build image: layer of %s: %w", b.Path, err)
		}
		img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
			Created:   v1.Time{Time: created},
			CreatedBy: "COPY " + path.Base(b.Path) + " " + b.Path + " # " + b.Package,
		}})
		if err != nil {
			return nil, fmt.Errorf("build image: %w", err)
		}
	}
	return img, nil
}

// fileLayer is a layer holding data as the executable file p and its
// parent directories.
func fileLayer(p string, data []byte, mtime time.Time) (v1.Layer, error) {
	if !path.IsAbs(p) || path.Clean(p) != p {
		return nil, fmt.Errorf("%q is not a clean absolute path", p)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	rel := strings.TrimPrefix(p, "/")
	parts := strings.Split(rel, "/")
	for i := 1; i < len(parts); i++ {
		dir := strings.Join(parts[:i], "/") + "/"
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: 0o755, Size: int64(len(data)), ModTime: mtime, Format: tar.FormatPAX}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(data); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layer := buf.Bytes()
	// Compressed once: the digest and the archive take the same bytes.
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layer)), nil }, tarball.WithCompressedCaching)
}

// Tag is the image's name for a version: Repository:version. A version
// is what Docker takes as a tag: up to 128 letters, digits, '_', '.' and
// '-', not starting with '.' or '-'.
func Tag(version string) (name.Tag, error) {
	ok := len(version) > 0 && len(version) <= 128 && version[0] != '.' && version[0] != '-'
	for _, c := range version {
		ok = ok && (c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-')
	}
	if !ok {
		return name.Tag{}, fmt.Errorf("image tag for version %q: a tag is up to 128 of [A-Za-z0-9_.-], not starting with '.' or '-'", version)
	}
	t, err := name.NewTag(Repository+":"+version, name.StrictValidation)
	if err != nil {
		return name.Tag{}, fmt.Errorf("image tag for version %q: %w", version, err)
	}
	return t, nil
}

// WriteArchive writes img tagged tag as a docker-archive tarball at p,
// atomically: a reader finds the old file or the whole new one.
func WriteArchive(p string, tag name.Tag, img v1.Image) (err error) {
	f, err := os.CreateTemp(filepath.Dir(p), "."+filepath.Base(p)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write image %s: %w", p, err)
	}
	defer func() {
		if err != nil {
			_ = f.Close() // discarded next
			if rerr := os.Remove(f.Name()); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
	}()
	if err = tarball.Write(tag, img, f); err != nil {
		return fmt.Errorf("write image %s: %w", p, err)
	}
	if err = f.Chmod(0o644); err != nil {
		return fmt.Errorf("write image %s: %w", p, err)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("write image %s: sync: %w", p, err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("write image %s: %w", p, err)
	}
	if err = os.Rename(f.Name(), p); err != nil {
		return fmt.Errorf("write image %s: %w", p, err)
	}
	return atomicfile.SyncDir(filepath.Dir(p))
}
