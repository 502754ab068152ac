// Command xdpqimage builds xdpq's container image without Docker: it
// compiles the image's commands static for an architecture and writes the
// image the Dockerfile describes as a docker-archive tarball, for
// `ctr -n k8s.io images import` or `docker load` (`make image`).
//
//	xdpqimage -arch arm64 -version v0.3.0 -o bin/xdpq-image-arm64.tar
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"time"

	"github.com/xdpq/xdpq/internal/tools/image"
)

func main() {
	arch := flag.String("arch", runtime.GOARCH, "the image's architecture (GOARCH): amd64 or arm64")
	version := flag.String("version", "dev", "the image's version: its tag and its org.opencontainers.image.version label")
	revision := flag.String("revision", "unknown", "the commit the image is built from (org.opencontainers.image.revision)")
	created := flag.String("created", "", "the image's creation time, RFC 3339 (default: the Unix epoch, for an image that depends only on its inputs)")
	out := flag.String("o", "", "the tarball to write (default bin/xdpq-image-ARCH.tar)")
	goTool := flag.String("go", "go", "the go command that compiles the binaries")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: xdpqimage [flags]   (run from the module's root)\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "xdpqimage: takes no arguments, got %q\n", flag.Args())
		os.Exit(2)
	}
	if *out == "" {
		*out = "bin/xdpq-image-" + *arch + ".tar"
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := build(ctx, *goTool, *arch, *version, *revision, *created, *out); err != nil {
		fmt.Fprintf(os.Stderr, "xdpqimage: %v\n", err)
		os.Exit(1)
	}
}

func build(ctx context.Context, goTool, arch, version, revision, created, out string) error {
	var at time.Time
	if created != "" {
		var err error
		if at, err = time.Parse(time.RFC3339, created); err != nil {
			return fmt.Errorf("-created: %w", err)
		}
	} else {
		at = time.Unix(0, 0).UTC()
	}
	tag, err := image.Tag(version)
	if err != nil {
		return err
	}
	spec := image.Xdpq(version, revision)
	dir, err := os.MkdirTemp("", "xdpqimage-")
	if err != nil {
		return err
	}
	defer func() {
		if err := os.RemoveAll(dir); err != nil {
			fmt.Fprintln(os.Stderr, "xdpqimage: left behind:", err)
		}
	}()
	files, err := image.Compile(ctx, goTool, ".", arch, dir, spec)
	if err != nil {
		return err
	}
	img, err := image.Build(spec, arch, files, at)
	if err != nil {
		return err
	}
	// bin/ is not in a fresh clone: make image made no image there.
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	if err := image.WriteArchive(out, tag, img); err != nil {
		return err
	}
	// The image id (its config's digest) is what `docker images` and
	// `ctr images ls` report of it.
	id, err := img.ConfigName()
	if err != nil {
		return err
	}
	fmt.Printf("%s: %s linux/%s, image id %s\n", out, tag, arch, id)
	return nil
}
